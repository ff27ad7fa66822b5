package outbox_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

// One Write is one statement, however many messages: every row gets its
// own id, and the cause travels in the headers.
func TestWriteOneStatementManyRows(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	id := uuid.New()
	ids, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{CorrelationID: "c", MessageID: "m-1"},
		outboxtest.Message{Type: outboxtest.TypeFulfilled, ID: id}, outboxtest.Message{Type: outboxtest.TypeRejected, ID: id})
	if err != nil || len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("Write = %v, %v", ids, err)
	}
	var causation, correlation, producer string
	err = b.Pool.QueryRow(b.Ctx, `SELECT headers->>'causation_id', headers->>'correlation_id', headers->>'app_id'
		FROM message_outbox WHERE outbox_id = $1`, ids[1]).Scan(&causation, &correlation, &producer)
	if err != nil || causation != "m-1" || correlation != "c" || producer != "test-producer" {
		t.Fatalf("headers causation_id %q, correlation_id %q, app_id %q (%v)", causation, correlation, producer, err)
	}
	if ids, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{}); err != nil || ids != nil {
		t.Fatalf("Write of no messages = %v, %v; want nothing written", ids, err)
	}
}
