package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/yourorg/orders/lab/sandbox"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed>>1|1)) }

// fault is one kind of failure the chaos loop causes, and heals.
type fault struct {
	name string
	do   func(ctx context.Context, s *system, rng *rand.Rand) error
}

var faults = []fault{
	{"kill the consumer", func(_ context.Context, s *system, _ *rand.Rand) error { return s.kill("order-consumer") }},
	{"kill a relay", func(_ context.Context, s *system, rng *rand.Rand) error { return s.kill(relays[rng.IntN(len(relays))]) }},
	{"cut PostgreSQL", func(ctx context.Context, s *system, rng *rand.Rand) error {
		return cut(ctx, s.pgProxy.Stop, s.pgProxy.Start, outage(rng))
	}},
	{"cut RabbitMQ", func(ctx context.Context, s *system, rng *rand.Rand) error {
		return cut(ctx, s.mqProxy.Stop, s.mqProxy.Start, outage(rng))
	}},
	{"terminate the database sessions", func(ctx context.Context, s *system, _ *rand.Rand) error {
		return s.admin(ctx, "")
	}},
	{"read-only database", func(ctx context.Context, s *system, rng *rand.Rand) error {
		if err := s.admin(ctx, "ALTER DATABASE %s SET default_transaction_read_only = on"); err != nil {
			return err
		}
		sleep(ctx, 5*time.Second+time.Duration(rng.Int64N(int64(10*time.Second))))
		// Healed even when the run is interrupted meanwhile.
		return s.admin(context.WithoutCancel(ctx), "ALTER DATABASE %s SET default_transaction_read_only = off")
	}},
}

// outage is how long a cut connection stays cut: 2 to 8 seconds.
func outage(rng *rand.Rand) time.Duration {
	return 2*time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
}

// cut closes every connection through a proxy and refuses new ones for d.
func cut(ctx context.Context, stop func(), start func() error, d time.Duration) error {
	stop()
	sleep(ctx, d)
	return start()
}

// admin runs statement (a format with the database's name for %s; none:
// only the termination) on the server, and then terminates every session
// of the run's database, so that each one reconnects and picks the
// setting up.
func (s *system) admin(ctx context.Context, statement string) error {
	adminURL, err := sandbox.WithPath(s.serverURL, "postgres")
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if statement != "" {
		if _, err := conn.Exec(ctx, fmt.Sprintf(statement, pgx.Identifier{s.dbName}.Sanitize())); err != nil {
			return err
		}
	}
	_, err = conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", s.dbName)
	return err
}

// chaos causes a random fault after a random pause, again and again, until
// ctx ends, and counts the faults by kind. A fault that fails to heal (a
// process that does not come back) is logged and tried again next time.
func chaos(ctx context.Context, s *system, rng *rand.Rand, minPause, maxPause time.Duration, logf func(string, ...any)) map[string]int {
	done := map[string]int{}
	for {
		pause := minPause + time.Duration(rng.Int64N(int64(maxPause-minPause)+1))
		if !sleep(ctx, pause) {
			return done
		}
		f := faults[rng.IntN(len(faults))]
		start := time.Now()
		err := f.do(ctx, s, rng)
		if err != nil {
			logf("chaos: %s: %v", f.name, err)
			s.heal()
			continue
		}
		done[f.name]++
		logf("chaos: %s (healed after %s)", f.name, time.Since(start).Round(100*time.Millisecond))
	}
}

// heal undoes whatever a fault may have left behind: the proxies open, the
// database writable, every process running.
func (s *system) heal() {
	_ = s.pgProxy.Start() // an error: it is running
	_ = s.mqProxy.Start()
	_ = s.admin(context.WithoutCancel(s.ctx), "ALTER DATABASE %s SET default_transaction_read_only = off")
	for _, name := range killable {
		s.mu.Lock()
		_, running := s.procs[name]
		s.mu.Unlock()
		if !running && s.ctx.Err() == nil {
			if err := s.start(name); err != nil {
				s.logf("heal: start %s: %v", name, err)
			}
		}
	}
}

// sleep waits d or until ctx ends, and says whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// tally formats counts as "a 3, b 1", or "none".
func tally(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
