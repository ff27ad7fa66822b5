package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/yourorg/orders/internal/messaging/outbox"
)

// Config configures the consumers of a process. Zero fields take
// the defaults noted on each.
type Config struct {
	// Exchange is the topic exchange the consumers' queues are bound to,
	// by message type. Required.
	Exchange string
	// FollowUps writes the follow-up messages handlers return to the
	// outbox, in the transaction of their delivery. Its Exchange defaults to
	// Exchange, its Producer to "consumer"; its AggregateType is required
	// when a handler returns follow-ups.
	FollowUps outbox.Writer
	// Prefetch is how many unacknowledged deliveries the broker sends each
	// consumer at once. Default 32.
	Prefetch int
	// Workers is how many deliveries each consumer processes at once.
	// Default 8.
	Workers int
	// BatchSize is how many deliveries a worker may apply in one
	// transaction: those already waiting in the client's buffer when it
	// takes one. 1 turns batching off. Default 16.
	BatchSize int
	// BatchWait, when set, is how long a worker waits for more deliveries
	// to fill a batch. Default 0: a batch is what is already there, so a
	// quiet queue gets no added latency.
	BatchWait time.Duration
	// MaxAttempts is how many times a transient failure is retried before
	// the message is parked as poison. Default 5.
	MaxAttempts int
	// RetryDelays are the waits before the retries, growing; the last one
	// repeats. Default 1s, 5s, 30s, 2m.
	RetryDelays []time.Duration
	// DeliveryLimit is the work queues' x-delivery-limit: redeliveries
	// (crashes, nacks) after which the broker parks a message. Default 20.
	DeliveryLimit int
	// ProcessingLease is how long a message may stay PROCESSING between the
	// two steps of an external side effect before another delivery takes it
	// over. Default 1m.
	ProcessingLease time.Duration
	// TxTimeout bounds each processing transaction on the client side, so
	// that a connection that stopped answering cannot hang a worker: the
	// transaction is cut and the delivery held until the database answers.
	// Default 30s.
	TxTimeout time.Duration
	// ShutdownTimeout bounds the wait for the deliveries in progress on
	// stop; what is not done then is left unacknowledged for redelivery.
	// Default 15s.
	ShutdownTimeout time.Duration
	// InboxRetention is how long PROCESSED inbox rows are kept: at least
	// ReplayWindow. Retention drops a whole time partition once it ended
	// InboxRetention ago and every row of it was PROCESSED at least that
	// long ago. 0 keeps them forever.
	InboxRetention time.Duration
	// ReplayWindow is how long after its first delivery a message may come
	// again (a relay's republish, a redelivery, a replay from the parking
	// lot) and still be known as a duplicate: InboxRetention may not be
	// shorter. Default 168h.
	ReplayWindow time.Duration
	// TimePartition is the period of one time partition of message_inbox
	// (timepartition.go): outbox.Day or outbox.Week. Default Week.
	TimePartition string
	// Partitions, when above 0, keeps the messages of each aggregate (an
	// order) in order through the consumers. Each consumer gets one work
	// queue per partition, routed by the partition header the relays set
	// (outbox.Config.Partitions: set both to the same number), each with
	// single active consumer: one replica at a time consumes a partition,
	// and another takes over when it dies. A partition is handled one
	// delivery batch at a time, in order, never two deliveries of one
	// aggregate in a batch; a failure is retried in place, holding the
	// partition (a trip through a retry queue would let later messages
	// overtake it); and once a message is parked, the later messages of
	// its aggregate for this consumer are parked behind it (held_behind),
	// to be replayed together. Workers and RetryDelays do not apply. 0 (the
	// default): one work queue, Workers at a time, retries through the
	// retry queues.
	Partitions int
	// AlsoDeclare lists consumers this process does not run whose queues
	// and bindings it declares too, at every connect: so that the whole
	// topology exists whichever consumer processes run, and a message
	// published while one of them is down still reaches its queue.
	AlsoDeclare []*Consumer
	// ValidateBody, when set, checks a delivery's body against the schema
	// of its type and version before it is decoded (the service's message
	// contract: the inbox knows no schemas). A body it refuses is parked at
	// once with reason code schema_violation and its error as the reason,
	// which should say where the body breaks the schema. It runs only for a
	// (type, version) the consumer has a handler for. Nil checks nothing
	// beyond the handler's own decoding.
	ValidateBody func(typ string, version int, body []byte) error
	// Faults, when set, injects failures (tests, drills). Nil in production.
	Faults Faults
}

// Faults are the points where tests and drills inject failures into
// running consumers. Production leaves Config.Faults nil; each is called
// from one line.
type Faults interface {
	// AfterCommit runs after a delivery's transaction committed and before
	// its ack: the crash window of the inbox. A crash here leaves the
	// delivery unacknowledged; the broker delivers it again, and its inbox
	// row makes that delivery a duplicate.
	AfterCommit(ctx context.Context, d *Delivery)
}

func (c *Config) setDefaults() {
	c.Prefetch = cmp.Or(c.Prefetch, 32)
	c.Workers = cmp.Or(c.Workers, 8)
	c.BatchSize = cmp.Or(c.BatchSize, 16)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 5)
	if len(c.RetryDelays) == 0 {
		c.RetryDelays = []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}
	}
	c.DeliveryLimit = cmp.Or(c.DeliveryLimit, 20)
	c.ProcessingLease = cmp.Or(c.ProcessingLease, time.Minute)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 15*time.Second)
	c.TxTimeout = cmp.Or(c.TxTimeout, 30*time.Second)
	c.ReplayWindow = cmp.Or(c.ReplayWindow, 7*24*time.Hour)
	c.TimePartition = cmp.Or(c.TimePartition, outbox.Week)
	c.FollowUps.Exchange = cmp.Or(c.FollowUps.Exchange, c.Exchange)
	c.FollowUps.Producer = cmp.Or(c.FollowUps.Producer, "consumer")
}

// Validate reports settings that cannot work.
func (c *Config) Validate() error {
	var errs []error
	if c.Exchange == "" {
		errs = append(errs, errors.New("the exchange to bind the queues to is not set"))
	}
	if c.Prefetch < 1 || c.Workers < 1 || c.MaxAttempts < 1 || c.DeliveryLimit < 1 || c.BatchSize < 1 {
		errs = append(errs, errors.New("prefetch, workers, batch size, max attempts and delivery limit must be at least 1"))
	}
	if c.BatchWait < 0 {
		errs = append(errs, errors.New("batch wait must not be negative"))
	}
	for _, d := range c.RetryDelays {
		if d < time.Millisecond {
			errs = append(errs, fmt.Errorf("retry delay %s is shorter than a millisecond", d))
		}
	}
	if !slices.IsSorted(c.RetryDelays) {
		errs = append(errs, errors.New("retry delays must grow"))
	}
	if c.InboxRetention < 0 {
		errs = append(errs, errors.New("inbox retention must not be negative"))
	}
	if c.InboxRetention > 0 && c.InboxRetention < c.ReplayWindow {
		errs = append(errs, fmt.Errorf("the inbox retention (%s) is shorter than the replay window (%s): a message that came again "+
			"after its inbox row was dropped would be applied again; keep the rows longer, or shorten the window", c.InboxRetention, c.ReplayWindow))
	}
	if c.TimePartition != outbox.Day && c.TimePartition != outbox.Week {
		errs = append(errs, fmt.Errorf("the inbox's time partition must be %q or %q, got %q", outbox.Day, outbox.Week, c.TimePartition))
	}
	if c.Partitions < 0 || c.Partitions > outbox.MaxPartitions {
		errs = append(errs, fmt.Errorf("partitions must be between 0 and %d", outbox.MaxPartitions))
	}
	return errors.Join(errs...)
}

// scope is the instrumentation scope of the inbox's spans and metrics.
const scope = "github.com/yourorg/orders/internal/messaging/inbox"
