package outbox

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// Config configures an outbox relay. Zero fields take the defaults
// noted on each.
type Config struct {
	// ID names this relay in claimed_by and in RabbitMQ's connection list.
	// Default: host name, process id and a random suffix.
	ID string
	// BatchSize is how many rows one claim takes. Default 500.
	BatchSize int
	// MaxInFlight caps the messages published and not yet confirmed (the
	// confirm window). Default 2000.
	MaxInFlight int
	// PollInterval is how often the relay looks for due rows without being
	// woken by NOTIFY (retries whose backoff ended, missed notifications),
	// and recovers expired leases. Default 1s.
	PollInterval time.Duration
	// Notify wakes the relay on LISTEN/NOTIFY as soon as rows commit.
	// Default on; NotifyOff turns it off (polling only).
	NotifyOff bool
	// ListenURL is the LISTEN connection's database URL: one past any
	// connection pooler in transaction mode, which passes a session's
	// notifications to no one. Default: the pool's; when that leads
	// through a pooler (of any mode: the relay cannot tell), the relay
	// says so and only polls.
	ListenURL string
	// Lease is how long a claimed row belongs to this relay; after that any
	// relay may take it back. Default 30s. Keep it well above
	// ConfirmTimeout.
	Lease time.Duration
	// ConfirmTimeout is how long to wait for the broker's confirm of a
	// message before treating the publish as failed. Default 10s.
	ConfirmTimeout time.Duration
	// MaxAttempts is how many publishes a row gets before it is FAILED.
	// Default 10.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the delay before a failed row is
	// retried: about BackoffBase after the first failure, doubling, at most
	// BackoffMax. Defaults 1s and 5m.
	BackoffBase, BackoffMax time.Duration
	// ShutdownTimeout bounds the wait for outstanding confirms on stop;
	// rows still unconfirmed then are handed back. Default 15s.
	ShutdownTimeout time.Duration
	// DBTimeout bounds each database call of the relay (a claim, a mark,
	// lease recovery), so that a connection that stopped answering cannot
	// hang it. Default 10s.
	DBTimeout time.Duration
	// Retention is how long PUBLISHED rows are kept; 0 keeps them forever.
	// Retention drops a whole time partition once it ended Retention ago
	// and every row of it was PUBLISHED at least Retention ago, so a row is
	// kept between Retention and Retention plus a TimePartition. Default 0
	// (the binary sets its own default).
	Retention time.Duration
	// TimePartition is the period of one time partition of message_outbox
	// (timepartition.go): Day or Week. Default Week.
	TimePartition string
	// MessageTypes lists the message types the relay is expected to
	// publish, so that their metric series exist at zero before the first
	// message. Optional.
	MessageTypes []string
	// Readers lists, by message type, the queues of every consumer that
	// reads that type. mandatory has the broker return a message only when
	// no queue at all matches it; a message that reaches one of its readers
	// and not another, whose queue is missing (not declared yet, deleted
	// and declared again) or not bound yet, is confirmed, and lost for that
	// reader. So the relay checks these queues when it connects and at
	// every poll, binds each one it finds (Reader.Bind), and claims no row
	// of a type while any of its readers' queues is missing: it is not
	// ready then, and says which. Optional: a type not listed is published
	// whatever queues exist.
	Readers map[string][]Reader
	// Partitions, when above 0, shares the outbox among the relays by
	// partition: each relay leases a fair share of the partitions (for
	// Lease, renewed at every poll) and claims only their rows, so relays
	// do not compete for the same rows; a dead relay's partitions pass to
	// the others when its leases end. A row's partition is derived from its
	// aggregate id, and travels as the message's partition header, which the
	// consumers' partitioned topology routes by (inbox.Config.Partitions:
	// set both to the same number). 0: every relay claims from the whole
	// outbox. Default 0.
	Partitions int
	// Faults, when set, injects failures (tests, drills). Nil in production.
	Faults pipeline.Faults
}

func (c *Config) setDefaults() {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), strconv.FormatInt(time.Now().UnixNano()%1e6, 36))
	}
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, 2000)
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.Lease = cmp.Or(c.Lease, 30*time.Second)
	c.ConfirmTimeout = cmp.Or(c.ConfirmTimeout, 10*time.Second)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.BackoffBase = cmp.Or(c.BackoffBase, time.Second)
	c.BackoffMax = cmp.Or(c.BackoffMax, 5*time.Minute)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 15*time.Second)
	c.DBTimeout = cmp.Or(c.DBTimeout, 10*time.Second)
	c.TimePartition = cmp.Or(c.TimePartition, Week)
}

// Validate reports settings that cannot work together.
func (c *Config) Validate() error {
	var errs []error
	if c.BatchSize < 1 || c.MaxInFlight < 1 || c.MaxAttempts < 1 {
		errs = append(errs, errors.New("batch size, in-flight window and max attempts must be at least 1"))
	}
	if c.MaxInFlight < c.BatchSize {
		errs = append(errs, fmt.Errorf("the in-flight window (%d) must hold at least one batch (%d)", c.MaxInFlight, c.BatchSize))
	}
	if c.Lease <= c.ConfirmTimeout {
		errs = append(errs, fmt.Errorf("the lease (%s) must be longer than the confirm timeout (%s)", c.Lease, c.ConfirmTimeout))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, errors.New("the maximum backoff must not be below the base"))
	}
	if c.Retention < 0 {
		errs = append(errs, errors.New("retention must not be negative"))
	}
	if c.TimePartition != Day && c.TimePartition != Week {
		errs = append(errs, fmt.Errorf("the time partition must be %q or %q, got %q", Day, Week, c.TimePartition))
	}
	if c.Partitions < 0 || c.Partitions > MaxPartitions {
		errs = append(errs, fmt.Errorf("partitions must be between 0 and %d", MaxPartitions))
	}
	return errors.Join(errs...)
}

// scope is the instrumentation scope of the outbox's spans and metrics.
const scope = "github.com/yourorg/orders/internal/messaging/outbox"
