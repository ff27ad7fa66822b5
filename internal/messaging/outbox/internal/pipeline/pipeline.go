// Package pipeline is the broker side of the outbox relay, whatever its
// rows' source: the polling relay claims them from the table (package
// outbox), the log-tailing relay streams them from the write-ahead log
// (package outbox/wal). Both hand each row to a Publisher (one channel in
// confirm mode, its returns, the window of unconfirmed messages), which
// says what became of it (an Outcome); Pipeline.Record counts the outcomes
// and sorts them into the marks the source writes back.
//
// The package is internal to the outbox: a team that keeps only the
// polling relay deletes outbox/wal, and this package stays as it is.
package pipeline

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/dbsqlc"
)

// Row is an outbox row to publish: claimed from the table, or read from
// the log.
type Row struct {
	ID          uuid.UUID // the AMQP message_id, the same on every attempt
	AggregateID string
	Type        string
	Version     int
	Exchange    string
	RoutingKey  string
	Payload     []byte
	Headers     map[string]string
	Attempt     int    // 1 on the first claim
	ClaimToken  string // claimed_by: unique to the claim that took the row
	CreatedAt   time.Time
	// Partition is the row's partition when the relays share the outbox by
	// partition (outbox.Config.Partitions), -1 when not. It travels as the
	// message's partition header, which routes it to its partition's queue.
	Partition int
}

// Claim names one claim of a row: the row, the attempt that claimed it,
// and the claim's token. Marks match the token, so a relay can only mark
// rows it still holds: once a lease runs out and another claim takes the
// row, the first relay's marks (and their retries) change nothing. The
// row's created_at completes its key: marks find the row in its time
// partition without looking through the others.
type Claim struct {
	ID        uuid.UUID
	Attempt   int
	Token     string
	CreatedAt time.Time
}

// Claim returns the claim of row r.
func (r Row) Claim() Claim {
	return Claim{ID: r.ID, Attempt: r.Attempt, Token: r.ClaimToken, CreatedAt: r.CreatedAt}
}

// Span is the oldest and the newest created_at of the rows of m: the
// bounds of the time partitions a mark of m touches. Zero times when m is
// empty.
func (m Marks) Span() (oldest, newest time.Time) {
	first := true
	see := func(t time.Time) {
		if first || t.Before(oldest) {
			oldest = t
		}
		if first || t.After(newest) {
			newest = t
		}
		first = false
	}
	for _, c := range m.Published {
		see(c.CreatedAt)
	}
	for _, f := range m.Refused {
		see(f.CreatedAt)
	}
	for _, f := range m.Released {
		see(f.CreatedAt)
	}
	return oldest, newest
}

// PublishFailure is a row the broker did not accept, or whose publish was
// cut short.
type PublishFailure struct {
	Claim
	Reason  string        // stored in last_error
	RetryIn time.Duration // the wait before the next attempt
}

// Marks are the outcomes of the rows of one batch: each row in one list.
type Marks struct {
	Published []Claim          // confirmed: PUBLISHED
	Refused   []PublishFailure // returned as unroutable: the attempt counted, FAILED after the last
	Released  []PublishFailure // never published, nacked, or cut short: the attempt not counted
}

// Marked is what writing Marks changed: how many rows of each list it
// marked (fewer than given when a lease was lost meanwhile), and the
// refused rows that became FAILED.
type Marked struct {
	Published, Refused, Released int64
	Failed                       []uuid.UUID
}

// Faults are the points where tests and drills inject failures into a
// running relay. Production leaves Settings.Faults nil; each is called from
// one line.
type Faults interface {
	// BeforeMark runs after the broker confirmed the published rows of a
	// batch and before they are marked PUBLISHED. An error stops the relay
	// right there, as a crash would: the rows stay PUBLISHING until their
	// lease ends, and are published again.
	BeforeMark(published []Claim) error
	// AfterClaim runs once a claim that took rows has committed, before
	// the rows go on. An error drops the claim's answer, as a connection
	// cut during its COMMIT does (the primary died or was switched over):
	// the rows are PUBLISHING under a claim the relay never saw.
	AfterClaim(rows int) error
}

// Settings are the relay's settings the pipeline uses (outbox.Config says
// what each means), defaults applied.
type Settings struct {
	MaxInFlight             int
	ConfirmTimeout          time.Duration
	PollInterval            time.Duration
	BackoffBase, BackoffMax time.Duration
	MaxAttempts             int
	DBTimeout               time.Duration
	Lease                   time.Duration
	MessageTypes            []string
	Faults                  Faults
}

// Deps are what a pipeline works with.
type Deps struct {
	AMQPURL string
	Pool    *pgxpool.Pool // nil: no nacked rows to bring back (tests)
	Logger  *slog.Logger
	Tracer  trace.Tracer
	Meter   metric.Meter
	// Wake tells the relay that publishing may go on (the broker unblocked
	// publishers).
	Wake func()
	// Crash stops the relay at once, with its cause (Faults).
	Crash context.CancelCauseFunc
}

// Pipeline is a relay's publishing and recording, shared by every session
// (broker connection) of the relay.
type Pipeline struct {
	cfg     Settings
	deps    Deps
	metrics *metrics
	// inFlight counts the messages published and not yet confirmed.
	inFlight atomic.Int64
	// refusals counts the batches in a row that the broker nacked some of:
	// the broker's own trouble, so the wait before the next try grows with
	// it, not with the rows' attempts.
	refusals atomic.Int64
}

// New returns the pipeline of a relay.
func New(cfg Settings, deps Deps) (*Pipeline, error) {
	m, err := newMetrics(deps.Meter, cfg.MessageTypes)
	if err != nil {
		return nil, err
	}
	return &Pipeline{cfg: cfg, deps: deps, metrics: m}, nil
}

// InFlight is how many messages wait for their confirm.
func (p *Pipeline) InFlight() int64 { return p.inFlight.Load() }

var queries = dbsqlc.New()

// metrics are the pipeline's instruments: what became of each publish
// (docs/observability.md lists them with the alerts to set).
type metrics struct {
	published          metric.Int64Counter
	attempts           metric.Int64Counter
	unroutable         metric.Int64Counter
	failed             metric.Int64Counter
	confirmLatency     metric.Float64Histogram
	publishDelay       metric.Float64Histogram
	attemptsPerMessage metric.Int64Histogram
}

func newMetrics(meter metric.Meter, types []string) (*metrics, error) {
	var (
		m   metrics
		err error
	)
	mc := &messaging.Counters{Meter: meter}
	counter := mc.Counter
	m.published = counter("outbox.published", "Outbox rows published and confirmed by the broker, by message type.")
	m.attempts = counter("outbox.publish.attempts", "Publish attempts by outcome: confirmed, nacked, unroutable, timeout, connection_lost, not_published, shutdown.")
	m.unroutable = counter("outbox.unroutable", "Messages the broker returned as unroutable (mandatory, no queue bound), by message type.")
	m.failed = counter("outbox.failed", "Outbox rows that became FAILED: publish attempts exhausted.")
	if mc.Err != nil {
		return nil, mc.Err
	}
	// Counters start at zero for every label value known in advance, so
	// that rate() and alerts see a series before the first event.
	ctx := context.Background()
	for _, typ := range types {
		attrs := metric.WithAttributes(messaging.AttrMessageType.String(typ))
		m.published.Add(ctx, 0, attrs)
		m.unroutable.Add(ctx, 0, attrs)
	}
	m.failed.Add(ctx, 0)
	if m.confirmLatency, err = meter.Float64Histogram("outbox.confirm.latency", metric.WithUnit("s"), messaging.SecondsBuckets,
		metric.WithDescription("From publish to the broker's confirm.")); err != nil {
		return nil, err
	}
	if m.publishDelay, err = meter.Float64Histogram("outbox.publish.delay", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
		metric.WithDescription("From the outbox row's commit (created_at) to the broker's confirm.")); err != nil {
		return nil, err
	}
	if m.attemptsPerMessage, err = meter.Int64Histogram("outbox.publish.attempt_number",
		metric.WithExplicitBucketBoundaries(1, 2, 3, 5, 10, 20),
		metric.WithDescription("The attempt on which each confirmed row was published (1 = first try).")); err != nil {
		return nil, err
	}
	return &m, nil
}
