package outbox_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxtest"
	"github.com/yourorg/orders/internal/testenv"
)

// Behind PgBouncer in transaction mode a LISTEN hears nothing: the pooler
// lends the session to whichever transaction comes next, and drops the
// notifications it receives while lent to none. A relay whose pool goes
// through the pooler finds that out on its LISTEN connection, says so and
// polls: every message is published, within a poll interval. With a
// LISTEN URL past the pooler, a NOTIFY wakes it at once: each message is
// published well within the poll interval (5 s here; a relay that only
// polled would be that quick for all four with a chance of 1 in 625).
func TestRelayBehindPgBouncer(t *testing.T) {
	t.Parallel()
	for _, past := range []bool{false, true} {
		name := map[bool]string{false: "polls", true: "listens past the pooler"}[past]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := outboxtest.Setup(t, outboxtest.Poll)
			pooler := testenv.NewPgBouncer(t, b.DBURL)
			direct := b.DBURL
			b.DBURL = pooler.URL(b.DBURL) // the relays' pools
			logs := &lockedLog{}
			b.Logger = slog.New(slog.NewTextHandler(logs, nil))
			b.BindQueue("observer", "#")
			cfg := outboxtest.Config()
			cfg.PollInterval = 5 * time.Second
			if past {
				cfg.ListenURL = direct
			}
			relay := b.StartRelay(cfg, b.AMQPURL, nil)
			testenv.WaitFor(t, 10*time.Second, "the relay to connect", func() bool { return relay.Ready(b.Ctx) == nil })
			const warning = "leads through a connection pooler"
			if !past {
				testenv.WaitFor(t, 10*time.Second, "the relay to see the pooler", func() bool { return strings.Contains(logs.String(), warning) })
				start := time.Now()
				b.Enqueue(1, messaging.Cause{})
				b.Receive("observer", 1, 2*cfg.PollInterval, 0)
				t.Logf("published after %s, polling every %s", time.Since(start), cfg.PollInterval)
				return
			}
			time.Sleep(time.Second) // the LISTEN is in place
			for i := range 4 {
				start := time.Now()
				b.Enqueue(1, messaging.Cause{})
				b.Receive("observer", 1, 2*cfg.PollInterval, 0)
				took := time.Since(start)
				t.Logf("message %d published after %s", i, took)
				if took > time.Second {
					t.Errorf("message %d published after %s: no NOTIFY woke the relay", i, took)
				}
			}
			if strings.Contains(logs.String(), warning) {
				t.Error("the relay took its LISTEN URL past the pooler for one through it")
			}
		})
	}
}

type lockedLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
