package database

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/yourorg/orders/internal/background"
)

// Pool is where Run takes its connections: a *pgxpool.Pool, or a type
// around one that bounds the wait for a connection (order-api's).
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// ErrCommitUnknown is a COMMIT cut off in flight whose outcome the server
// could not tell in time (Policy.ConfirmCommit): the transaction may have
// taken effect. Run never runs such a transaction again.
var ErrCommitUnknown = errors.New("the outcome of the COMMIT is unknown")

// Policy says what Run does when a transaction fails for the database's
// sake. The zero Policy runs it once, as pgx.BeginFunc does. The policies
// nest: Hold around RetryContention around ConfirmCommit around one run.
type Policy struct {
	// Options are the transaction's: isolation level, access mode.
	Options pgx.TxOptions
	// Timeout bounds each run, COMMIT included, so that a connection that
	// stopped answering cannot hang the caller (0: ctx alone).
	Timeout time.Duration
	// ConfirmCommit runs a transaction whose connection died again, up to
	// MaxReruns times, on a connection that has just answered, when it is
	// certain that the run before wrote nothing: the connection died before the COMMIT, the
	// transaction was read-only or wrote nothing, or the COMMIT was cut
	// off in flight and the server, asked by the transaction's id
	// (pg_xact_status) on another connection, says it aborted. Committed:
	// Run returns nil. Still in progress after 5 s, or no id to ask by:
	// ErrCommitUnknown. Never is a COMMIT of unknown outcome run again
	// blindly. The id costs no round trip of its own: it is asked for with
	// the COMMIT, and the server sends it before it runs the COMMIT, so
	// only a cut in the moment between the two leaves no id to ask by.
	ConfirmCommit bool
	// RetryContention is how many times a transaction that lost a
	// serialization failure (40001) or a deadlock (40P01) runs again, at
	// once: the standard remedy.
	RetryContention int
	// Hold, when set, runs the transaction again, with growing waits,
	// while the database is unavailable (IsUnavailable: down, cut off,
	// read-only, out of disk; a run that timed out), until it succeeds,
	// fails otherwise, or ctx ends. Without ConfirmCommit, a COMMIT cut
	// off in flight is run again too: only for work that is safe to run
	// twice.
	Hold *Hold
}

// Hold is how Run waits for an unavailable database.
type Hold struct {
	// Start, if set, is called when the first run fails for
	// unavailability, with its error; the function it returns, if any,
	// once the hold ends, with Run's result (nil: a run went through).
	Start func(ctx context.Context, cause error) (end func(err error))
	// Wait is the first wait, doubling up to MaxWait, with jitter.
	// Default 200ms and OutageRetryMax: the hold ends within about a
	// second of the database answering again.
	Wait, MaxWait time.Duration
}

// Run runs fn in a transaction on a connection of db and commits it,
// under policy p. fn gets the run's context (bounded by p.Timeout) and
// may run more than once: it must set what the caller reads after afresh
// on each run. The errors Run returns that came from the database are
// marked so (IsFault); an error of fn that did not (a call to another
// system) comes back as it was.
func Run(ctx context.Context, db Pool, p Policy, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	if p.Hold == nil {
		return p.retryContention(ctx, db, fn)
	}
	var end func(error)
	defer func() {
		if end != nil {
			end(err)
		}
	}()
	for try := 1; ; try++ {
		err = p.retryContention(ctx, db, fn)
		if err == nil || !IsFault(err) || !IsUnavailable(err) || errors.Is(err, ErrCommitUnknown) || ctx.Err() != nil {
			return err
		}
		if try == 1 && p.Hold.Start != nil {
			end = p.Hold.Start(ctx, err)
		}
		wait := background.Backoff(try, cmp.Or(p.Hold.Wait, 200*time.Millisecond), cmp.Or(p.Hold.MaxWait, OutageRetryMax))
		if !background.Sleep(ctx, wait) {
			return err
		}
	}
}

func (p Policy) retryContention(ctx context.Context, db Pool, fn func(context.Context, pgx.Tx) error) error {
	for try := 1; ; try++ {
		err := p.confirmCommit(ctx, db, fn)
		if err == nil || try > p.RetryContention || !lostContention(err) {
			return err
		}
		if !background.Sleep(ctx, time.Duration(try)*10*time.Millisecond) {
			return err
		}
	}
}

func lostContention(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// MaxReruns is how many times ConfirmCommit runs again a transaction
// that certainly wrote nothing: a rerun may meet the next cut (a pooler
// restarted twice, a failover that cuts the new connections as well), and
// each run costs only the time to the next dead connection.
const MaxReruns = 3

func (p Policy) confirmCommit(ctx context.Context, db Pool, fn func(context.Context, pgx.Tx) error) error {
	err := p.once(ctx, db, false, fn)
	var lost *lostError
	for rerun := 1; p.ConfirmCommit && rerun <= MaxReruns && errors.As(err, &lost) && ctx.Err() == nil; rerun++ {
		err = p.once(ctx, db, true, fn)
	}
	return err
}

// lostError is a transaction whose connection died before it committed:
// the server rolled it back.
type lostError struct{ err error }

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// once is one run of the transaction; fresh: on a connection that answers
// a ping (a rerun: the connections a failover cut die together, and the
// pool finds out only when it uses them).
func (p Policy) once(ctx context.Context, db Pool, fresh bool, fn func(context.Context, pgx.Tx) error) error {
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	xid, err := p.try(ctx, db, fresh, fn)
	if xid == "" {
		return err
	}
	switch status := xactStatus(ctx, db, xid); status {
	case "committed":
		return nil
	case "aborted":
		return &lostError{err}
	default:
		return Fault(fmt.Errorf("the connection died during the COMMIT (%s): %w: %w", status, ErrCommitUnknown, err))
	}
}

// try runs the transaction on a connection of its own. It returns the
// transaction's id when its connection died during the COMMIT: once asks
// what became of it, having given the dead connection back to the pool.
func (p Policy) try(ctx context.Context, db Pool, fresh bool, fn func(context.Context, pgx.Tx) error) (xid string, err error) {
	conn, err := acquire(ctx, db, fresh)
	if err != nil {
		return "", err
	}
	defer conn.Release() // a dead connection, or one left in a transaction, is destroyed
	// lost marks a failure that killed the connection before the COMMIT.
	lost := func(err error) error {
		if conn.Conn().IsClosed() {
			return &lostError{err}
		}
		return err
	}
	tx, err := conn.BeginTx(ctx, begin(conn.Conn(), p.Options))
	if err != nil {
		return "", lost(Fault(err))
	}
	done := false
	defer func() {
		if !done { // fn failed or panicked
			_ = tx.Rollback(ctx)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return "", lost(faultOf(ctx, conn, err))
	}
	done = true
	if !p.ConfirmCommit || p.Options.AccessMode == pgx.ReadOnly {
		return "", lost(Fault(tx.Commit(ctx)))
	}
	xid, known, err := commit(ctx, conn.Conn())
	switch {
	case err == nil:
		return "", nil
	case !conn.Conn().IsClosed():
		return "", Fault(err) // an answer from a live session: a COMMIT that fails rolls back
	case !known:
		return "", Fault(fmt.Errorf("the connection died during the COMMIT, before the transaction's id came: %w: %w", ErrCommitUnknown, err))
	case xid == "":
		// The server ended the session before it ran the COMMIT, or the
		// transaction wrote nothing.
		return "", &lostError{Fault(err)}
	}
	return xid, Fault(err)
}

// begin returns o with the BEGIN that also makes the pool's settings
// (NewPool) for the transaction: the same round trip, one simple query.
func begin(conn *pgx.Conn, o pgx.TxOptions) pgx.TxOptions {
	set, _ := conn.PgConn().CustomData()[settingsKey].(string)
	if set == "" {
		return o
	}
	if o.BeginQuery == "" {
		o.BeginQuery = "BEGIN"
		if o.IsoLevel != "" {
			o.BeginQuery += " ISOLATION LEVEL " + string(o.IsoLevel)
		}
		if o.AccessMode != "" {
			o.BeginQuery += " " + string(o.AccessMode)
		}
		if o.DeferrableMode != "" {
			o.BeginQuery += " " + string(o.DeferrableMode)
		}
	}
	o.BeginQuery += "; " + set
	return o
}

// faultOf marks an error of fn as the database's when it is: a server
// error, a failed connect, or any error once the connection died or the
// run's deadline passed (a statement failed under it).
func faultOf(ctx context.Context, conn *pgxpool.Conn, err error) error {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	if errors.As(err, &pgErr) || errors.As(err, &connErr) || conn.Conn().IsClosed() || ctx.Err() != nil {
		return Fault(err)
	}
	return err
}

// commit commits the open transaction of conn, and asks in the same round
// trip for its id (pg_current_xact_id_if_assigned), which the server
// flushes before it runs the COMMIT: a client that loses the COMMIT's
// answer has the id. xid is "" when the transaction wrote nothing, or when
// the server answered the question with an error and so never ran the
// COMMIT; known is false when the COMMIT may have run and the id did not
// come.
func commit(ctx context.Context, conn *pgx.Conn) (xid string, known bool, err error) {
	// The pipeline goes past pgx's query tracing: the COMMIT is traced
	// here, as tx.Commit would be (a span of its own in the trace).
	var tag pgconn.CommandTag
	if t := conn.Config().Tracer; t != nil {
		ctx = t.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: "COMMIT"})
		defer func() { t.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: tag, Err: err}) }()
	}
	p := conn.PgConn().StartPipeline(ctx)
	// The unnamed statement: a named one would not outlive the server
	// session a pooler lent the transaction, or a DEALLOCATE ALL.
	p.SendQueryParams("SELECT pg_current_xact_id_if_assigned()::text", nil, nil, nil, nil)
	p.SendFlushRequest()
	p.SendQueryParams("COMMIT", nil, nil, nil, nil)
	if err := p.Sync(); err != nil {
		return "", false, err
	}
	defer func() {
		if closeErr := p.Close(); err == nil {
			err = closeErr
		}
	}()
	res, err := p.GetResults()
	var id *pgconn.Result
	if err == nil {
		id = res.(*pgconn.ResultReader).Read()
		err = id.Err
	}
	if err != nil {
		var pgErr *pgconn.PgError
		return "", errors.As(err, &pgErr), err
	}
	if len(id.Rows) == 1 && id.Rows[0][0] != nil {
		xid = string(id.Rows[0][0])
	}
	if res, err = p.GetResults(); err != nil {
		return xid, true, err
	}
	tag, err = res.(*pgconn.ResultReader).Close()
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return xid, true, err
}

// xactStatus asks the server what became of transaction xid, on a live
// connection: committed, aborted, or (while its session lingers) in
// progress, waited for up to outcomeWait. Anything else it returns is why
// it could not tell. A connection that fails it on the way (the cut that
// lost the COMMIT takes its siblings with it, and the pool finds out only
// when it uses them) is not an answer: it asks again on another.
func xactStatus(ctx context.Context, db Pool, xid string) string {
	ctx, cancel := context.WithTimeout(ctx, outcomeWait)
	defer cancel()
	for {
		status, err := askXactStatus(ctx, db, xid)
		switch {
		case err == nil && status == nil:
			return "too old to tell"
		case err == nil && *status != "in progress":
			return *status
		}
		if !background.Sleep(ctx, 10*time.Millisecond) {
			if err != nil {
				return "cannot ask: " + err.Error()
			}
			return "still in progress"
		}
	}
}

func askXactStatus(ctx context.Context, db Pool, xid string) (*string, error) {
	conn, err := acquire(ctx, db, true)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var status *string
	err = conn.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&status)
	return status, err
}

// outcomeWait bounds the wait for the outcome of a COMMIT whose connection
// was cut: a fresh connection (after a failover, the pool has to make one)
// and the answer.
const outcomeWait = 5 * time.Second

// acquire takes a connection; fresh: one that answers a ping, the dead
// ones it finds on the way destroyed.
func acquire(ctx context.Context, db Pool, fresh bool) (*pgxpool.Conn, error) {
	for {
		conn, err := db.Acquire(ctx)
		if err != nil {
			return nil, Fault(err)
		}
		if !fresh {
			return conn, nil
		}
		err = conn.Ping(ctx)
		if err == nil {
			return conn, nil
		}
		dead := conn.Conn().IsClosed()
		conn.Release()
		if !dead || ctx.Err() != nil {
			return nil, Fault(err)
		}
	}
}
