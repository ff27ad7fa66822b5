package outbox_test

import (
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// aggregateIn is a new aggregate id whose partition among partitions is p.
func aggregateIn(p, partitions int) uuid.UUID {
	for {
		if id := uuid.New(); outbox.PartitionOf(id.String(), partitions) == p {
			return id
		}
	}
}

// A NOTIFY names the partitions of its rows: a relay that does not hold
// a row's partition is not woken by it, the one that holds it is; the
// previous version's constant payload, and one the relay cannot read,
// wake it whatever it holds. The poll is an hour: only NOTIFYs wake it.
func TestANotifyWakesOnlyTheRelayHoldingItsRowsPartition(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	const partitions = 4
	// Another relay, present for the hour, holds partitions 0 and 1.
	if _, err := b.Pool.Exec(b.Ctx, `
		INSERT INTO outbox_relay (relay_id, seen_until) VALUES ('other', now() + interval '1 hour');
		INSERT INTO outbox_partition_lease (partition_no, relay_id, lease_until)
		SELECT p, CASE WHEN p < 2 THEN 'other' END, CASE WHEN p < 2 THEN now() + interval '1 hour' ELSE '-infinity' END
		FROM generate_series(0, 3) p`); err != nil {
		t.Fatal(err)
	}
	cfg := outboxtest.Config()
	cfg.Partitions = partitions
	cfg.PollInterval = time.Hour
	relay := b.StartRelay(cfg, b.AMQPURL, nil).Relay.(*outbox.Relay)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect and hold partitions 2 and 3", func() bool {
		return relay.Ready(b.Ctx) == nil && slices.Equal(relay.HeldPartitions(), []int32{2, 3})
	})
	time.Sleep(200 * time.Millisecond) // past the sweep that follows connecting

	write := func(aggregate uuid.UUID) uuid.UUID {
		t.Helper()
		ids, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{},
			outboxtest.Message{Type: outboxtest.TypeCancelled, ID: aggregate})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	notify := func(payload string) {
		t.Helper()
		if _, err := b.Pool.Exec(b.Ctx, `SELECT pg_notify('message_outbox', $1)`, payload); err != nil {
			t.Fatal(err)
		}
	}
	// A relay hears its NOTIFYs in the order they were sent: once it has
	// counted the last, it has counted the ones before.
	waitWoken := func(want int64) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, "the NOTIFY to wake the relay", func() bool {
			woken, _, _ := relay.Notifications()
			return woken >= want
		})
	}

	others := write(aggregateIn(0, partitions))
	mine := write(aggregateIn(3, partitions))
	if got := b.Receive("observer", 1, 10*time.Second, 0); got[0].MessageId != mine.String() {
		t.Fatalf("published %s, want %s (its partition is the relay's)", got[0].MessageId, mine)
	}
	waitWoken(1)
	if woken, ignored, deferred := relay.Notifications(); woken != 1 || ignored != 1 || deferred != 0 {
		t.Fatalf("notifications: %d woke the relay, %d ignored, %d deferred; want 1, 1 (partition 0's), 0", woken, ignored, deferred)
	}

	notify("") // the previous version's trigger
	waitWoken(2)
	notify("x:not a payload this version writes")
	waitWoken(3)
	notify("h:1,2,x")
	waitWoken(4)
	if _, ignored, _ := relay.Notifications(); ignored != 1 {
		t.Fatalf("%d notifications ignored, want 1: a payload that names no partition wakes every relay", ignored)
	}
	var status string
	if err := b.Pool.QueryRow(b.Ctx, "SELECT status FROM message_outbox WHERE outbox_id = $1", others).Scan(&status); err != nil || status != "PENDING" {
		t.Fatalf("the other relay's row: %s (%v), want PENDING", status, err)
	}
}

// A relay that does not share the outbox by partition is woken by every
// NOTIFY, whichever aggregates it names.
func TestANotifyWakesARelayWithoutPartitions(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	cfg := outboxtest.Config()
	cfg.PollInterval = time.Hour
	relay := b.StartRelay(cfg, b.AMQPURL, nil).Relay.(*outbox.Relay)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })
	time.Sleep(200 * time.Millisecond) // past the sweep that follows connecting

	ids := b.Enqueue(3, messaging.Cause{}) // three aggregates, one statement
	b.Receive("observer", len(ids), 10*time.Second, 0)
	if woken, ignored, deferred := relay.Notifications(); woken != 1 || ignored != 0 || deferred != 0 {
		t.Fatalf("notifications: %d woke the relay, %d ignored, %d deferred; want 1, 0, 0", woken, ignored, deferred)
	}
}

// The later messages of an aggregate wait behind the earlier one in
// flight; its mark wakes the relay, which claims them at once, not at the
// next poll (an hour here). Rows written with it, in one statement, and
// rows written while it is in flight: the NOTIFY of those does not wake
// the relay, for a claim would find them held.
func TestAMarkWakesTheRelayForTheRowsHeldBehind(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("observer", "#")
	cfg := outboxtest.Config()
	cfg.PollInterval = time.Hour
	release := make(chan struct{})
	var marks atomic.Int32
	relay := b.StartRelay(cfg, b.AMQPURL, outboxtest.BeforeMark(func([]pipeline.Claim) error {
		if marks.Add(1) == 2 { // the second batch waits for the test
			<-release
		}
		return nil
	})).Relay.(*outbox.Relay)
	testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })
	time.Sleep(200 * time.Millisecond) // past the sweep that follows connecting

	aggregate := uuid.New()
	msg := outboxtest.Message{Type: outboxtest.TypeCancelled, ID: aggregate}
	first, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, msg, msg, msg)
	if err != nil {
		t.Fatal(err)
	}
	// One at a time, each claimed once the one before is marked.
	got := b.Receive("observer", 2, 10*time.Second, 0)
	if got[0].MessageId != first[0].String() || got[1].MessageId != first[1].String() {
		t.Fatalf("received %v, want %v first", []string{got[0].MessageId, got[1].MessageId}, first[:2])
	}
	// The second is published, its mark waiting: write another.
	later, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, msg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the NOTIFY of the later row to be deferred", func() bool {
		_, _, deferred := relay.Notifications()
		return deferred == 1
	})
	close(release)
	got = b.Receive("observer", 2, 10*time.Second, 0)
	if got[0].MessageId != first[2].String() || got[1].MessageId != later[0].String() {
		t.Fatalf("received %v, want %s then %s", []string{got[0].MessageId, got[1].MessageId}, first[2], later[0])
	}
	if woken, ignored, deferred := relay.Notifications(); woken != 1 || ignored != 0 || deferred != 1 {
		t.Fatalf("notifications: %d woke the relay, %d ignored, %d deferred; want 1, 0, 1", woken, ignored, deferred)
	}
}

// The payload the trigger writes, read back; anything else names no
// aggregate.
func TestNotifyPayload(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]map[int32]int{
		"h:-68821088,1075015857*2": {-68821088: 1, 1075015857: 2},
		"h:2147483647,-2147483648": {2147483647: 1, -2147483648: 1},
		"":                         nil,
		"h:":                       nil,
		"h:1,,2":                   nil,
		"h:2147483648":             nil,
		"h:1*0":                    nil,
		"h:1*x":                    nil,
		"all":                      nil,
	} {
		got, ok := outbox.ParseNotifyPayload(payload)
		if ok != (want != nil) || !maps.Equal(got, want) {
			t.Errorf("%q: %v, %v; want %v", payload, got, ok, want)
		}
	}
}
