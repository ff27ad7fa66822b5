package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
)

// notifyChannel is the PostgreSQL channel the outbox trigger notifies when
// outbox rows commit (migrations/00001_message_outbox.sql).
const notifyChannel = "message_outbox"

// listen wakes the claim loop whenever outbox rows commit. A notification
// is only a hint: it is lost while the connection is down, so after every
// (re)connect the relay sweeps once, and the poll tick covers the rest.
func (r *Relay) listen(ctx context.Context) {
	background.Reconnect{
		What: "LISTEN connection (polling until it is back)", Base: 200 * time.Millisecond, MaxDelay: 10 * time.Second,
		Logger: r.log, Session: r.listenOnce,
	}.Run(ctx)
}

func (r *Relay) listenOnce(ctx context.Context) error {
	// A connection of its own: a LISTENing connection must not go back to
	// the pool for others to use.
	cfg, err := r.listenConfig()
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The pool's URL may lead through a pooler; one given for the LISTEN
	// connection is trusted (a pooler in session mode passes NOTIFYs on).
	if pooled, err := r.throughPooler(ctx, conn); err != nil {
		return err
	} else if pooled {
		_ = conn.Close(ctx)
		r.log.WarnContext(ctx, "the LISTEN connection leads through a connection pooler, where a LISTEN hears nothing in transaction mode: "+
			"the relay only polls (RELAY_POLL_INTERVAL); RELAY_LISTEN_DATABASE_URL, past the pooler or through one in session mode, wakes it at once",
			slog.Duration("poll_interval", r.cfg.PollInterval))
		<-ctx.Done()
		return ctx.Err()
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	r.signal() // notifications sent while we were not listening are gone: sweep
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
		r.notified(n.Payload)
	}
}

// listenConfig is the LISTEN connection's settings: Config.ListenURL's,
// named and traced as the pool's connections, or the pool's own.
func (r *Relay) listenConfig() (*pgx.ConnConfig, error) {
	pooled := r.pool.Config().ConnConfig
	if r.cfg.ListenURL == "" {
		return pooled.Copy(), nil
	}
	cfg, err := pgx.ParseConfig(r.cfg.ListenURL)
	if err != nil {
		return nil, fmt.Errorf("the LISTEN connection's URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = pooled.RuntimeParams["application_name"]
	cfg.Tracer = pooled.Tracer
	return cfg, nil
}

// throughPooler reports whether the LISTEN connection, on the pool's URL,
// leads through a connection pooler (database.ThroughPooler).
func (r *Relay) throughPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	if r.cfg.ListenURL != "" {
		return false, nil
	}
	return database.ThroughPooler(ctx, conn)
}

// A notification's payload (migrations/00012_notify_aggregates.sql):
// "h:" and the hashtext of each aggregate the statement inserted rows of,
// with "*" and the row count when above one, comma-separated; "" (the
// previous version's, and over 64 aggregates) names none: every relay
// wakes. So does a payload this relay cannot read.
const notifyHashes = "h:"

// aggregateHash is an aggregate id's hashtext, as the payload names it.
func aggregateHash(aggregateID string) int32 { return int32(hashText([]byte(aggregateID))) }

// partitionOfHash is outbox_partition of an aggregate of hash h.
func partitionOfHash(h int32, partitions int) int {
	return int((int64(h) + 1<<31) % int64(max(partitions, 1)))
}

// parseNotifyPayload reads a payload's aggregates, hash to row count;
// false: it names none (every relay wakes).
func parseNotifyPayload(payload string) (map[int32]int, bool) {
	list, ok := strings.CutPrefix(payload, notifyHashes)
	if !ok || list == "" {
		return nil, false
	}
	named := map[int32]int{}
	for item := range strings.SplitSeq(list, ",") {
		hash, count, many := strings.Cut(item, "*")
		h, err := strconv.ParseInt(hash, 10, 32)
		if err != nil {
			return nil, false
		}
		n := 1
		if many {
			if n, err = strconv.Atoi(count); err != nil || n < 1 {
				return nil, false
			}
		}
		named[int32(h)] += n
	}
	return named, true
}

// wakeups is what the relay knows of the aggregates of its rows, for its
// wake-up decisions: which have rows in flight (claimed, not yet marked),
// how many later rows wait behind those (a claim skips a row while an
// earlier one of its aggregate is unpublished), and how many rows of each
// the next claim is to take: named by the notifications that woke it, or
// held behind rows marked since. All by aggregate hash: two aggregates of
// one hash (one in 2^32) at worst wake the relay late, at the next mark
// or poll.
type wakeups struct {
	sync.Mutex
	inFlight map[int32]int // rows claimed and not yet marked
	held     map[int32]int // rows waiting behind those in flight
	due      map[int32]int // rows for the next claim to take
	// Counts of notifications, for tests (export_test.go): those that woke
	// the claim loop, those of other partitions' rows, and those whose rows
	// all wait behind rows in flight, which a mark wakes it for.
	woken, ignored, deferred atomic.Int64
}

// maxDue bounds the aggregates the relay remembers rows of between two
// claims (the claim loop waits while the broker blocks it); beyond, it
// forgets them, and their held rows wait for the poll.
const maxDue = 4096

// notified decides whether a notification wakes the claim loop: it does
// when it names no aggregate, or names one of this relay's partitions
// with no row in flight here. The rows of an aggregate with a row in
// flight are held behind it: the mark of that row wakes the loop
// (rowsMarked), and a claim now would find nothing.
func (r *Relay) notified(payload string) {
	named, ok := parseNotifyPayload(payload)
	if !ok {
		r.wakeups.woken.Add(1)
		r.signal()
		return
	}
	var mine []int32
	if r.cfg.Partitions > 0 {
		if p := r.partitions.Load(); p != nil {
			mine = *p
		}
	}
	w := &r.wakeups
	w.Lock()
	wake, relevant := false, false
	for h, n := range named {
		if r.cfg.Partitions > 0 && !slices.Contains(mine, int32(partitionOfHash(h, r.cfg.Partitions))) {
			continue
		}
		relevant = true
		if w.inFlight[h] > 0 {
			w.held[h] += n
			continue
		}
		wake = true
		if len(w.due) < maxDue {
			w.due[h] += n
		}
	}
	w.Unlock()
	switch {
	case wake:
		w.woken.Add(1)
		r.signal()
	case relevant:
		w.deferred.Add(1)
	default:
		w.ignored.Add(1)
	}
}

// claimBegins returns the rows due since the last claim began, which this
// claim answers.
func (r *Relay) claimBegins() map[int32]int {
	w := &r.wakeups
	w.Lock()
	defer w.Unlock()
	due := w.due
	w.due = map[int32]int{}
	return due
}

// rowsClaimed records a claim's rows as in flight. Of the rows due that
// it answers, those of an aggregate it took a row of and not taken (it
// takes one an aggregate: the later ones wait behind it) are held behind
// it; those of an aggregate it took none of are not this relay's, or not
// due yet, and it forgets them.
func (r *Relay) rowsClaimed(due map[int32]int, rows []Row) {
	w := &r.wakeups
	w.Lock()
	defer w.Unlock()
	took := map[int32]int{}
	for _, row := range rows {
		h := aggregateHash(row.AggregateID)
		w.inFlight[h]++
		took[h]++
	}
	for h, n := range took {
		if due[h] > n {
			w.held[h] += due[h] - n
		}
	}
}

// rowsMarked records rows as marked; once an aggregate with rows held
// behind has none in flight, they are due: it wakes the claim loop.
func (r *Relay) rowsMarked(rows []Row) {
	w := &r.wakeups
	w.Lock()
	wake := false
	for _, row := range rows {
		h := aggregateHash(row.AggregateID)
		if w.inFlight[h]--; w.inFlight[h] > 0 {
			continue
		}
		delete(w.inFlight, h)
		if n := w.held[h]; n > 0 {
			delete(w.held, h)
			w.due[h] += n
			wake = true
		}
	}
	w.Unlock()
	if wake {
		r.rescan.Store(true) // the rows held behind lie before the claim's floor
		r.signal()
	}
}

// resetWakeups forgets the rows in flight: a session ends, every row it
// claimed marked or left to its lease.
func (r *Relay) resetWakeups() {
	w := &r.wakeups
	w.Lock()
	defer w.Unlock()
	w.inFlight, w.held, w.due = map[int32]int{}, map[int32]int{}, map[int32]int{}
}
