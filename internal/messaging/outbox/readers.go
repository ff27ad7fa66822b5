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

// readerCheck is what the last look at the readers' queues found: by
// message type, those missing.
type readerCheck struct {
	missing map[string][]string
	// settling: by message type, the queues this look found and the one
	// before did not. A consumer declares its queue, then binds it: a look
	// between the two finds a queue that no message reaches yet, so a type
	// is published only once two looks in a row, a poll apart, have found
	// all its readers' queues.
	settling map[string][]string
	err      error // the look itself failed (the connection is going away)
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
	return fmt.Errorf("not publishing %s: declare the consumers' topology first (order-consumer declare)", strings.Join(parts, "; "))
}

// after sets c.settling from the look before it: the queues c found that
// before did not (all of them when before is the unchecked state, which
// misses every queue). The first look of a relay thus holds every type for
// one poll more.
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

// checkReaders looks (passively) for every queue of cfg.Readers on conn.
// A passive declare of a missing queue closes its channel, so each missing
// queue costs a channel; a check of queues that are all there is one
// channel and one round trip per queue.
func checkReaders(conn *amqp.Connection, readers map[string][]string) *readerCheck {
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
	for _, typ := range slices.Sorted(maps.Keys(readers)) {
		for _, queue := range readers[typ] {
			found, seen := exists[queue]
			if !seen {
				if ch == nil || ch.IsClosed() {
					var err error
					if ch, err = conn.Channel(); err != nil {
						c.err = fmt.Errorf("open a channel to look for reader queues: %w", err)
						return c
					}
				}
				_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
				var amqpErr *amqp.Error
				switch {
				case err == nil:
					found = true
				case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
					found = false
				default:
					c.err = fmt.Errorf("look for reader queue %s: %w", queue, err)
					return c
				}
				exists[queue] = found
			}
			if !found {
				c.missing[typ] = append(c.missing[typ], queue)
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
	c.after(r.readers.Load(), r.cfg.Readers)
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
