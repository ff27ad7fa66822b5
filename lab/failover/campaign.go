package main

import (
	"context"
	cryptorand "crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/testenv"
	"github.com/yourorg/orders/internal/testenv/failover"
	"github.com/yourorg/orders/lab/sandbox"
	"github.com/yourorg/orders/migrations"
)

// outcome is what a campaign in one relay mode measured.
type outcome struct {
	mode    failover.Mode
	figures []failover.Figures
	result  *failover.Result // nil when the campaign stopped before its accounting
	errs    []string         // what failed, as the harness said it
}

// campaign runs order-api, an outbox-relay in mode and order-consumer
// on a Patroni cluster of its own, fails it over n times under rate
// orders/s, and accounts for every order and message. The binaries are
// in bin; the processes' logs go to logDir.
func campaign(ctx context.Context, r *runner, mode failover.Mode, n, rate int, bin, logDir string) *outcome {
	out := &outcome{mode: mode}
	// The cluster and the database.
	name := testenv.TestDatabaseName()
	c := testenv.NewPatroniCluster(r, mode.Cluster(name))
	c.CreateDatabase(r, name)
	dbURL := c.URL(name)
	migrate := exec.CommandContext(ctx, filepath.Join(bin, "order-api"), "migrate", "up")
	migrate.Env = slices.Concat(os.Environ(), []string{"DATABASE_URL=" + dbURL, "LOG_FORMAT=json"}, mode.MigrateEnv())
	if b, err := migrate.CombinedOutput(); err != nil {
		r.Fatalf("order-api migrate up: %v\n%s", err, b)
	}
	amqpURL := testenv.NewVhost(r)

	// The processes, each as its database role.
	procCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.Cleanup(stop)
	env := func(role string, more ...string) []string {
		return slices.Concat(failover.ProcessEnv, []string{"AMQP_URL=" + amqpURL, "DATABASE_URL=" + testenv.AsRole(dbURL, role)}, more)
	}
	start := func(process, ready string, env []string) {
		p, err := sandbox.Start(procCtx, process, filepath.Join(bin, process), ready, logDir, env...)
		if err != nil {
			r.Fatalf("start %s: %v", process, err)
		}
		r.Cleanup(func() {
			if err := p.Stop(); err != nil {
				r.Errorf("stop %s: %v", process, err)
			}
		})
	}
	consumerAddr, relayAddr, apiAddr := testenv.FreeAddr(r), testenv.FreeAddr(r), testenv.FreeAddr(r)
	start("order-consumer", "http://"+consumerAddr+"/readyz", env(migrations.RoleConsumer, "ADMIN_ADDR="+consumerAddr))
	tap := failover.StartTap(r, amqpURL)
	start("outbox-relay", "http://"+relayAddr+"/readyz",
		env(migrations.RoleRelay, slices.Concat([]string{"ADMIN_ADDR=" + relayAddr, "RELAY_ID=relay"}, mode.RelayEnv(dbURL))...))
	secret := cryptorand.Text() + cryptorand.Text()
	token, err := auth.Mint([]byte(secret), auth.Principal{Subject: "lab-failover", Role: auth.RoleOperator}, 24*time.Hour, "", "")
	if err != nil {
		r.Fatal(err)
	}
	start("order-api", "http://"+apiAddr+"/readyz", env(migrations.RoleAPI, "HTTP_ADDR="+apiAddr,
		"API_AUTH=jwt", "API_JWT_SECRET="+secret, "API_JWT_PUBLIC_KEYS=", "API_JWT_ISSUER=", "API_JWT_AUDIENCE="))

	// The failovers under load, then the accounting.
	ld := failover.StartLoad(r, failover.API{URL: "http://" + apiAddr, Token: token}, rate)
	events := failover.Campaign(r, c, mode, ld, n)
	orders := ld.Stop()
	out.result = failover.Account(r, dbURL, orders, tap.Stop())
	out.figures = failover.Measure(events, out.result, ld.Retries())
	return out
}

// runCampaign runs campaign on a runner of its own, in a goroutine of its
// own (a Fatal ends it), then its cleanups, and returns what it measured
// and what failed. An interruption (ctx) stops the wait: the cleanups
// stop the processes and the cluster.
func runCampaign(ctx context.Context, mode failover.Mode, n, rate int, bin, logDir string, logf func(string, ...any)) *outcome {
	r := newRunner(ctx, string(mode), logWriter(logf))
	var out *outcome
	done := make(chan struct{})
	go func() {
		defer close(done)
		out = campaign(ctx, r, mode, n, rate, bin, logDir)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		r.Errorf("interrupted: %v", ctx.Err())
		r.cleanup()
		return &outcome{mode: mode, errs: r.errors()}
	}
	r.cleanup()
	if out == nil { // a Fatal ended it
		out = &outcome{mode: mode}
	}
	out.errs = r.errors()
	return out
}

// logWriter is a writer whose every write is one line of logf.
type logWriter func(string, ...any)

func (w logWriter) Write(p []byte) (int, error) {
	w("%s", string(trimNewline(p)))
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	for len(p) > 0 && p[len(p)-1] == '\n' {
		p = p[:len(p)-1]
	}
	return p
}

// describe says what the error list means for the exit status.
func describe(outs []*outcome) error {
	failed := 0
	for _, o := range outs {
		failed += len(o.errs)
	}
	if failed > 0 {
		return fmt.Errorf("%d failures (above)", failed)
	}
	return nil
}
