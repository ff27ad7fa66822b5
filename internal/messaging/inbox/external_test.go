package inbox_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// The two-step side effect under failure: what a call's error is, what its
// follow-ups become, and whose attempt a late failure may record.

// An external call that fails with a network error, on a delivery handled
// alone, is the handler's failure, not the database's: it is recorded,
// retried with growing delays and parked when its attempts run out. The
// consumer never holds the delivery for the database, and stays ready.
func TestExternalCallNetworkErrorIsNotTheDatabases(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	var calls atomic.Int64
	c := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		return inbox.Outcome{External: &inbox.External{
			Call: func(ctx context.Context) error {
				calls.Add(1)
				conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:1") // nothing listens there
				if err == nil {
					_ = conn.Close()
					return errors.New("port 1 answered")
				}
				return err
			},
			Record: func(context.Context, pgx.Tx, error) error { return nil },
		}}, nil
	})
	cfg := testConsumerConfig()
	cfg.BatchSize = 1
	rc := b.start(cfg, b.amqpURL, nil, c)
	msg := message()
	b.publish(msg)
	row := b.waitInbox(msg.MessageId, inbox.StatusPoisoned)
	if row.LastErrorCode != "handler_error" || calls.Load() != int64(cfg.MaxAttempts) {
		t.Fatalf("inbox %+v after %d calls; want the handler's failure, %d calls", row, calls.Load(), cfg.MaxAttempts)
	}
	if held := b.counter("consumer.messages.held"); held != 0 {
		t.Fatalf("consumer.messages.held = %d: a call's network error held the delivery as if the database were away", held)
	}
	if err := rc.Ready(b.ctx); err != nil {
		t.Fatalf("not ready after a call failed: %v", err)
	}
}

// A handler whose outcome has both an external call and follow-up
// messages writes the follow-ups once, with the second step's commit after
// the call succeeded: not again on every retry of the call (under new ids
// that no downstream inbox could tell apart).
func TestFollowUpsOfAnExternalCallAreWrittenOnce(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	var calls atomic.Int64
	c := testerConsumer(func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery) (inbox.Outcome, error) {
		return inbox.Outcome{
			Publish: []messaging.Message{fulfilledV1{ID: d.Message.(cancelledV1).ID}},
			External: &inbox.External{
				Call: func(context.Context) error {
					if calls.Add(1) < 3 {
						return inbox.Retryable("test_transient", errors.New("the downstream is down"))
					}
					return nil
				},
				Record: func(context.Context, pgx.Tx, error) error { return nil },
			},
		}, nil
	})
	cfg := testConsumerConfig()
	cfg.MaxAttempts = 5
	b.start(cfg, b.amqpURL, nil, c)
	msg := message()
	b.publish(msg)
	b.waitInbox(msg.MessageId, inbox.StatusProcessed)
	var rows int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM message_outbox WHERE headers->>'causation_id' = $1", msg.MessageId).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 || rows != 1 {
		t.Fatalf("%d calls wrote %d follow-up rows; want 3 calls, 1 row", calls.Load(), rows)
	}
}

// A failure recorded late must not overwrite another delivery's takeover.
// Attempt 1 held the message PROCESSING for its external call; its lease
// ran out and attempt 2 took the message over, its own call in flight.
// Attempt 1's failure, recorded only now, must leave attempt 2's row
// alone (ErrTakenOver): otherwise attempt 2's fence finds nothing, its
// successful call is recorded nowhere, and attempt 1's failure parks a
// message that was handled. A failure of the holding attempt itself, or of
// an attempt that committed nothing while the hold is stale, is recorded.
func TestLateFailureRecordLeavesATakeoverAlone(t *testing.T) {
	t.Parallel()
	b := setupConsumer(t)
	const lease = time.Minute
	entry := inbox.Entry{Consumer: testConsumer, MessageID: uuid.NewString(), Type: typeCancelled, Version: 1, PayloadHash: "h"}
	hold := func() int { // one delivery's first step: the row committed PROCESSING
		t.Helper()
		var attempt int
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			d, err := inbox.Begin(b.ctx, tx, entry, time.Nanosecond) // any earlier hold counts as stale
			attempt = d.Attempt
			if err != nil {
				return err
			}
			return inbox.Hold(b.ctx, tx, entry.Consumer, entry.MessageID)
		})
		if err != nil {
			t.Fatal(err)
		}
		return attempt
	}
	first := hold()
	second := hold() // the takeover, after the first one's lease
	if first != 1 || second != 2 {
		t.Fatalf("attempts %d and %d", first, second)
	}
	late := inbox.Failure{Status: inbox.StatusPermanentFailed, Code: "webhook_rejected", Message: "late", HeldAttempt: first, Lease: lease}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, entry, late); !errors.Is(err, inbox.ErrTakenOver) {
		t.Fatalf("the late failure of attempt %d: %v, want ErrTakenOver", first, err)
	}
	if row := b.inboxRow(entry.MessageID); row.Status != inbox.StatusProcessing || row.Attempts != second || row.LastErrorCode != "" {
		t.Fatalf("after the late failure: %+v, want attempt %d's hold untouched", row, second)
	}
	// Nor may a delivery that committed nothing overwrite a live hold.
	rolledBack := inbox.Failure{Status: inbox.StatusRetryableFailed, Code: "lock_timeout", Lease: lease}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, entry, rolledBack); !errors.Is(err, inbox.ErrTakenOver) {
		t.Fatalf("a rolled-back attempt's failure: %v, want ErrTakenOver", err)
	}
	// The holder's own failure is recorded.
	own := inbox.Failure{Status: inbox.StatusRetryableFailed, Code: "webhook_unavailable", Message: "503", HeldAttempt: second, Lease: lease}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, entry, own); err != nil {
		t.Fatal(err)
	}
	if row := b.inboxRow(entry.MessageID); row.Status != inbox.StatusRetryableFailed || row.LastErrorCode != "webhook_unavailable" {
		t.Fatalf("after the holder's failure: %+v", row)
	}
	// A stale hold (its worker died) does not block the record of the
	// delivery that found it.
	third := hold()
	stale := inbox.Failure{Status: inbox.StatusRetryableFailed, Code: "lock_timeout", Lease: time.Nanosecond}
	if _, err := inbox.RecordFailure(b.ctx, b.pool, entry, stale); err != nil {
		t.Fatalf("a failure over the stale hold of attempt %d: %v", third, err)
	}
}
