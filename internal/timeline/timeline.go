package timeline

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
	"github.com/yourorg/orders/internal/store"
)

// Timeline is everything the database holds about one order.
type Timeline struct {
	Order         *domain.Order
	History       []store.HistoryEntry  // oldest first
	Outbox        []outboxadmin.Message // oldest first
	Inbox         []inboxadmin.Row      // by first delivery
	Notifications []Notification        // oldest first
}

// Notification is one customer notification of the order
// (customer_notification) and its webhook delivery.
type Notification struct {
	ID        uuid.UUID // the Idempotency-Key of its webhook calls
	Kind      string
	Status    string // PENDING, SENT, SKIPPED or FAILED
	MessageID string // the message that asked for it
	Attempts  int
	LastError string
	CreatedAt time.Time
	SentAt    *time.Time
}

// Read reads the timeline of order id; a missing order is
// domain.ErrNotFound. Run it in one read-only transaction (see the package
// comment), so that the tables agree.
func Read(ctx context.Context, db database.DBTX, id uuid.UUID) (*Timeline, error) {
	order, err := store.GetOrder(ctx, db, id)
	if err != nil {
		return nil, err
	}
	history, err := store.History(ctx, db, id)
	if err != nil {
		return nil, err
	}
	tl := &Timeline{Order: order, History: history}
	// Only the time partitions from the order's creation on.
	since := MessagesSince(order.CreatedAt())
	if tl.Outbox, err = outboxadmin.AggregateSince(ctx, db, domain.AggregateOrder, id.String(), since); err != nil {
		return nil, err
	}
	if tl.Inbox, err = inboxadmin.AggregateSince(ctx, db, id.String(), since); err != nil {
		return nil, err
	}
	if tl.Notifications, err = notifications(ctx, db, id); err != nil {
		return nil, err
	}
	return tl, nil
}

// MessagesSince is the earliest an order created at createdAt can have
// an outbox or inbox row: the reads of its messages start there, so that
// PostgreSQL skips the time partitions before it. None is earlier than the
// order: its first outbox row is written in the order's transaction (the
// same now()), the others and every inbox row in transactions that began
// after it committed. An hour's slack covers the database server's clock
// stepping back; it costs a partition more at most, for an order made
// within it of a partition's start.
func MessagesSince(createdAt time.Time) time.Time { return createdAt.Add(-time.Hour) }

func notifications(ctx context.Context, db database.DBTX, id uuid.UUID) ([]Notification, error) {
	rows, err := db.Query(ctx, `
		SELECT notification_id, kind, status, message_id, attempt_count, coalesce(last_error, ''), created_at, sent_at
		FROM customer_notification WHERE order_id = $1
		ORDER BY created_at, notification_id`, id)
	if err != nil {
		return nil, fmt.Errorf("notifications of order %s: %w", id, store.Translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Notification, error) {
		var n Notification
		err := row.Scan(&n.ID, &n.Kind, &n.Status, &n.MessageID, &n.Attempts, &n.LastError, &n.CreatedAt, &n.SentAt)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("notifications of order %s: %w", id, store.Translate(err))
	}
	return out, nil
}

// TraceID is the trace of the order: the one of its first outbox row (the
// request that created it), or, once retention has deleted the outbox rows,
// the one its first consumer recorded. "" when tracing recorded none.
func (t *Timeline) TraceID() string {
	for _, r := range t.Outbox {
		if r.TraceID != "" {
			return r.TraceID
		}
	}
	for _, r := range t.Inbox {
		if r.TraceID != "" {
			return r.TraceID
		}
	}
	return ""
}

// Actor names who did a hop; a consumer's hops carry its name.
const (
	ActorAPI     = "order-api"
	ActorRelay   = "outbox-relay"
	ActorWebhook = "webhook"
	// ActorConsumer is the actor of a transition made on a message whose
	// inbox rows retention has deleted: no consumer's name is left.
	ActorConsumer = "a consumer"
)

// Kind tells the hops apart.
type Kind string

// The kinds of hop.
const (
	KindTransition   Kind = "transition"   // the order changed status (order_state_transition)
	KindPublish      Kind = "publish"      // an outbox row, and what the relay did with it
	KindDelivery     Kind = "delivery"     // a consumer's inbox row of a message
	KindNotification Kind = "notification" // a customer notification and its webhook calls
)

// Health says whether a hop went as it should.
type Health string

// The health of a hop.
const (
	HealthOK      Health = "ok"      // done
	HealthPending Health = "pending" // not done yet, or being retried
	HealthFailed  Health = "failed"  // given up: needs an operator
)

// Hop is one step of the order's flow.
type Hop struct {
	At      time.Time
	Actor   string // order-api, outbox-relay, a consumer's name (transitionActor), webhook
	Kind    Kind
	Summary string   // one line: what happened
	Details []Detail // the facts behind it, in a fixed order
	Health  Health
	// Status is the status a transition moved the order to; "" for the
	// other kinds.
	Status domain.Status
	// Retried says, on a hop that went through after failing first, that
	// it did ("refused once, delivered on retry"): its last error is the
	// past, not a problem. "" otherwise.
	Retried string
	// Waiting: the hop has not happened yet (an outbox row not published
	// yet). At is when it was asked for; Hops lists it after the hops that
	// happened.
	Waiting bool
}

// Detail is one labelled fact of a hop.
type Detail struct {
	Label, Value string
}

// Hops returns every hop of the order in time order: the transitions, one
// hop per outbox row (its publish, or why it is not published yet), one per
// inbox row, one per notification. Hops at the same instant keep that
// order; the waiting hops come last.
//
// A row's timestamp is the start of the transaction that wrote it (now()),
// except a transition's (clock_timestamp()): in time order, a consumer's
// inbox row comes before the transition it made, as it happened. An outbox
// row not published yet would come before the transition of its own
// transaction: it is listed with the waiting hops instead. A published
// row's hop comes before every delivery of its message (see publishHop).
func (t *Timeline) Hops() []Hop {
	types := map[string]string{} // message id -> type
	for _, r := range t.Outbox {
		types[r.ID.String()] = r.Type
	}
	applied := map[string][]inboxadmin.Row{} // message id -> the consumers' rows that applied it
	delivered := map[string]time.Time{}      // message id -> its first delivery to any consumer
	for _, r := range t.Inbox {
		if r.Outcome == "APPLIED" {
			applied[r.MessageID] = append(applied[r.MessageID], r)
		}
		if first, ok := delivered[r.MessageID]; !ok || r.FirstReceivedAt.Before(first) {
			delivered[r.MessageID] = r.FirstReceivedAt
		}
	}
	var hops []Hop
	for _, h := range t.History {
		hops = append(hops, transitionHop(h, types, applied))
	}
	for _, r := range t.Outbox {
		hops = append(hops, publishHop(r, delivered))
	}
	for _, r := range t.Inbox {
		hops = append(hops, deliveryHop(r))
	}
	for _, n := range t.Notifications {
		hops = append(hops, notificationHop(n))
	}
	slices.SortStableFunc(hops, func(a, b Hop) int {
		if a.Waiting != b.Waiting {
			if a.Waiting {
				return 1
			}
			return -1
		}
		return a.At.Compare(b.At)
	})
	return hops
}

// transitionHop is a change of status. One caused by a message is a
// consumer's hop, named as its delivery is (transitionActor).
func transitionHop(h store.HistoryEntry, types map[string]string, applied map[string][]inboxadmin.Row) Hop {
	hop := Hop{At: h.CreatedAt, Kind: KindTransition, Health: HealthOK, Status: h.To}
	switch {
	case h.MessageID == nil && h.From == "":
		hop.Actor, hop.Summary = ActorAPI, fmt.Sprintf("order created: %s", h.To)
	case h.MessageID == nil:
		hop.Actor, hop.Summary = ActorAPI, fmt.Sprintf("%s → %s (HTTP request)", h.From, h.To)
	default:
		hop.Actor = transitionActor(h, applied[*h.MessageID])
		hop.Summary = fmt.Sprintf("%s → %s on %s", h.From, h.To, cmp.Or(types[*h.MessageID], "a message"))
		hop.Details = append(hop.Details, Detail{"message id", *h.MessageID})
	}
	if h.Reason != "" { // why: a rejection's skus
		hop.Summary += ": " + h.Reason
		hop.Details = append([]Detail{{"reason", h.Reason}}, hop.Details...)
	}
	if h.CorrelationID != "" {
		hop.Details = append(hop.Details, Detail{"correlation id", h.CorrelationID})
	}
	return hop
}

// transitionActor names the consumer whose transaction made a transition
// on a message, of those whose rows applied it. The history does not
// record the consumer, but its transaction had started by the time of the
// transition (a transition's time is the clock's, taken in the
// transaction; an inbox row's processed_at is the start of the transaction
// that applied it): a consumer that applied the message later, such as the
// notifier after its webhook call, did not make it. When more than one
// remains, each may have, and all are named ("fulfillment or
// notification"); when no row is left (inbox retention), ActorConsumer.
func transitionActor(h store.HistoryEntry, applied []inboxadmin.Row) string {
	var before, all []string
	for _, r := range applied {
		all = append(all, r.Consumer)
		if r.ProcessedAt != nil && !r.ProcessedAt.After(h.CreatedAt) {
			before = append(before, r.Consumer)
		}
	}
	switch {
	case len(before) > 0:
		return strings.Join(before, " or ")
	case len(all) > 0:
		return strings.Join(all, " or ")
	}
	return ActorConsumer
}

// publishHop is an outbox row and its publish. published_at is when the
// relay marked the row, after the broker's confirm: a consumer may have
// received the message before that. The hop is placed at the earlier of
// the two, the first moment the message is known to have been out.
func publishHop(r outboxadmin.Message, delivered map[string]time.Time) Hop {
	hop := Hop{Actor: ActorRelay, Kind: KindPublish}
	switch r.Status {
	case "PUBLISHED":
		hop.Summary, hop.Health = "published "+r.Type, HealthOK
		if r.PublishedAt != nil {
			hop.At = *r.PublishedAt
		}
		if first, ok := delivered[r.ID.String()]; ok && (hop.At.IsZero() || first.Before(hop.At)) {
			hop.At = first
		}
	case "FAILED":
		hop.Summary, hop.Health, hop.At = r.Type+": FAILED, the relay gave up", HealthFailed, r.UpdatedAt
	default: // PENDING, PUBLISHING
		hop.Summary, hop.Health, hop.At, hop.Waiting = r.Type+" not published yet: "+r.Status, HealthPending, r.CreatedAt, true
	}
	hop.Details = []Detail{
		{"message id", r.ID.String()},
		{"written by", cmp.Or(r.Producer, "?")},
		{"written at", stamp(r.CreatedAt)},
		{"status", r.Status},
		{"attempts", fmt.Sprint(r.Attempts)},
	}
	if r.PublishedAt != nil {
		hop.Details = append(hop.Details, Detail{"marked published at", stamp(*r.PublishedAt)},
			Detail{"publish delay", r.PublishedAt.Sub(r.CreatedAt).Round(time.Millisecond).String()})
	} else {
		hop.Details = append(hop.Details, Detail{"next attempt at", stamp(r.NextAttemptAt)})
	}
	if r.CausationID != "" {
		hop.Details = append(hop.Details, Detail{"caused by", r.CausationID})
	}
	if r.LastError != "" {
		hop.Details = append(hop.Details, Detail{"last error", r.LastError})
		if r.Status == "PUBLISHED" {
			hop.Retried = retried("failed", "published", r.Attempts)
		}
	}
	return hop
}

func deliveryHop(r inboxadmin.Row) Hop {
	hop := Hop{At: r.FirstReceivedAt, Actor: r.Consumer, Kind: KindDelivery}
	switch r.Status {
	case "PROCESSED":
		hop.Health = HealthOK
		hop.Summary = fmt.Sprintf("%s: %s (%s)", r.Type, r.Status, r.Outcome)
	case "PERMANENT_FAILED", "POISONED":
		hop.Health = HealthFailed
		hop.Summary = fmt.Sprintf("%s: %s, parked", r.Type, r.Status)
	default:
		hop.Health = HealthPending
		hop.Summary = fmt.Sprintf("%s: %s", r.Type, r.Status)
	}
	hop.Details = []Detail{
		{"message id", r.MessageID},
		{"first received", stamp(r.FirstReceivedAt)},
		{"last received", stamp(r.LastReceivedAt)},
		{"processed", stampOr(r.ProcessedAt, "not yet")},
		{"status", r.Status},
		{"outcome", cmp.Or(r.Outcome, "none yet")},
		{"attempts", fmt.Sprint(r.Attempts)},
	}
	if r.OutcomeReason != "" {
		hop.Details = append(hop.Details, Detail{"outcome reason", r.OutcomeReason})
	}
	if r.LastErrorCode != "" || r.LastErrorMessage != "" {
		last := r.LastErrorMessage
		if !strings.HasPrefix(last, r.LastErrorCode) { // the message often starts with its code
			last = strings.TrimSpace(r.LastErrorCode + ": " + last)
		}
		hop.Details = append(hop.Details, Detail{"last error", last})
		if r.Status == "PROCESSED" {
			hop.Retried = retried("failed", "processed", r.Attempts)
		}
	}
	return hop
}

func notificationHop(n Notification) Hop {
	hop := Hop{At: n.CreatedAt, Actor: ActorWebhook, Kind: KindNotification,
		Summary: fmt.Sprintf("notification %s: %s", n.Kind, n.Status)}
	switch n.Status {
	case "SENT", "SKIPPED":
		hop.Health = HealthOK
	case "FAILED":
		hop.Health = HealthFailed
	default:
		hop.Health = HealthPending
	}
	hop.Details = []Detail{
		{"idempotency key", n.ID.String()},
		{"asked for by", n.MessageID},
		{"webhook calls", fmt.Sprint(n.Attempts)},
		{"sent", stampOr(n.SentAt, "not yet")},
	}
	if n.LastError != "" {
		hop.Details = append(hop.Details, Detail{"last error", n.LastError})
	}
	if n.Status == "SENT" && n.Attempts > 1 { // a call failed, a later one delivered it
		hop.Retried = retried("failed", "delivered", n.Attempts)
	}
	return hop
}

// retried says that a row whose last error is recorded went through on a
// later attempt of its attempts: "refused once, delivered on retry".
func retried(failed, done string, attempts int) string {
	switch n := attempts - 1; {
	case n <= 1:
		return failed + " once, " + done + " on retry"
	default:
		return fmt.Sprintf("%s %d times, %s on retry", failed, n, done)
	}
}

// Summary is the order's journey in a few facts: what the timeline page
// leads with.
type Summary struct {
	Path   []domain.Status // the statuses the order went through, oldest first
	Final  bool            // the last of Path is a final status
	Took   time.Duration   // from its creation to its last status change
	Reason string          // why the last status change, when it says (a rejection's skus)
	// Messages about the order (its outbox rows), their deliveries to the
	// consumers (inbox rows) and the customer notifications.
	Messages, Deliveries, Notifications int
	// Hops by health, and those that went through after failing first.
	Failed, Pending, Retried int
}

// Summary sums up the order's journey from its history and its hops.
func (t *Timeline) Summary() Summary {
	s := Summary{Messages: len(t.Outbox), Deliveries: len(t.Inbox), Notifications: len(t.Notifications)}
	for _, h := range t.History {
		s.Path = append(s.Path, h.To)
	}
	if n := len(t.History); n > 0 {
		last := t.History[n-1]
		s.Final, s.Took, s.Reason = last.To.Final(), last.CreatedAt.Sub(t.History[0].CreatedAt), last.Reason
	}
	for _, h := range t.Hops() {
		switch h.Health {
		case HealthFailed:
			s.Failed++
		case HealthPending:
			s.Pending++
		}
		if h.Retried != "" {
			s.Retried++
		}
	}
	return s
}

// stamp shows a time in UTC to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") }

func stampOr(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return stamp(*t)
}
