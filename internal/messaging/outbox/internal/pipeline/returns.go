package pipeline

import (
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// returnBook takes every basic.return off the channel as soon as the client
// hands it over, and keeps it until the confirm of the same message is acted
// on. It has to: amqp091 drops a return that its listener does not take
// within five seconds, and the ack of that message then arrives with no
// return on record, so a message the broker dropped would be marked
// PUBLISHED. With the book, however long the relay's marks wait on the
// database, no return waits on the relay.
//
// RabbitMQ sends a message's basic.return before its basic.ack, and the
// client hands the return over before it resolves the confirm. So once a
// confirm is done, sync makes sure every return handed over before it is
// in the book.
type returnBook struct {
	in     <-chan amqp.Return
	syncCh chan chan struct{}
	done   chan struct{} // closed when in has closed and everything is booked

	mu   sync.Mutex
	byID map[string]amqp.Return
}

// newReturnBook starts taking the returns of ch. It stops when ch closes.
func newReturnBook(ch *amqp.Channel) *returnBook {
	b := &returnBook{
		in:     ch.NotifyReturn(make(chan amqp.Return, 1024)),
		syncCh: make(chan chan struct{}),
		done:   make(chan struct{}),
		byID:   map[string]amqp.Return{},
	}
	go b.run()
	return b
}

func (b *returnBook) run() {
	defer close(b.done)
	for {
		select {
		case ret, ok := <-b.in:
			if !ok {
				return
			}
			b.keep(ret)
		case reply := <-b.syncCh:
			b.drain()
			close(reply)
		}
	}
}

func (b *returnBook) keep(ret amqp.Return) {
	b.mu.Lock()
	b.byID[ret.MessageId] = ret
	b.mu.Unlock()
}

// drain books what the channel holds right now.
func (b *returnBook) drain() {
	for {
		select {
		case ret, ok := <-b.in:
			if !ok {
				return
			}
			b.keep(ret)
		default:
			return
		}
	}
}

// sync returns once every return the client handed over before the call
// is in the book.
func (b *returnBook) sync() {
	reply := make(chan struct{})
	select {
	case b.syncCh <- reply:
		<-reply
	case <-b.done: // the channel has closed: everything it handed over is booked
	}
}

// take removes and returns the return of message id, if there was one.
func (b *returnBook) take(id string) (amqp.Return, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ret, ok := b.byID[id]
	delete(b.byID, id)
	return ret, ok
}
