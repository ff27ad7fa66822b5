package outbox_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
)

// A relay draining a backlog claims on from the last row of its previous
// full claim (its floor), not from the start. A row that commits late,
// stamped before the floor, is still published (a claim from the start,
// at the next poll tick or when the drain ends), and a later message of
// its aggregate, committed after it but stamped after the floor, waits
// for it: the earlier-row check sees it whatever the floor.
func TestALateRowBeforeTheFloorIsPublishedFirst(t *testing.T) {
	t.Parallel()
	b := setupRelay(t)
	b.BindQueue("backlog", outboxtest.TypeCancelled)
	b.BindQueue("progress", outboxtest.TypeCancelled) // read to see the drain under way; backlog keeps every message
	b.BindQueue("aggregate", outboxtest.TypeSubmitted)
	aggregate := uuid.New()

	late, err := b.Pool.Begin(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(b.Ctx) }()
	first, err := outboxtest.Writer.Write(b.Ctx, late, messaging.Cause{}, outboxtest.Message{Type: outboxtest.TypeSubmitted, ID: aggregate})
	if err != nil {
		t.Fatal(err)
	}
	const backlog = 3000
	b.Enqueue(backlog, messaging.Cause{}) // stamped after first

	cfg := outboxtest.Config() // claims of 100: 30 full ones
	cfg.PollInterval = time.Second
	b.StartRelay(cfg, b.AMQPURL, nil)
	b.Receive("progress", 300, 15*time.Second, 0) // the drain is under way, its floor past first
	if err := late.Commit(b.Ctx); err != nil {
		t.Fatal(err)
	}
	second, err := outboxtest.Writer.Write(b.Ctx, b.Pool, messaging.Cause{}, outboxtest.Message{Type: outboxtest.TypeSubmitted, ID: aggregate})
	if err != nil {
		t.Fatal(err)
	}

	got := b.Receive("aggregate", 2, 15*time.Second, 200*time.Millisecond)
	order := make([]string, len(got))
	for i, d := range got {
		order[i] = d.MessageId
	}
	if want := []string{first[0].String(), second[0].String()}; !slices.Equal(order, want) {
		t.Fatalf("published %v, want %v: the late row, then the later one of its aggregate", order, want)
	}
	b.Receive("backlog", backlog, 60*time.Second, 0)
}
