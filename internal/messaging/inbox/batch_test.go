package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/testenv"
)

// A backlog is applied in batches: fewer transactions than messages (each
// effect row records the transaction that wrote it), and each message
// applied exactly once, with its own inbox row.
func TestBatchesApplyEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 64, 16
	cfg.BatchWait = 50 * time.Millisecond // batches however slow the machine
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 64 { // waiting in the queue before the consumer starts
		msg := message()
		msgs = append(msgs, msg)
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)
	for _, msg := range msgs {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	var transactions int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(DISTINCT txid) FROM test_effect").Scan(&transactions); err != nil {
		t.Fatal(err)
	}
	if transactions >= len(msgs) {
		t.Fatalf("%d transactions for %d messages: no batching", transactions, len(msgs))
	}
	var followUps int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&followUps); err != nil || followUps != len(msgs) {
		t.Fatalf("%d follow-up messages (%v), want one per message", followUps, err)
	}
}

// A poison message inside a batch takes nobody down with it: the batch
// rolls back, each delivery is applied again on its own, the others are
// applied once, and the poison is parked with its reason.
func TestPoisonInsideABatch(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
	cfg.BatchWait = 50 * time.Millisecond
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 12 {
		msgs = append(msgs, message())
	}
	poison := msgs[5]
	b.handler.set(func(h *effectHandler) { h.permanent = map[string]bool{poison.MessageId: true} })
	for _, msg := range msgs {
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)
	for _, msg := range msgs {
		if msg.MessageId == poison.MessageId {
			continue
		}
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	parked := b.parked(1)
	if parked[0].MessageId != poison.MessageId || parked[0].Headers[inbox.HeaderParkedCode] != "test_permanent" {
		t.Fatalf("parked %s (%v), want the poison with its reason", parked[0].MessageId, parked[0].Headers[inbox.HeaderParkedCode])
	}
	if n := b.effects(poison.MessageId); n != 0 {
		t.Fatalf("the poison left %d effects", n)
	}
}

// A batch cut off after its commit and before its acks (the broker
// connection dies right then): every message of it comes back, each is
// recognised as a duplicate, and every effect exists once: with the
// consumers' pool straight to the database and through PgBouncer.
func TestBatchCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	directAndThroughPgBouncer(t, func(t *testing.T, b *consumerBundle) {
		cfg := testConsumerConfig()
		cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
		cfg.BatchWait = time.Second // the whole backlog in the first batch
		topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
		if err := topo.Declare(b.ch); err != nil {
			t.Fatal(err)
		}
		var msgs []amqp.Publishing
		for range 10 {
			msg := message()
			msgs = append(msgs, msg)
			b.publish(msg)
		}
		proxy := testenv.NewProxy(t, testenv.HostPort(b.amqpURL))
		var cut atomic.Bool
		b.start(cfg, proxy.Rewrite(b.amqpURL), inbox.AfterCommit(func(*inbox.Delivery) {
			if cut.CompareAndSwap(false, true) {
				proxy.Cut() // before the first ack of the committed batch
				go func() { time.Sleep(300 * time.Millisecond); proxy.Restore() }()
			}
		}))
		testenv.WaitFor(t, 30*time.Second, "the redeliveries to be recognised", func() bool {
			return b.counter("consumer.messages.duplicates") >= int64(len(msgs))-1 // the first ack may be out before the cut
		})
		for _, msg := range msgs {
			if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); b.effects(msg.MessageId) != 1 {
				t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
			}
		}
		var transactions int
		if err := b.pool.QueryRow(b.ctx, "SELECT count(DISTINCT txid) FROM test_effect").Scan(&transactions); err != nil || transactions != 1 {
			t.Fatalf("%d transactions for %d messages (%v): want the cut batch to be one", transactions, len(msgs), err)
		}
	})
}

// A batch inserts the inbox rows of all its deliveries in one statement;
// the deliveries whose row was there already go through the checks of a
// row seen before, at their turn in the batch: a second copy of a message
// in the same batch and a message processed before are duplicates, a
// message that failed before is applied as its next attempt, and a message
// another delivery holds between the steps of its side effect is busy
// (and applied once that delivery's lease has run out).
func TestBatchWithRowsSeenBefore(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
	cfg.BatchWait = time.Second // the whole backlog in the first batch
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	processed, failed, held, twice := message(), message(), message(), message()
	entry := func(msg amqp.Publishing) inbox.Entry {
		return inbox.Entry{Consumer: testConsumer, MessageID: msg.MessageId, Type: msg.Type, Version: 1, PayloadHash: "x"}
	}
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := inbox.Begin(b.ctx, tx, entry(processed), time.Second); err != nil {
			return err
		}
		if _, err := inbox.Begin(b.ctx, tx, entry(held), time.Second); err != nil {
			return err
		}
		return inbox.Hold(b.ctx, tx, testConsumer, held.MessageId) // a worker between its steps, within its lease
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, entry(failed), inbox.Failure{Status: inbox.StatusRetryableFailed, Code: "earlier"}); err != nil {
		t.Fatal(err)
	}
	var fresh []amqp.Publishing
	for range 4 {
		fresh = append(fresh, message())
	}
	for _, msg := range []amqp.Publishing{fresh[0], twice, processed, fresh[1], failed, twice, held, fresh[2], fresh[3]} {
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)

	for _, msg := range append(fresh, twice) {
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	if row := b.waitInbox(failed.MessageId, inbox.StatusProcessed); row.Attempts != 2 || b.effects(failed.MessageId) != 1 {
		t.Fatalf("the message that failed before: %+v, %d effects; want its second attempt applied", row, b.effects(failed.MessageId))
	}
	if n := b.effects(processed.MessageId); n != 0 {
		t.Fatalf("the message processed before was applied again (%d effects)", n)
	}
	if row := b.waitInbox(held.MessageId, inbox.StatusProcessed); row.Attempts != 2 || b.effects(held.MessageId) != 1 {
		t.Fatalf("the held message, after its lease: %+v, %d effects", row, b.effects(held.MessageId))
	}
	testenv.WaitFor(t, 10*time.Second, "the two duplicates to be acknowledged", func() bool {
		return b.counter("consumer.messages.duplicates") == 2 // the second copy, and the message processed before
	})
	var transactions int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(DISTINCT txid) FROM test_effect").Scan(&transactions); err != nil {
		t.Fatal(err)
	}
	if transactions > 2 { // the batch, and the held message's later delivery
		t.Fatalf("%d transactions: the batch was not applied as one", transactions)
	}
	var followUps int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox").Scan(&followUps); err != nil || followUps != len(fresh)+3 {
		t.Fatalf("%d follow-up messages (%v), want one per applied message (%d)", followUps, err, len(fresh)+3)
	}
}

// The follow-up messages of a batch are written in one statement just
// before its commit. When that statement fails, the whole batch rolls back
// (no effect commits without its follow-ups), each delivery is applied
// again on its own, and only the one whose follow-up cannot be written
// fails: the others are applied once, each with its follow-up.
func TestBatchFollowUpWriteFails(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 32, 16
	cfg.BatchWait = time.Second
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	var msgs []amqp.Publishing
	for range 10 {
		msgs = append(msgs, message())
	}
	bad := msgs[4]
	var badOrder struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(bad.Body, &badOrder); err != nil {
		t.Fatal(err)
	}
	// The database refuses the follow-up of one message (a constraint of
	// its own, as a full disk or a broken migration would refuse all).
	_, err := b.pool.Exec(b.ctx, strings.ReplaceAll(`
		CREATE FUNCTION test_refuse_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.aggregate_id = 'BAD_ORDER' THEN
				RAISE EXCEPTION 'follow-up of order % refused', NEW.aggregate_id USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_refuse_outbox BEFORE INSERT ON message_outbox FOR EACH ROW EXECUTE FUNCTION test_refuse_outbox();`,
		"BAD_ORDER", badOrder.ID)) // a uuid: nothing to quote
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range msgs {
		b.publish(msg)
	}
	b.start(cfg, b.amqpURL, nil)
	for _, msg := range msgs {
		if msg.MessageId == bad.MessageId {
			continue
		}
		if row := b.waitInbox(msg.MessageId, inbox.StatusProcessed); row.Attempts != 1 || b.effects(msg.MessageId) != 1 {
			t.Fatalf("message %s: %+v, %d effects", msg.MessageId, row, b.effects(msg.MessageId))
		}
	}
	parked := b.parked(1) // a retryable failure, until its attempts are spent
	if parked[0].MessageId != bad.MessageId {
		t.Fatalf("parked %s, want %s", parked[0].MessageId, bad.MessageId)
	}
	if n := b.effects(bad.MessageId); n != 0 {
		t.Fatalf("the message whose follow-up was refused left %d effects: an effect committed without its follow-up", n)
	}
	var followUps, badFollowUps int
	err = b.pool.QueryRow(b.ctx, "SELECT count(*), count(*) FILTER (WHERE aggregate_id = $1) FROM message_outbox", badOrder.ID).Scan(&followUps, &badFollowUps)
	if err != nil || followUps != len(msgs)-1 || badFollowUps != 0 {
		t.Fatalf("%d follow-up messages, %d of the refused one (%v); want one per applied message", followUps, badFollowUps, err)
	}
}

// The processing lease counts from the hold, not from the commit: in a
// batch, a delivery's row is held PROCESSING, then the later deliveries
// run in the same transaction. An external call after such a commit gets
// only what is left of 9/10 of the lease, so that it never runs past the
// lease, when another delivery may take the message over.
func TestBatchExternalCallEndsWithinTheLease(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	cfg := testConsumerConfig()
	cfg.Workers, cfg.Prefetch, cfg.BatchSize = 1, 8, 8
	cfg.BatchWait = 50 * time.Millisecond
	cfg.ProcessingLease = 3 * time.Second
	slow := 1500 * time.Millisecond // the second delivery's handler, after the first's hold
	topo := inbox.Topology{Consumer: testConsumer, Exchange: testExchange, Types: []string{message().Type}, RetryDelays: cfg.RetryDelays, DeliveryLimit: cfg.DeliveryLimit}
	if err := topo.Declare(b.ch); err != nil {
		t.Fatal(err)
	}
	first, second := message(), message()
	var (
		heldAt   atomic.Int64 // unix nanoseconds: when the first's handler returned its call
		timeLeft atomic.Int64 // what the call's context had left when it started
		txids    sync.Map     // message id -> the transaction of its first step
	)
	c := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		var txid int64
		if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&txid); err != nil {
			return inbox.Outcome{}, err
		}
		txids.Store(d.MessageID, txid)
		if d.MessageID == second.MessageId {
			time.Sleep(slow)
			return inbox.Applied(), nil
		}
		heldAt.Store(time.Now().UnixNano())
		return inbox.Outcome{External: &inbox.External{
			Call: func(ctx context.Context) error {
				deadline, ok := ctx.Deadline()
				if !ok {
					return errors.New("the call has no deadline")
				}
				timeLeft.Store(int64(time.Until(deadline)))
				return nil
			},
			Record: func(ctx context.Context, tx pgx.Tx, _ error) error {
				_, err := tx.Exec(ctx, "INSERT INTO test_effect (message_id) VALUES ($1)", d.MessageID)
				return err
			},
		}}, nil
	})
	b.publish(first)
	b.publish(second)
	b.start(cfg, b.amqpURL, nil, c)
	b.waitInbox(first.MessageId, inbox.StatusProcessed)
	b.waitInbox(second.MessageId, inbox.StatusProcessed)
	t1, _ := txids.Load(first.MessageId)
	t2, _ := txids.Load(second.MessageId)
	if t1 != t2 {
		t.Fatalf("the two deliveries ran in transactions %v and %v: no batch, nothing to check", t1, t2)
	}
	// The call started at least `slow` after the hold; from the hold, the
	// call may run until 9/10 of the lease.
	if left, most := time.Duration(timeLeft.Load()), cfg.ProcessingLease*9/10-slow; left > most {
		t.Fatalf("the external call had %s left, more than the %s that remain of 9/10 of the %s lease %s after its hold",
			left, most, cfg.ProcessingLease, slow)
	}
	if heldAt.Load() == 0 || b.effects(first.MessageId) != 1 {
		t.Fatalf("the call was not made and recorded once (effects %d)", b.effects(first.MessageId))
	}
}
