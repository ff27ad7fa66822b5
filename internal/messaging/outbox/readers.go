package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reader is a queue that must receive every message of a type: a
// consumer's work queue, or one of its partition queues.
type Reader struct {
	Queue string
	// Bind binds Queue for messageType as its consumer's topology does,
	// on a channel of the relay's. A binding made again is the same
	// binding, so the relay binds at every look that finds Queue, before
	// it publishes the type: the route exists whenever the consumer's own
	// bind comes, however long after its declare. The relay declares no
	// queue: the consumer's declare, with its arguments, makes Queue. Nil:
	// the relay only checks that Queue exists, and a consumer that binds
	// polls after it declares misses what was published in between.
	Bind func(ch *amqp.Channel, messageType string) error
}

// readerQueues is readers by their queues' names; with unbound set, only
// those without a Bind.
func readerQueues(readers map[string][]Reader, unbound bool) map[string][]string {
	queues := map[string][]string{}
	for typ, rs := range readers {
		for _, rd := range rs {
			if !unbound || rd.Bind == nil {
				queues[typ] = append(queues[typ], rd.Queue)
			}
		}
	}
	return queues
}

// readerCheck is what the last look at the readers' queues found: by
// message type, those missing.
type readerCheck struct {
	missing map[string][]string
	// settling: by message type, the queues without a Reader.Bind this
	// look found and the one before did not. Their consumer declares its
	// queue, then binds it, and the relay cannot bind it for them: a type
	// is published only once two looks in a row, a poll apart, have found
	// all such queues, which leaves the consumer a poll to bind (and loses
	// messages for it when it binds later: give every reader a Bind).
	settling map[string][]string
	// unbound: the queues found that Reader.Bind could not bind, with why
	// (counted as missing too).
	unbound []string
	err     error // the look itself failed (the connection is going away)
	// unchecked: nobody has looked yet, so every type with readers is held.
	unchecked bool
}

// uncheckedReaders is the state before the first look: every type held.
func uncheckedReaders(readers map[string][]string) *readerCheck {
	return &readerCheck{missing: maps.Clone(readers), unchecked: true}
}

// held lists the message types not to publish: one of their readers'
// queues is missing, or was missing at the look before.
func (c *readerCheck) held() []string {
	if c == nil {
		return nil
	}
	types := slices.Collect(maps.Keys(c.missing))
	for typ := range c.settling {
		if _, ok := c.missing[typ]; !ok {
			types = append(types, typ)
		}
	}
	slices.Sort(types)
	return types
}

// notReady says which types are held and why, or nil.
func (c *readerCheck) notReady() error {
	if c == nil || len(c.missing)+len(c.settling) == 0 {
		return nil
	}
	if c.unchecked {
		return errors.New("the readers' queues have not been looked for yet")
	}
	var parts []string
	for _, typ := range c.held() {
		if q := c.missing[typ]; len(q) > 0 {
			parts = append(parts, fmt.Sprintf("%s (reader queues missing: %s)", typ, strings.Join(q, ", ")))
		} else {
			parts = append(parts, fmt.Sprintf("%s (reader queues just declared, to be found again at the next poll: %s)",
				typ, strings.Join(c.settling[typ], ", ")))
		}
	}
	for _, u := range c.unbound {
		parts = append(parts, "could not bind "+u)
	}
	return fmt.Errorf("not publishing %s: declare the consumers' topology first (order-consumer declare)", strings.Join(parts, "; "))
}

// after sets c.settling from the look before it: the queues of readers
// (those without a Reader.Bind) c found that before did not (all of them
// when before is the unchecked state, which misses every queue). The
// first look of a relay thus holds their types for one poll more.
func (c *readerCheck) after(before *readerCheck, readers map[string][]string) {
	c.settling = map[string][]string{}
	for typ, queues := range readers {
		for _, q := range queues {
			if slices.Contains(c.missing[typ], q) {
				continue
			}
			if before == nil || slices.Contains(before.missing[typ], q) {
				c.settling[typ] = append(c.settling[typ], q)
			}
		}
	}
}

// checkReaders looks (passively) for every queue of readers on conn, and
// binds each one it finds that has a Reader.Bind. A passive declare of a
// missing queue, or a refused bind, closes its channel, so each costs a
// channel; a check of queues that are all there is one channel and one
// round trip per queue and binding.
func checkReaders(conn *amqp.Connection, readers map[string][]Reader) *readerCheck {
	c := &readerCheck{missing: map[string][]string{}}
	if len(readers) == 0 {
		return c
	}
	exists := map[string]bool{}
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	// refused tells a channel error the broker answered (the channel is
	// closed; the look goes on) from a failed look.
	refused := func(err error, code int) bool {
		var amqpErr *amqp.Error
		return errors.As(err, &amqpErr) && (code == 0 || amqpErr.Code == code)
	}
	for _, typ := range slices.Sorted(maps.Keys(readers)) {
		for _, rd := range readers[typ] {
			if ch == nil || ch.IsClosed() {
				var err error
				if ch, err = conn.Channel(); err != nil {
					c.err = fmt.Errorf("open a channel to look for reader queues: %w", err)
					return c
				}
			}
			found, seen := exists[rd.Queue]
			if !seen {
				_, err := ch.QueueDeclarePassive(rd.Queue, true, false, false, false, nil)
				switch {
				case err == nil:
					found = true
				case refused(err, amqp.NotFound):
					found = false
				default:
					c.err = fmt.Errorf("look for reader queue %s: %w", rd.Queue, err)
					return c
				}
				exists[rd.Queue] = found
			}
			if found && rd.Bind != nil {
				if err := rd.Bind(ch, typ); err != nil {
					if !refused(err, 0) || conn.IsClosed() {
						c.err = fmt.Errorf("bind reader queue %s for %s: %w", rd.Queue, typ, err)
						return c
					}
					c.unbound = append(c.unbound, fmt.Sprintf("%s for %s: %v", rd.Queue, typ, err))
					found = false
				}
			}
			if !found {
				c.missing[typ] = append(c.missing[typ], rd.Queue)
			}
		}
	}
	return c
}

// lookForReaders checks the readers' queues on conn, keeps what it found
// for the claim loop and Ready, and logs a change.
func (r *Relay) lookForReaders(ctx context.Context, conn *amqp.Connection) {
	if len(r.cfg.Readers) == 0 {
		return
	}
	c := checkReaders(conn, r.cfg.Readers)
	if c.err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "looking for the readers' queues failed; keeping what was found before", slog.String("error", c.err.Error()))
		}
		return
	}
	c.after(r.readers.Load(), readerQueues(r.cfg.Readers, true))
	before := r.readers.Swap(c)
	was, now := errString(before.notReady()), errString(c.notReady())
	switch {
	case was == now:
	case len(c.missing) > 0:
		r.log.ErrorContext(ctx, "holding messages back: a reader's queue is missing", slog.String("reason", now))
	case now != "": // queues found once: published after the next look
	default:
		r.log.InfoContext(ctx, "every reader's queue is there: publishing every type")
		r.signal()
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
