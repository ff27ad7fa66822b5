package inbox_test

import (
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// thisMonday is the start of this week's time partition: Monday 00:00 UTC.
func thisMonday() time.Time {
	day := time.Now().UTC().Truncate(24 * time.Hour)
	return day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
}

// No unique index holds (consumer_name, message_id) alone in a table
// partitioned by time; the consumers keep it unique. A duplicate is found
// in whichever time partition its original is: one that arrives after the
// original's partition ended, and one that arrives after retention
// dropped older partitions, within the window, are acknowledged as
// duplicates, and nothing is applied twice.
func TestDuplicateAcrossTimePartitionsAndRetentionIsAcknowledged(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	monday := thisMonday()
	week := 7 * 24 * time.Hour
	if err := inboxtest.TimePartitionsFrom(b.ctx, b.pool, monday.Add(-4*week)); err != nil {
		t.Fatal(err)
	}
	b.start(testConsumerConfig(), b.amqpURL, nil)
	old := message() // processed four weeks ago: its partition is past a two-week retention
	msg := message()
	b.publish(old)
	b.publish(msg)
	b.waitInbox(old.MessageId, inbox.StatusProcessed)
	b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	// The original was first received last week: its row moves to last
	// week's partition, which has ended.
	for id, at := range map[string]time.Time{old.MessageId: monday.Add(-4*week + time.Hour), msg.MessageId: monday.Add(-time.Hour)} {
		if _, err := b.pool.Exec(b.ctx, "UPDATE message_inbox SET first_received_at = $2, processed_at = $2 WHERE message_id = $1", id, at); err != nil {
			t.Fatal(err)
		}
	}
	var partition string
	if err := b.pool.QueryRow(b.ctx, "SELECT tableoid::regclass::text FROM message_inbox WHERE message_id = $1", msg.MessageId).Scan(&partition); err != nil ||
		partition != "message_inbox_p"+monday.Add(-week).Format("20060102") {
		t.Fatalf("the original's row is in %s (%v), want last week's partition", partition, err)
	}

	b.publish(msg) // after the original's partition ended
	testenv.WaitFor(t, 10*time.Second, "the duplicate to be counted", func() bool { return b.counter("consumer.messages.duplicates") == 1 })

	parts, err := inboxadmin.DropTimePartitions(b.ctx, b.pool, 2*week)
	if err != nil {
		t.Fatal(err)
	}
	dropped := map[string]bool{}
	for _, p := range parts {
		if p.Dropped {
			dropped[p.Name] = true
		}
	}
	if !dropped["message_inbox_p"+monday.Add(-4*week).Format("20060102")] || dropped[partition] {
		t.Fatalf("retention dropped %v: want the partition of four weeks ago, not %s", dropped, partition)
	}
	b.publish(msg) // after retention dropped older partitions, within the window
	testenv.WaitFor(t, 10*time.Second, "the second duplicate to be counted", func() bool { return b.counter("consumer.messages.duplicates") == 2 })
	if n := b.effects(msg.MessageId); n != 1 {
		t.Fatalf("%d effects of a message delivered three times, want 1", n)
	}
	var rows int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_inbox WHERE message_id = $1", msg.MessageId).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d inbox rows of the message (%v), want 1", rows, err)
	}
}

// A retention shorter than the replay window would forget a message that
// may still come again, which would then be applied twice: refused.
func TestInboxRetentionShorterThanTheReplayWindowIsRefused(t *testing.T) {
	t.Parallel()
	cfg := testConsumerConfig()
	cfg.InboxRetention, cfg.ReplayWindow = 24*time.Hour, 48*time.Hour
	_, err := inbox.NewConsumers(cfg, messaging.Deps{Logger: testenv.Logger()}, testerConsumer((&effectHandler{}).Handle))
	if err == nil || !strings.Contains(err.Error(), "shorter than the replay window") {
		t.Fatalf("NewConsumers with a retention shorter than the replay window: %v", err)
	}
	cfg.InboxRetention, cfg.BatchSize, cfg.TimePartition = 0, 1, "week" // forever; Validate sees no defaults
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a retention of forever: %v", err)
	}
}

// Retention drops a time partition whole once it ended retention ago and
// every row of it was PROCESSED retention ago; one holding a failure, or
// a row processed within retention, waits, and says how many rows it
// waits for.
func TestDropTimePartitionsWaitsForUnprocessedRows(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	monday := thisMonday()
	week := 7 * 24 * time.Hour
	if err := inboxtest.TimePartitionsFrom(b.ctx, b.pool, monday.Add(-4*week)); err != nil {
		t.Fatal(err)
	}
	longAgo := monday.Add(-5 * week)
	write := func(id string, weeksAgo int, status string, processedAt any) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, payload_hash,
			first_received_at, processed_at) VALUES ('c', $1, 't', 1, $2, 'h', $3, $4)`,
			id, status, monday.Add(-time.Duration(weeksAgo)*week+time.Hour), processedAt); err != nil {
			t.Fatal(err)
		}
	}
	write("m-1", 4, "PROCESSED", longAgo)
	write("m-2", 3, "PROCESSED", longAgo)
	write("m-3", 3, "POISONED", nil)
	write("m-4", 2, "PROCESSED", time.Now())
	write("m-5", 1, "PROCESSED", longAgo)
	name := func(weeksAgo int) string {
		return "message_inbox_p" + monday.Add(-time.Duration(weeksAgo)*week).Format("20060102")
	}
	parts, err := inboxadmin.DropTimePartitions(b.ctx, b.pool, week)
	if err != nil {
		t.Fatal(err)
	}
	dropped, held := map[string]int64{}, map[string]int64{}
	for _, p := range parts {
		switch {
		case p.Dropped:
			dropped[p.Name] = 0
		case p.PastRetention:
			held[p.Name] = p.HeldRows
		}
	}
	if want := map[string]int64{"message_inbox_initial": 0, name(4): 0}; !maps.Equal(dropped, want) {
		t.Errorf("dropped %v, want %v", dropped, want)
	}
	if want := map[string]int64{name(3): 1, name(2): 1}; !maps.Equal(held, want) {
		t.Errorf("waiting %v, want %v", held, want)
	}
	var left int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_inbox").Scan(&left); err != nil || left != 4 {
		t.Fatalf("%d rows left (%v), want 4", left, err)
	}
}

// A running system is converted while a consumer applies messages and
// duplicates keep coming: the rows it had stay as they were, in every
// state, in the initial partition; every message is applied once, and
// every duplicate, of a message applied before or after the migration,
// is acknowledged as one.
func TestMigratingToTimePartitionsWhileConsuming(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	m, err := database.NewMigrator(b.pool, slog.New(slog.NewTextHandler(io.Discard, nil)), inbox.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if err := m.DownTo(b.ctx, 2); err != nil {
		t.Fatal(err)
	}
	// A row in every state, of another consumer, received long ago.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO message_inbox (consumer_name, message_id, message_type, message_version, status, outcome, attempt_count, payload_hash,
		    processed_at, last_error_code, first_received_at)
		SELECT 'other', 'm-' || s, 't', 1, s, CASE s WHEN 'PROCESSED' THEN 'APPLIED' END, 1, 'h',
		       CASE s WHEN 'PROCESSED' THEN now() - interval '29 days' END, CASE WHEN s LIKE '%FAILED' OR s = 'POISONED' THEN 'e' END,
		       now() - interval '30 days'
		FROM unnest(ARRAY['PROCESSING', 'PROCESSED', 'RETRYABLE_FAILED', 'PERMANENT_FAILED', 'POISONED']) AS s`); err != nil {
		t.Fatal(err)
	}
	const settled = "SELECT string_agg(i::text, E'\\n' ORDER BY message_id) FROM message_inbox i WHERE consumer_name = 'other'"
	var before string
	if err := b.pool.QueryRow(b.ctx, settled).Scan(&before); err != nil {
		t.Fatal(err)
	}
	b.start(testConsumerConfig(), b.amqpURL, nil)
	var sent []amqp.Publishing
	for range 10 {
		msg := message()
		b.publish(msg)
		sent = append(sent, msg)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 30 {
			msg := message()
			b.publish(msg)
			sent = append(sent, msg)
			b.publish(sent[i]) // a duplicate
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if err := m.Up(b.ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	for _, msg := range sent[:10] {
		b.publish(msg) // duplicates after
	}
	for _, msg := range sent {
		b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	}
	testenv.WaitFor(t, 15*time.Second, "40 duplicates counted", func() bool { return b.counter("consumer.messages.duplicates") == 40 })
	for _, msg := range sent {
		if n := b.effects(msg.MessageId); n != 1 {
			t.Fatalf("message %s applied %d times", msg.MessageId, n)
		}
	}
	var after string
	if err := b.pool.QueryRow(b.ctx, settled).Scan(&after); err != nil || after != before {
		t.Fatalf("the rows of the table before:\n%s\nafter:\n%s (%v)", before, after, err)
	}
	var partitioned bool
	var key string
	var initial int
	if err := b.pool.QueryRow(b.ctx, `SELECT
		    (SELECT relkind = 'p' FROM pg_class WHERE oid = 'message_inbox'::regclass),
		    (SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'message_inbox'::regclass AND contype = 'p'),
		    (SELECT count(*) FROM message_inbox_initial WHERE consumer_name = 'other')`).Scan(&partitioned, &key, &initial); err != nil {
		t.Fatal(err)
	}
	if !partitioned || key != "PRIMARY KEY (consumer_name, message_id, first_received_at)" || initial != 5 {
		t.Fatalf("after: partitioned %v, key %q, %d rows of the table in the initial partition", partitioned, key, initial)
	}
}
