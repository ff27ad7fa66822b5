package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// crashAfterCommit is the walkthrough's fault (CONSUMER_FAULTS_ENDPOINT):
// armed by POST /faults/crash-after-commit {"message_type": "..."}, it
// makes the process exit right after the next delivery of that type
// commits, before its ack, as a crash in the worst place would. The broker
// then delivers the message again, and the inbox turns the redelivery into
// a duplicate. It fires once per arming. It is the consumers' inbox.Faults:
// the inbox calls AfterCommit between every commit and its ack.
type crashAfterCommit struct {
	armed atomic.Pointer[string] // the message type, while armed
	log   *slog.Logger
	exit  func(code int) // os.Exit; a stand-in in tests
}

// AfterCommit exits the process if the fault is armed for d's type.
func (f *crashAfterCommit) AfterCommit(ctx context.Context, d *inbox.Delivery) {
	if armed := f.armed.Load(); armed != nil && *armed == d.Type && f.armed.CompareAndSwap(armed, nil) {
		f.log.ErrorContext(ctx, "fault injection: exiting after the commit, before the ack")
		f.exit(3)
	}
}

// ServeHTTP arms the fault: POST {"message_type": "..."}.
func (f *crashAfterCommit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		MessageType string `json:"message_type"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body); err != nil || !domain.KnownMessageType(body.MessageType) {
		http.Error(w, `want {"message_type": "<a message type of this service>"}`, http.StatusBadRequest)
		return
	}
	f.armed.Store(&body.MessageType)
	f.log.WarnContext(r.Context(), "fault armed: the next delivery of this type exits after its commit, before its ack",
		slog.String("message_type", body.MessageType))
	w.WriteHeader(http.StatusAccepted)
}
