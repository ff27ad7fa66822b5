// Command webhook-receiver is a demo stand-in for the external system that
// receives customer notifications: the notification consumer of
// order-consumer POSTs each notification to NOTIFY_WEBHOOK_URL with an
// Idempotency-Key header, and this receiver shows what the other side of
// that contract has to do. It is used by docker compose and the walkthrough;
// it is not production code: the keys it has seen live in memory (a map
// under a mutex), grow without bound and are lost when it stops.
//
//	POST /notifications   record a notification, once per Idempotency-Key:
//	                      a key seen before answers 200 with
//	                      Idempotent-Replayed: true and records nothing;
//	                      no Idempotency-Key or a body that is not JSON: 400
//	GET  /notifications   the notifications recorded, oldest first (JSON)
//	GET  /healthz         200
//
// `webhook-receiver healthcheck` exits 0 when the receiver of WEBHOOK_ADDR
// answers /healthz with 200, else 1: docker compose's health check.
//
// Settings, from the environment:
//
//	WEBHOOK_ADDR   listen address (default ":8090")
//	FAIL_FIRST     answer 503 to the first N requests of each new key, to
//	               show the consumer retrying with the same key (default 0)
//	LOG_FORMAT     json or text, as for the other binaries (default json)
//	LOG_LEVEL      debug, info, warn or error (default info)
//
// Logs go to stdout. SIGINT or SIGTERM shuts it down gracefully.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/yourorg/orders/internal/app"
	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/telemetry"
)

const (
	service = "webhook-receiver"

	// headerIdempotencyKey names the request's key; the consumer sends the
	// notification's id, the same on every retry.
	headerIdempotencyKey = "Idempotency-Key"
	// headerReplayed marks the answer to a key seen before.
	headerReplayed = "Idempotent-Replayed"

	maxBodyBytes    = 1 << 20
	shutdownTimeout = 10 * time.Second
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args := os.Args[1:]; {
	case len(args) == 0:
		err = run(ctx, os.Getenv, os.Stdout)
	case len(args) == 1 && args[0] == "healthcheck":
		err = healthcheck(ctx, os.Getenv, os.Stdout)
	default:
		err = fmt.Errorf("usage: %s [healthcheck], not %q", service, strings.Join(args, " "))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", service, err)
		os.Exit(1)
	}
}

// run is the whole process: it serves until ctx is done, then shuts the
// server down and waits for the requests in flight.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	logCfg := config.Log{Level: getenv("LOG_LEVEL"), Format: getenv("LOG_FORMAT")}
	if logCfg.Level == "" {
		logCfg.Level = "info"
	}
	if logCfg.Format == "" {
		logCfg.Format = "json"
	}
	if err := logCfg.Validate(); err != nil {
		return err
	}
	addr := listenAddr(getenv)
	failFirst := 0
	if v := getenv("FAIL_FIRST"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("FAIL_FIRST=%q: want a whole number, 0 or more", v)
		}
		failFirst = n
	}
	logger := telemetry.NewLogger(service, logCfg, stdout)

	srv := &http.Server{
		Handler:           newServer(failFirst, logger),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	logger.InfoContext(ctx, "listening", slog.String("addr", ln.Addr().String()), slog.Int("fail_first", failFirst))

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.InfoContext(ctx, "stopped")
	return nil
}

// listenAddr is WEBHOOK_ADDR, else ":8090".
func listenAddr(getenv func(string) string) string {
	return cmp.Or(getenv("WEBHOOK_ADDR"), ":8090")
}

// healthcheck is the healthcheck sub-command, docker compose's health
// check: nil when the receiver on WEBHOOK_ADDR answers /healthz with 200.
func healthcheck(ctx context.Context, getenv func(string) string, out io.Writer) error {
	return app.Healthcheck(ctx, listenAddr(getenv), "/healthz", out)
}

// notification is the body the notification consumer POSTs.
type notification struct {
	NotificationID string `json:"notification_id"`
	OrderID        string `json:"order_id"`
	Kind           string `json:"kind"`
	MessageID      string `json:"message_id"`
}

// received is one recorded notification, as GET /notifications lists it.
type received struct {
	IdempotencyKey string    `json:"idempotency_key"`
	NotificationID string    `json:"notification_id"`
	OrderID        string    `json:"order_id"`
	Kind           string    `json:"kind"`
	MessageID      string    `json:"message_id"`
	ReceivedAt     time.Time `json:"received_at"`
	// Requests counts every request with this key: the ones refused by
	// FAIL_FIRST, the one recorded, and the replays after it.
	Requests int `json:"requests"`
}

// server holds what the receiver has seen, in memory.
type server struct {
	failFirst int
	log       *slog.Logger

	mu      sync.Mutex
	list    []received     // recorded notifications, oldest first
	seen    map[string]int // Idempotency-Key -> index in list
	refused map[string]int // Idempotency-Key -> 503s answered so far
}

// newServer returns the receiver's handler. failFirst is FAIL_FIRST: the
// number of 503s each new key gets before it is recorded.
func newServer(failFirst int, logger *slog.Logger) http.Handler {
	s := &server{
		failFirst: failFirst,
		log:       logger,
		seen:      make(map[string]int),
		refused:   make(map[string]int),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /notifications", s.receive)
	mux.HandleFunc("GET /notifications", s.listNotifications)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

func (s *server) receive(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := r.Header.Get(headerIdempotencyKey)
	if key == "" {
		s.log.WarnContext(ctx, "notification rejected: no Idempotency-Key")
		http.Error(w, "missing Idempotency-Key header", http.StatusBadRequest)
		return
	}
	var note notification
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		err = json.Unmarshal(body, &note)
	}
	if err != nil {
		s.log.WarnContext(ctx, "notification rejected: body is not JSON",
			slog.String("idempotency_key", key), slog.String("error", err.Error()))
		http.Error(w, "the body is not a JSON notification", http.StatusBadRequest)
		return
	}
	attrs := []any{slog.String("order_id", note.OrderID), slog.String("kind", note.Kind), slog.String("idempotency_key", key)}

	s.mu.Lock()
	if i, ok := s.seen[key]; ok {
		s.list[i].Requests++
		s.mu.Unlock()
		s.log.InfoContext(ctx, "duplicate notification ignored", attrs...)
		w.Header().Set(headerReplayed, "true")
		s.writeJSON(w, r, map[string]any{"idempotency_key": key, "replayed": true})
		return
	}
	if n := s.refused[key]; n < s.failFirst {
		s.refused[key] = n + 1
		s.mu.Unlock()
		s.log.WarnContext(ctx, "notification refused (FAIL_FIRST)", append(attrs, slog.Int("refusal", n+1), slog.Int("fail_first", s.failFirst))...)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "unavailable on purpose (FAIL_FIRST); retry with the same Idempotency-Key", http.StatusServiceUnavailable)
		return
	}
	s.seen[key] = len(s.list)
	s.list = append(s.list, received{
		IdempotencyKey: key,
		NotificationID: note.NotificationID,
		OrderID:        note.OrderID,
		Kind:           note.Kind,
		MessageID:      note.MessageID,
		ReceivedAt:     time.Now().UTC(),
		Requests:       s.refused[key] + 1,
	})
	delete(s.refused, key)
	s.mu.Unlock()

	s.log.InfoContext(ctx, "notification received", attrs...)
	s.writeJSON(w, r, map[string]any{"idempotency_key": key, "replayed": false})
}

func (s *server) listNotifications(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	list := append([]received{}, s.list...) // never null: an empty list is []
	s.mu.Unlock()
	s.writeJSON(w, r, list)
}

// writeJSON answers 200 with v.
func (s *server) writeJSON(w http.ResponseWriter, r *http.Request, v any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.log.WarnContext(r.Context(), "write response", slog.String("error", err.Error()))
	}
}
