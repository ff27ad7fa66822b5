package app

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// AdminHandler serves the operational endpoints of the background
// processes (outbox-relay, order-consumer) on ADMIN_ADDR:
//
//	GET /healthz  200 while the process runs
//	GET /readyz   200 when ready says so, else 503 with the reason
//	GET /metrics  the Prometheus metrics
//
// It returns the mux, for a process to add routes of its own.
func AdminHandler(ready func(context.Context) error, metrics http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready", "reason": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	mux.Handle("GET /metrics", metrics)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
