package outbox

import (
	"context"
	"log/slog"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.32.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
)

// session is one broker connection's worth of publishing: the publisher
// (one channel in confirm mode), and the pipeline that claims, publishes,
// awaits confirms and marks (run).
type session struct {
	relay *Relay
	pub   *pipeline.Publisher
}

// batch is one claim: its rows, each sent or not, in order, and the span
// of the batch (linked to every row's trace).
type batch struct {
	rows      []Row
	sent      []pipeline.Sent // one per published row, in order
	batchSpan trace.Span
}

func newSession(r *Relay) *session { return &session{relay: r} }

// run is the relay's pipeline over one broker connection, until ctx ends
// or the channel fails. Every batch goes through four steps, in this order:
//
//  1. claim    due rows, leased to this relay (claimRows)       claimLoop
//  2. publish  each row, mandatory, confirms pipelined          publishLoop
//  3. confirm  wait for the broker's answer to each row         confirmLoop -> publisher.await
//  4. mark     every row by that answer, in one statement      confirmLoop -> Relay.record
//
// The steps run in goroutines of their own, joined by channels, so that
// they overlap: the next batch is claimed while this one is published, and
// confirms are awaited while later batches go out. At most MaxInFlight
// messages wait for their confirm (the window). On shutdown, claiming
// stops at once; the confirm loop goes on for up to ShutdownTimeout,
// marking what the broker confirms and handing back the rest.
func (s *session) run(ctx context.Context) error {
	r := s.relay
	conn, pub, sessCtx, err := r.pipe.Connect(ctx, "outbox-relay "+r.cfg.ID)
	if err != nil {
		return err
	}
	defer r.resetWakeups() // every row claimed is marked by now, or left to its lease
	// A stalled broker never answers connection.close: do not wait for it.
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	// sessCtx ends the claim and publish steps: on shutdown, when the
	// channel dies, or when the confirm step gives up on the channel.
	defer pub.Stop(nil)
	s.pub = pub

	// Before anything is published, and at every poll: are all the
	// readers' queues there? A type one of whose readers has none is held.
	r.lookForReaders(ctx, conn)
	go s.watchReaders(sessCtx, conn)

	r.connected.Store(true)
	defer r.connected.Store(false)
	r.log.InfoContext(ctx, "connected to RabbitMQ")
	r.signal() // sweep: rows may have committed while we were away

	// drainCtx bounds the confirm step, which runs on after shutdown begins
	// for at most ShutdownTimeout; markCtx bounds the marks, DBTimeout
	// longer, so that the last batch's rows are still handed back.
	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancelDrain) })
	defer stopTimer()
	markCtx, cancelMarks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelMarks()
	defer context.AfterFunc(r.crashed, cancelMarks)()
	stopMarkTimer := context.AfterFunc(drainCtx, func() { time.AfterFunc(r.cfg.DBTimeout, cancelMarks) })
	defer stopMarkTimer()

	claimed := make(chan []Row, 1)                    // 1 -> 2
	published := make(chan *batch, r.cfg.MaxInFlight) // 2 -> 3
	confirmDone := make(chan struct{})                // 3 has stopped
	confirmErr := make(chan error, 1)
	go func() {
		defer close(confirmDone)
		err := s.confirmLoop(drainCtx, markCtx, published)
		if err != nil {
			pub.Stop(err)
		}
		confirmErr <- err
	}()
	go s.publishLoop(sessCtx, claimed, published, confirmDone)
	s.claimLoop(sessCtx, claimed)

	err = <-confirmErr
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = context.Cause(sessCtx)
	}
	return err
}

// watchReaders looks for the readers' queues at every poll, until ctx
// ends.
func (s *session) watchReaders(ctx context.Context, conn *amqp.Connection) {
	r := s.relay
	if len(r.cfg.Readers) == 0 {
		return
	}
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.lookForReaders(ctx, conn)
		}
	}
}

// maxUncertainClaims bounds the claims of unknown outcome a relay
// remembers, and maxMarkedClaims the claims marked within the lease:
// a failure a second for an hour, or over a hundred claims a second
// for a lease of 30 s. Beyond, the oldest are forgotten (their lease
// brings their rows back).
const (
	maxUncertainClaims = 4096
	maxMarkedClaims    = 4096
)

// uncertainClaims are the tokens of the claims whose outcome is unknown,
// oldest first.
func (r *Relay) uncertainClaims() []string {
	r.uncertain.Lock()
	defer r.uncertain.Unlock()
	return slices.Clone(r.uncertain.tokens)
}

// claimUncertain remembers the tokens of claims whose outcome is
// unknown: a claim that failed, or whose mark may be lost; the oldest
// beyond maxUncertainClaims are forgotten (their lease brings them back).
func (r *Relay) claimUncertain(tokens ...string) {
	r.uncertain.Lock()
	defer r.uncertain.Unlock()
	r.uncertain.tokens = append(r.uncertain.tokens, tokens...)
	if n := len(r.uncertain.tokens); n > maxUncertainClaims {
		r.uncertain.tokens = r.uncertain.tokens[n-maxUncertainClaims:]
	}
}

// claimsSettled forgets the n oldest tokens: given back.
func (r *Relay) claimsSettled(n int) {
	r.uncertain.Lock()
	defer r.uncertain.Unlock()
	r.uncertain.tokens = r.uncertain.tokens[min(n, len(r.uncertain.tokens)):]
}

// markedClaim is a claim whose rows a mark wrote, and when its COMMIT
// returned.
type markedClaim struct {
	token string
	at    time.Time
}

// claimsMarked remembers the claims of tokens, whose rows a mark wrote
// that committed at at. The relay's claims and marks commit
// asynchronously (synchronous_commit = off): a primary that dies within
// moments of a mark's COMMIT may not have sent it to its standby, and
// the new primary has the rows PUBLISHING, as the claim left them,
// until their lease ends; the later rows of their aggregates wait
// behind them. So once the relay sees its database fail
// (databaseFailed), every claim marked within the lease is of unknown
// outcome, and the next claim gives back whichever rows are still
// PUBLISHING under it: they are published again (a duplicate the
// inbox absorbs) within a second of the new primary, not at the end of
// their lease. A mark that did reach the new primary leaves its rows
// under no claim, and the give-back changes nothing.
func (r *Relay) claimsMarked(tokens []string, at time.Time) {
	r.marked.Lock()
	defer r.marked.Unlock()
	if !r.marked.failedAt.Before(at) { // a failure seen since the COMMIT: it too may be lost
		r.claimUncertain(tokens...)
		return
	}
	for _, token := range tokens {
		r.marked.claims = append(r.marked.claims, markedClaim{token: token, at: at})
	}
	// Past the lease, the rows of a lost mark come back anyway
	// (recoverExpired).
	drop := max(len(r.marked.claims)-maxMarkedClaims, 0)
	for drop < len(r.marked.claims) && time.Since(r.marked.claims[drop].at) > r.cfg.Lease {
		drop++
	}
	r.marked.claims = r.marked.claims[drop:]
}

// databaseFailed is called when a claim or a mark fails: the primary
// may have died, with the last marks it acknowledged. Every claim
// marked within the lease becomes of unknown outcome (claimsMarked).
func (r *Relay) databaseFailed() {
	r.marked.Lock()
	defer r.marked.Unlock()
	r.marked.failedAt = time.Now()
	var tokens []string
	for _, c := range r.marked.claims {
		if time.Since(c.at) <= r.cfg.Lease {
			tokens = append(tokens, c.token)
		}
	}
	r.marked.claims = nil
	r.claimUncertain(tokens...)
}

// claimLoop is step 1: it claims due rows while the window has room, until
// ctx ends, and hands each batch to the publish step. It never waits for a
// confirm.
func (s *session) claimLoop(ctx context.Context, claimed chan<- []Row) {
	defer close(claimed)
	r := s.relay
	size := int64(r.cfg.BatchSize)
	dbFailures := 0
	// The floor and scope of the last claim (claimFloor).
	var floor claimFloor
	var last claimScope
	for {
		// While the broker blocks publishers, claim nothing: the rows would
		// spend attempts waiting for confirms that cannot come.
		if !s.pub.WaitToPublish(ctx, size) {
			return
		}
		// A wake-up that came before this claim is answered by it: it sees
		// every row committed so far. Only a later one claims again.
		select {
		case <-r.wake:
		default:
		}
		due := r.claimBegins()
		scope := r.scope()
		// A claim after a full one scans on from the last row it took:
		// the rows before it were claimed, or passed over (not due, held
		// behind an earlier row of their aggregate, locked by another
		// relay). Once a poll tick, and whenever what the relay may
		// claim changes, a claim scans from the start again, and finds
		// what was passed over or came back since (a late commit with an
		// earlier created_at, a row given back or due again).
		if r.rescan.Swap(false) || !scope.sameRows(last) {
			floor = claimFloor{}
		}
		scope.after, last = floor, scope
		var rows []Row
		var err error
		if !scope.claimsNothing() { // a relay that holds no partition yet waits for the next poll
			// The end of the session does not cut a claim short: a claim
			// cancelled in flight may have committed all the same, and its
			// rows would wait for their lease (RELAY_LEASE) unseen. It runs
			// to its end (DBTimeout at most), and what it claimed goes on to
			// the publish step, which hands it back unpublished.
			// A claim whose answer is lost (the connection cut during its
			// COMMIT, as when the primary dies or is switched over) may
			// have taken rows all the same, PUBLISHING unseen until their
			// lease ends: the next claim gives them back first, in the same
			// round trip (giveBackClaims). So too the claims marked lately,
			// once a claim fails (databaseFailed).
			token := newClaimToken(r.cfg.ID)
			uncertain := r.uncertainClaims()
			var givenBack int64
			claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.DBTimeout)
			err = database.RunStatement(claimCtx, r.pool, func(ctx context.Context, db database.DBTX) (err error) {
				if givenBack = 0; len(uncertain) > 0 {
					if givenBack, err = giveBackClaims(ctx, db, uncertain); err != nil {
						return err
					}
				}
				rows, err = claimRows(ctx, db, token, r.cfg.BatchSize, r.cfg.Lease, scope)
				return err
			})
			cancel()
			if err == nil && len(rows) > 0 && r.cfg.Faults != nil {
				if err = r.cfg.Faults.AfterClaim(len(rows)); err != nil {
					rows = nil
				}
			}
			if err != nil {
				r.claimUncertain(token)
				r.databaseFailed()
			} else {
				if givenBack > 0 {
					r.log.WarnContext(ctx, "gave back the rows of claims whose answer or mark may be lost", slog.Int64("rows", givenBack), slog.Int("claims", len(uncertain)))
					r.rescan.Store(true) // the rows given back may lie before the floor
				}
				r.claimsSettled(len(uncertain))
			}
		}
		floor = claimFloor{}
		if err == nil && len(rows) == r.cfg.BatchSize {
			floor = claimFloor{createdAt: rows[len(rows)-1].CreatedAt, id: rows[len(rows)-1].ID}
		}
		if err != nil {
			s.pub.Release(size)
			if ctx.Err() != nil {
				return
			}
			dbFailures++
			// While the database fails over, a try a second at most: the
			// relay claims again within a second of the new primary
			// taking writes, however long the promotion took.
			delay := database.RetryDelay(dbFailures, err, 10*time.Second)
			r.log.WarnContext(ctx, "claiming outbox rows failed", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
			background.Sleep(ctx, delay)
			continue
		}
		dbFailures = 0
		s.pub.Release(size - int64(len(rows)))
		if len(rows) == 0 {
			select { // nothing due: wait for a NOTIFY or the poll tick
			case <-r.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		r.metrics.batchSize.Record(context.Background(), int64(len(rows)))
		r.rowsClaimed(due, rows)
		claimed <- rows // the publish step takes every batch, published or not
		if len(rows) < r.cfg.BatchSize {
			// The claim took every due row it could see: a row that
			// commits after it began sends a NOTIFY that wakes the loop
			// (one wake-up waits while the claim runs), so claiming again
			// at once would mostly find nothing. At low rates that empty
			// claim was most of the claims; only a full claim, a backlog,
			// claims again at once.
			select {
			case <-r.wake:
			case <-ctx.Done():
				return
			}
		}
	}
}

// publishLoop is step 2: it publishes each claimed batch on the channel, in
// order, and hands it to the confirm step. Once ctx has ended (shutdown, or
// the channel failed) it publishes nothing more: the batches still coming
// are passed on unpublished, to be handed back.
func (s *session) publishLoop(ctx context.Context, claimed <-chan []Row, published chan<- *batch, confirmDone <-chan struct{}) {
	defer close(published)
	r := s.relay
	for rows := range claimed {
		b := &batch{rows: rows, sent: make([]pipeline.Sent, 0, len(rows))}
		parents := make([]context.Context, len(rows))
		links := make([]trace.Link, len(rows))
		for i, row := range rows {
			parents[i] = messaging.Extract(context.Background(), propagation.MapCarrier(row.Headers))
			links[i] = trace.Link{SpanContext: trace.SpanContextFromContext(parents[i])}
		}
		_, b.batchSpan = r.tracer.Start(context.Background(), "publish batch", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(links...), trace.WithAttributes(semconv.MessagingSystemRabbitMQ, semconv.MessagingOperationTypeSend,
				semconv.MessagingBatchMessageCount(len(rows))))
		for i, row := range rows {
			if ctx.Err() != nil {
				break
			}
			sent, err := s.pub.Publish(ctx, parents[i], row)
			if err != nil {
				if ctx.Err() == nil {
					r.log.WarnContext(ctx, "publish failed; ending the session", slog.String("error", err.Error()))
				}
				s.pub.Stop(err)
				break
			}
			b.sent = append(b.sent, sent)
		}
		select {
		case published <- b:
		case <-confirmDone: // the confirm step stopped (a crash, in tests): the leases bring the rows back
			for range claimed {
			}
			return
		}
	}
}
