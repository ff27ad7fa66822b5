package wal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/propagation"

	"github.com/yourorg/orders/internal/background"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/internal/pipeline"
	"github.com/yourorg/orders/internal/messaging/outbox/wal/dbsqlc"
)

// session is one replication connection's worth of streaming: the
// slot's changes from its confirmed position on, published on one confirm
// channel. Every message goes through four steps, in log order, each in a
// goroutine of its own, joined by channels (streamOnce):
//
//  1. receive  decode the log: a row per outbox INSERT, an end per COMMIT  receive
//  2. publish  each row, mandatory, confirms pipelined                     publishLoop
//  3. confirm  wait for the broker's answer to each row                    confirmLoop
//  4. write    the outcomes back in batches, then report the position      writeLoop
//
// The publish step keeps each aggregate's messages in the order they were
// written, as the polling relay's claim does: a row waits for the confirm
// of the row before it of its aggregate, and is handed to the sweep (held
// behind) when that one was not published (returned, nacked, held, or
// itself handed over), the sweep's claim then publishing them in order. So
// per-aggregate order holds across a refusal, and with
// Config.Partitions each row goes, stamped with its partition, to its
// partition's queues.
//
// The position reported to the slot is the end of the newest transaction
// all of whose rows, and all before them, went through step 4. Anything
// short of that (a confirm that never came, a lost channel, a crash) ends
// the session unreported, and the next one streams it again from the slot:
// a duplicate the inbox absorbs, never a loss.
type session struct {
	relay *Relay
	repl  *pgconn.PgConn
	pub   *pipeline.Publisher
	// backlog is the rows written before the slot, when the session made
	// it: published ahead of the stream (passBacklog).
	backlog []uuid.UUID
	// snapshot is the last snapshot the publish step looked at
	// (waitVisible); only that step reads or writes it.
	snapshot pgSnapshot
	// last is, by aggregate, the newest row the publish step has passed on
	// (order); only that step reads or writes the map.
	last map[string]*settle

	// The receive step's view of the writes: the transactions it has passed
	// on and those written back, and the LSN up to which everything is
	// written back.
	received atomic.Int64
	written  atomic.Int64
	done     atomic.Uint64 // pglogrepl.LSN
}

// item is one step of the log, in order: a row to publish, or the end of
// a transaction.
type item struct {
	pipeline.Sent        // the row, and its publish
	xid           uint32 // the row's transaction
	end           *txEnd
	held          bool // not published: a reader queue of its type is missing
	behind        bool // not published: an earlier row of its aggregate was not
	settle        *settle
}

// settle says, once done is closed, whether a row was published (confirmed
// by the broker): the confirm step decides, the publish step waits for it.
type settle struct {
	done      chan struct{}
	published bool // written before done is closed
}

func (s *settle) resolve(published bool) {
	s.published = published
	close(s.done)
}

// resolved reports whether the row's fate is known, and it was published.
func (s *settle) resolved() bool {
	select {
	case <-s.done:
		return s.published
	default:
		return false
	}
}

// txEnd is a committed transaction's end: its end LSN, the position to
// report once its rows are written back, and its commit time.
type txEnd struct {
	lsn        pglogrepl.LSN
	commitTime time.Time
}

// outcome is an item with what became of it.
type outcome struct {
	pipeline.Outcome
	end *txEnd
}

// streamOnce runs one session: it returns when ctx ends, the slot is
// another relay's (errStandby), or the stream or the channel fails. It
// says whether it streamed at all.
func (w *Relay) streamOnce(ctx context.Context) (streamed bool, err error) {
	repl, err := w.connectReplication(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = repl.Close(context.Background()) }()
	if w.stale.Load() {
		if err := w.dropStaleSlot(ctx, repl); err != nil {
			return false, err
		}
	}
	slot, err := w.ensureSlot(ctx, repl)
	if err != nil {
		return false, err
	}
	var backlog []uuid.UUID
	if slot != nil {
		backlog, err = w.rowsBeforeSlot(ctx, slot)
		w.slotCreated(ctx, slot, len(backlog), err)
		if err != nil {
			return false, err
		}
	}
	err = pglogrepl.StartReplication(ctx, repl, w.wal.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + w.wal.Publication + "'", "messages 'true'"},
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another relay streams the slot
		return false, errStandby
	}
	if err != nil {
		return false, fmt.Errorf("start replication from slot %s: %w", w.wal.Slot, err)
	}

	conn, pub, sessCtx, err := w.sweep.Pipeline().Connect(ctx, "outbox-relay "+w.cfg.ID+" (wal)")
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(time.Second)) }()
	stop := pub.Stop
	defer stop(nil)
	s := &session{relay: w, repl: repl, pub: pub, backlog: backlog}
	if slot != nil {
		s.advance(slot.start) // the slot's own position: report it while the backlog goes out
	}
	if s.last, err = w.handedOver(ctx); err != nil {
		return false, err
	}

	w.standby.Store(false)
	w.down.Store(nil)
	w.streaming.Store(true)
	defer w.streaming.Store(false)
	w.log.InfoContext(ctx, "streaming the outbox from the slot's confirmed position", slog.Int("backlog", len(backlog)))
	go w.heartbeat(sessCtx)

	// drainCtx bounds steps 3 and 4 after the session ends: for at most
	// ShutdownTimeout, the confirms of what was published are awaited and
	// written back.
	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopTimer := context.AfterFunc(sessCtx, func() { time.AfterFunc(w.cfg.ShutdownTimeout, cancelDrain) })
	defer stopTimer()

	items := make(chan item, 256)                   // 1 -> 2
	published := make(chan item, w.cfg.MaxInFlight) // 2 -> 3
	outcomes := make(chan outcome, w.cfg.MaxInFlight)
	writeDone := make(chan struct{})
	go s.publishLoop(sessCtx, items, published)
	go s.confirmLoop(drainCtx, published, outcomes)
	go func() {
		defer close(writeDone)
		if err := s.writeLoop(drainCtx, outcomes); err != nil {
			stop(err)
		}
	}()
	recvErr := s.receive(sessCtx, items)
	close(items)
	stop(recvErr)
	<-writeDone
	// Every step has stopped: the connection is this goroutine's again.
	_ = s.reportPosition(context.Background(), true) // final: an error here changes nothing
	if ctx.Err() != nil {
		return true, nil
	}
	err = causeOr(context.Cause(sessCtx), errors.New("stream ended"))
	if w.predatesPublication(ctx, err) {
		w.stale.Store(true)
	}
	return true, err
}

// handedOver starts a session's view of the aggregates (session.last):
// those with a row left to the sweep (by an earlier session's refusal, or
// FAILED) hold their later rows behind it, as in this session.
func (w *Relay) handedOver(ctx context.Context) (map[string]*settle, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT aggregate_id FROM message_outbox WHERE status = 'PENDING' AND last_error IS NOT NULL
		UNION SELECT aggregate_id FROM message_outbox WHERE status = 'PUBLISHING'
		UNION SELECT aggregate_id FROM message_outbox WHERE status = 'FAILED'`)
	if err != nil {
		return nil, fmt.Errorf("read the aggregates with rows left to the sweep: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the aggregates with rows left to the sweep: %w", err)
	}
	last := make(map[string]*settle, len(ids))
	for _, id := range ids {
		st := &settle{done: make(chan struct{})}
		st.resolve(false)
		last[id] = st
	}
	return last, nil
}

// causeOr returns err unless it is nil or a cancellation, else fallback.
func causeOr(err, fallback error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return fallback
	}
	return err
}

// replicationConfig is the replication connection's settings:
// Config.ReplicationURL's, or the pool's (the same server, database and
// role).
func (w *Relay) replicationConfig() (*pgconn.Config, error) {
	if w.wal.ReplicationURL == "" {
		return w.pool.Config().ConnConfig.Config.Copy(), nil
	}
	cfg, err := pgconn.ParseConfig(w.wal.ReplicationURL)
	if err != nil {
		return nil, fmt.Errorf("the replication connection's URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = w.pool.Config().ConnConfig.RuntimeParams["application_name"]
	return cfg, nil
}

// connectReplication opens a replication connection (replication=database).
func (w *Relay) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := w.replicationConfig()
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = cfg.RuntimeParams["application_name"] + " wal"
	// A read that times out (the status tick) must not cancel the stream.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication connection: %w", err)
	}
	return conn, nil
}

// receive is step 1: it decodes the stream and hands each outbox row and
// each transaction's end to the publish step, and reports the position at
// every StatusInterval (and whenever the server asks), until ctx ends or
// the stream fails.
func (s *session) receive(ctx context.Context, items chan<- item) error {
	w := s.relay
	relations := map[uint32]*pglogrepl.RelationMessage{}
	types := pgtype.NewMap()
	next := time.Now().Add(w.wal.StatusInterval)
	inTx := false
	var xid uint32
	if ok, err := s.passBacklog(ctx, items, &next); !ok {
		return err
	}
	for {
		if !time.Now().Before(next) {
			if err := s.reportPosition(ctx, false); err != nil {
				return err
			}
			next = time.Now().Add(w.wal.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, next)
		msg, err := s.repl.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case pgconn.Timeout(err):
			continue
		case err != nil:
			return fmt.Errorf("replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("keepalive: %w", err)
				}
				if !inTx && s.received.Load() == s.written.Load() {
					// Everything sent before this keepalive is written back:
					// the slot may move on to its end (WAL of other tables).
					s.advance(ka.ServerWALEnd)
				}
				if ka.ReplyRequested {
					next = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("xlog data: %w", err)
				}
				m, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return fmt.Errorf("decode the log at %s: %w", xld.WALStart, err)
				}
				var it *item
				switch m := m.(type) {
				case *pglogrepl.RelationMessage:
					relations[m.RelationID] = m
				case *pglogrepl.BeginMessage:
					inTx, xid = true, m.Xid
				case *pglogrepl.InsertMessage:
					row, err := decodeRow(relations[m.RelationID], m.Tuple, types)
					if err != nil {
						return fmt.Errorf("decode an outbox row at %s: %w", xld.WALStart, err)
					}
					it = &item{Sent: pipeline.Sent{Row: row}, xid: xid}
				case *pglogrepl.CommitMessage:
					inTx = false
					s.received.Add(1)
					it = &item{end: &txEnd{lsn: m.TransactionEndLSN, commitTime: m.CommitTime}}
				}
				if it != nil && !s.pass(ctx, items, *it, &next) {
					return nil
				}
			}
		}
	}
}

// passBacklog hands the rows written before a slot the session made, and
// still PENDING and not the sweep's, to the publish step ahead of the
// slot's first transaction: in write order, so an aggregate's rows
// committed while no slot existed go out before its rows the slot
// streams. False when ctx ends or the rows cannot be read (the session
// ends; the next one finds the slot, and the sweep takes them after
// SweepAfter).
func (s *session) passBacklog(ctx context.Context, items chan<- item, next *time.Time) (bool, error) {
	w := s.relay
	for ids := range slices.Chunk(s.backlog, w.cfg.BatchSize) {
		dbCtx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
		rows, err := queries.UnsweptRows(dbCtx, w.pool, ids)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, fmt.Errorf("read the rows written before replication slot %s: %w", w.wal.Slot, err)
		}
		for _, r := range rows {
			row := outbox.Row{ID: r.OutboxID, AggregateID: r.AggregateID, Type: r.MessageType, Version: int(r.MessageVersion),
				Exchange: r.ExchangeName, RoutingKey: r.RoutingKey, Payload: r.Payload, Headers: map[string]string{},
				Attempt: int(r.AttemptCount) + 1, CreatedAt: r.CreatedAt, Partition: -1}
			if json.Unmarshal(r.Headers, &row.Headers) != nil {
				row.Headers = map[string]string{} // as decodeRow does
			}
			if !s.pass(ctx, items, item{Sent: pipeline.Sent{Row: row}}, next) {
				return false, nil
			}
		}
	}
	s.backlog = nil
	return true, nil
}

// pass hands it to the publish step, reporting the position meanwhile: a
// publish step that waits (a full window, a missing reader queue) must not
// leave the server without a status until wal_sender_timeout ends the
// stream.
func (s *session) pass(ctx context.Context, items chan<- item, it item, next *time.Time) bool {
	for {
		select {
		case items <- it:
			return true
		case <-ctx.Done():
			return false
		case <-time.After(time.Until(*next)):
			if err := s.reportPosition(ctx, false); err != nil {
				s.pub.Stop(err)
				return false
			}
			*next = time.Now().Add(s.relay.wal.StatusInterval)
		}
	}
}

// advance moves the position to report up to lsn (never back).
func (s *session) advance(lsn pglogrepl.LSN) {
	for {
		cur := s.done.Load()
		if uint64(lsn) <= cur || s.done.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// reportPosition tells the server that everything up to the position is
// done: the slot may release the WAL before it, and a restart resumes
// after it.
func (s *session) reportPosition(ctx context.Context, final bool) error {
	lsn := pglogrepl.LSN(s.done.Load())
	if lsn == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.relay.cfg.DBTimeout)
	defer cancel()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn})
	if err != nil && !final {
		return fmt.Errorf("report the position %s: %w", lsn, err)
	}
	return nil
}

// decodeRow builds the Row of an outbox INSERT from the columns pgoutput
// sends (text format), by name.
func decodeRow(rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData, types *pgtype.Map) (outbox.Row, error) {
	if rel == nil || tuple == nil {
		return outbox.Row{}, errors.New("an insert of a relation the stream has not described")
	}
	if rel.RelationName != "message_outbox" {
		return outbox.Row{}, fmt.Errorf("an insert into %s.%s: the publication should hold message_outbox only", rel.Namespace, rel.RelationName)
	}
	row := outbox.Row{Attempt: 1, Partition: -1, Headers: map[string]string{}}
	for i, col := range tuple.Columns {
		if i >= len(rel.Columns) || col.DataType != pglogrepl.TupleDataTypeText {
			continue
		}
		text := string(col.Data)
		var err error
		switch rel.Columns[i].Name {
		case "outbox_id":
			row.ID, err = uuid.Parse(text)
		case "aggregate_id":
			row.AggregateID = text
		case "message_type":
			row.Type = text
		case "message_version":
			row.Version, err = strconv.Atoi(text)
		case "exchange_name":
			row.Exchange = text
		case "routing_key":
			row.RoutingKey = text
		case "payload":
			row.Payload = col.Data
		case "headers":
			if json.Unmarshal(col.Data, &row.Headers) != nil {
				row.Headers = map[string]string{} // as a claim does: publish without them
			}
		case "created_at":
			err = types.Scan(rel.Columns[i].DataType, pgtype.TextFormatCode, col.Data, &row.CreatedAt)
		}
		if err != nil {
			return outbox.Row{}, fmt.Errorf("column %s: %w", rel.Columns[i].Name, err)
		}
	}
	if row.ID == uuid.Nil {
		return outbox.Row{}, errors.New("no outbox_id")
	}
	return row, nil
}

// publishLoop is step 2: it publishes each row, in order, and passes every
// item on. While the broker blocks publishers it waits (and with it the
// stream). A row whose type has a reader queue missing (Config.Readers) is
// not published: it is written back for the sweep, which publishes it once
// every reader's queue is there, while the stream goes on with the other
// types. A row waits for the fate of the one before it of its aggregate,
// and is handed to the sweep too when that one was not published (order).
// Once ctx has ended it publishes nothing more: what is left is passed on
// unpublished.
func (s *session) publishLoop(ctx context.Context, items <-chan item, published chan<- item) {
	defer close(published)
	w := s.relay
	for it := range items {
		if it.end == nil {
			if w.cfg.Partitions > 0 {
				it.Row.Partition = outbox.PartitionOf(it.Row.AggregateID, w.cfg.Partitions)
			}
			after := s.order(ctx, &it)
			it.held = w.sweep.Holds(it.Row.Type)
			it.behind = !it.held && !after
		}
		if it.end == nil && !it.held && !it.behind && ctx.Err() == nil && s.waitVisible(ctx, it.xid) && s.pub.WaitToPublish(ctx, 1) {
			parent := messaging.Extract(context.Background(), propagation.MapCarrier(it.Row.Headers))
			sent, err := s.pub.Publish(ctx, parent, it.Row)
			if err != nil {
				s.pub.Release(1)
				s.pub.Stop(err)
			}
			it.Sent = sent
		}
		published <- it
	}
}

// order makes it the newest row of its aggregate, and reports whether it
// may be published: the row before it of its aggregate, if any, was
// published. It waits for that row's confirm; while ctx ends first it
// reports true, and the row goes on unpublished anyway.
func (s *session) order(ctx context.Context, it *item) bool {
	it.settle = &settle{done: make(chan struct{})}
	prev := s.last[it.Row.AggregateID]
	s.last[it.Row.AggregateID] = it.settle
	if len(s.last) > 4*s.relay.cfg.MaxInFlight+1024 {
		// Forget the aggregates whose newest row went out: nothing waits
		// on them. Those handed over stay, holding their later rows back.
		maps.DeleteFunc(s.last, func(_ string, st *settle) bool { return st.resolved() })
	}
	if prev == nil {
		return true
	}
	select {
	case <-prev.done:
		return prev.published
	case <-ctx.Done():
		return true
	}
}

// waitVisible waits until transaction xid is visible to every new
// snapshot; false when ctx ends first, or the database cannot say.
//
// PostgreSQL writes a commit to the log before it makes the transaction
// visible to other sessions, and the slot may stream it in between: a
// consumer handed the message at once could look for the order and not
// find it (a parked order_not_found, seen under load). The polling relay
// cannot meet this, since it reads rows through a snapshot. The check
// costs one small query (pg_current_snapshot, no table) when xid is newer
// than the last snapshot looked at, and nothing otherwise.
func (s *session) waitVisible(ctx context.Context, xid uint32) bool {
	if xid == 0 { // a row read from the table (passBacklog): visible
		return true
	}
	for try := 0; ; try++ {
		if s.snapshot.sees(xid) {
			return true
		}
		if try > 0 && !background.Sleep(ctx, time.Millisecond) {
			return false
		}
		snap, err := currentSnapshot(ctx, s.relay.pool)
		if err != nil {
			s.pub.Stop(fmt.Errorf("read a snapshot: %w", err))
			return false
		}
		s.snapshot = snap
	}
}

// pgSnapshot is a PostgreSQL snapshot (pg_current_snapshot): transactions
// below xmin have ended, those from xmax on had not begun, xip were
// running.
type pgSnapshot struct {
	xmin, xmax uint64
	xip        []uint64
}

// sees reports whether the snapshot sees transaction xid as ended (the
// stream only hands over committed transactions, so ended means visible).
// xid is the 32 bits the log carries; the snapshot's epoch completes it.
func (p pgSnapshot) sees(xid uint32) bool {
	// How far xid is from xmax, modulo 2^32 as PostgreSQL compares xids:
	// at or after xmax, the snapshot is older than the transaction.
	diff := int32(xid - uint32(p.xmax))
	if p.xmax == 0 || diff >= 0 {
		return false
	}
	full := p.xmax - uint64(-int64(diff))
	return full < p.xmin || !slices.Contains(p.xip, full)
}

// currentSnapshot reads a fresh snapshot.
func currentSnapshot(ctx context.Context, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (pgSnapshot, error) {
	var text string
	if err := pool.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&text); err != nil {
		return pgSnapshot{}, err
	}
	return parseSnapshot(text)
}

// parseSnapshot reads the text form xmin:xmax:xip,xip,...
func parseSnapshot(text string) (pgSnapshot, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return pgSnapshot{}, fmt.Errorf("snapshot %q", text)
	}
	var p pgSnapshot
	var err error
	if p.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
	}
	if p.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
	}
	for _, x := range strings.Split(parts[2], ",") {
		if x == "" {
			continue
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return pgSnapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
		}
		p.xip = append(p.xip, v)
	}
	return p, nil
}

// confirmLoop is step 3: it takes what the publish step passed on, as much
// as is there at once, waits for those confirms, and passes each item on
// with its outcome. A row without a confirm (the session ended, the
// channel failed, the confirm timed out) cannot be written back or passed:
// the session ends there, and what follows is dropped, to be streamed
// again.
func (s *session) confirmLoop(ctx context.Context, published <-chan item, outcomes chan<- outcome) {
	defer close(outcomes)
	broken := false
	for it := range published {
		chunk := withWaiting(it, published, s.relay.cfg.BatchSize)
		if broken {
			s.forget(chunk)
			continue
		}
		for _, o := range s.awaitConfirms(ctx, chunk) {
			if !broken && o.end == nil && !o.Settled() {
				broken = true
				s.pub.Stop(errors.New(o.Reason))
				s.relay.unsettled(o.Outcome)
			}
			if !broken {
				outcomes <- o
			}
		}
	}
}

// forget frees the window of items that will be streamed again, and ends
// their spans.
func (s *session) forget(chunk []item) {
	for _, it := range chunk {
		if it.settle != nil {
			it.settle.resolve(false)
		}
		s.pub.Forget(it.Sent)
	}
}

// awaitConfirms waits for the confirms of chunk (publisher.await) and
// says what became of each row; a transaction's end passes through.
func (s *session) awaitConfirms(ctx context.Context, chunk []item) []outcome {
	var rows []pipeline.Sent
	for _, it := range chunk {
		if it.end == nil && !it.held && !it.behind {
			rows = append(rows, it.Sent)
		}
	}
	outcomes := s.pub.Await(ctx, rows)
	out := make([]outcome, len(chunk))
	for i, it := range chunk {
		switch {
		case it.end != nil:
			out[i].end = it.end
		case it.held:
			out[i].Outcome = pipeline.Held(it.Row)
		case it.behind:
			out[i].Outcome = pipeline.HeldBehind(it.Row)
		default:
			out[i].Outcome, outcomes = outcomes[0], outcomes[1:]
			if it.Published() {
				s.pub.Release(1)
			}
		}
		if it.settle != nil {
			it.settle.resolve(out[i].Confirmed())
		}
	}
	return out
}

// writeLoop is step 4: it writes the outcomes back, as many as are there at
// once (up to BatchSize rows) in one statement, then moves the position to
// report to the end of the newest transaction written. A write that fails
// after its retries ends the session: the slot streams it again.
func (s *session) writeLoop(ctx context.Context, outcomes <-chan outcome) error {
	w := s.relay
	for o := range outcomes {
		batch := withWaiting(o, outcomes, w.cfg.BatchSize)
		if err := w.writeBack(ctx, batch); err != nil {
			// End the session first: the steps before this one stop only
			// when it ends, and the confirm step closes outcomes only then.
			s.pub.Stop(err)
			for range outcomes { // let the confirm step finish
			}
			return err
		}
		for _, o := range batch {
			if o.end != nil {
				s.written.Add(1)
				s.advance(o.end.lsn)
				w.lastEnd.Store(o.end)
			}
		}
	}
	return nil
}

// writeBack records a batch's outcomes as the polling relay does
// (the pipeline's Record) and writes them in one statement (markStreamed).
// Unlike the polling relay's marks, it does not wait out a database that
// is unavailable: the session ends at the first such failure, and the
// slot streams again what was not written back. A session that held on
// would hold the server too: a primary shutting down (a switchover) waits
// for its logical walsenders' clients to confirm the end of the log,
// which this session confirms only once written back.
func (w *Relay) writeBack(ctx context.Context, batch []outcome) error {
	var outcomes []pipeline.Outcome
	for _, o := range batch {
		if o.end == nil {
			outcomes = append(outcomes, o.Outcome)
		}
	}
	if len(outcomes) == 0 {
		return nil
	}
	ctx, giveUp := context.WithCancelCause(ctx)
	defer giveUp(nil)
	_, err := w.sweep.Pipeline().Record(ctx, outcomes, func(ctx context.Context, m pipeline.Marks) (pipeline.Marked, error) {
		var marked pipeline.Marked
		err := database.RunStatement(ctx, w.pool, func(ctx context.Context, db database.DBTX) (err error) {
			marked, err = markStreamed(ctx, db, m, w.cfg.MaxAttempts)
			return err
		})
		if database.IsUnavailable(err) {
			giveUp(err) // no retry
		}
		return marked, err
	})
	if err != nil {
		return fmt.Errorf("write back %d rows (they are streamed again): %w", len(outcomes), err)
	}
	return nil
}

// unsettled counts and logs the row whose publish the broker did not
// answer (no confirm in time, the connection lost): the session ends
// there, and the slot streams the row, and all after it, again.
func (w *Relay) unsettled(o pipeline.Outcome) {
	w.sweep.Pipeline().Unsettled(o)
	w.log.Warn("publish unconfirmed; streaming it again from the slot", slog.String("message_id", o.Row.ID.String()),
		slog.String("outcome", o.Result), slog.String("reason", o.Reason))
}

// heartbeat writes a logical message into the log every Heartbeat while
// the session lasts: a transaction of its own that the stream sees and
// finishes like any other, so that the slot's position, and the sweep's
// cutoff, move on while the outbox is quiet.
func (w *Relay) heartbeat(ctx context.Context) {
	tick := time.NewTicker(w.wal.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		dbCtx, cancel := context.WithTimeout(ctx, w.cfg.DBTimeout)
		_, err := w.pool.Exec(dbCtx, "SELECT pg_logical_emit_message(true, 'orders.outbox.heartbeat', '')")
		cancel()
		if err != nil && ctx.Err() == nil {
			w.log.WarnContext(ctx, "writing the heartbeat into the log failed", slog.String("error", err.Error()))
		}
	}
}

// withWaiting returns first and what else ch holds right now, up to n in
// all, without waiting for more: a step takes as much as is there at once.
func withWaiting[T any](first T, ch <-chan T, n int) []T {
	got := []T{first}
	for len(got) < n {
		select {
		case v, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, v)
		default:
			return got
		}
	}
	return got
}

// markStreamed writes the marks of rows the stream published in one
// statement (MarkStreamed): the stream claims nothing, so they are matched
// by key (id and created_at) alone, and only while still PENDING. Refused rows have the attempt
// counted; released ones (nacked, or held) do not.
func markStreamed(ctx context.Context, db database.DBTX, m pipeline.Marks, maxAttempts int) (pipeline.Marked, error) {
	p := dbsqlc.MarkStreamedParams{PublishedIds: []uuid.UUID{}, PublishedCreated: []time.Time{}, MaxAttempts: int32(maxAttempts)}
	p.Oldest, p.Newest = m.Span()
	for _, c := range m.Published {
		p.PublishedIds = append(p.PublishedIds, c.ID)
		p.PublishedCreated = append(p.PublishedCreated, c.CreatedAt)
	}
	for _, f := range m.Refused {
		p.RefusedIds = append(p.RefusedIds, f.ID)
		p.RefusedCreated = append(p.RefusedCreated, f.CreatedAt)
		p.RefusedErrors = append(p.RefusedErrors, f.Reason)
		p.RefusedRetryInSeconds = append(p.RefusedRetryInSeconds, f.RetryIn.Seconds())
	}
	for _, f := range m.Released {
		p.ReleasedIds = append(p.ReleasedIds, f.ID)
		p.ReleasedCreated = append(p.ReleasedCreated, f.CreatedAt)
		p.ReleasedErrors = append(p.ReleasedErrors, f.Reason)
		p.ReleasedRetryInSeconds = append(p.ReleasedRetryInSeconds, f.RetryIn.Seconds())
	}
	row, err := queries.MarkStreamed(ctx, db, p)
	if err != nil {
		return pipeline.Marked{}, fmt.Errorf("write back %d streamed outbox rows: %w",
			len(m.Published)+len(m.Refused)+len(m.Released), database.Translate(err))
	}
	return pipeline.Marked{Published: row.Published, Refused: row.Refused, Released: row.Released, Failed: row.FailedIds}, nil
}

var queries = dbsqlc.New()
