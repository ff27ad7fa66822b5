// Package notification records one customer notification per (order,
// kind) for order.submitted, .cancelled, .fulfilled and .rejected, and
// delivers it to an HTTP webhook with an Idempotency-Key: the example of an
// external side effect that a database inbox alone cannot make
// exactly-once. The delivery is done in two steps (inbox.External): the
// intent commits with the inbox row, the call happens outside any
// transaction, the result commits after.
package notification

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.32.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/inbox"
)

// Config configures the notification webhook.
type Config struct {
	// URL receives each notification as a JSON POST; empty turns
	// delivery off (notifications are recorded as SKIPPED).
	URL string
	// Timeout bounds one webhook call. Default 5s.
	Timeout time.Duration
	// Client makes the calls. Default: an http.Client with Timeout that
	// follows no redirect (a 3xx is a refusal: following it would turn the
	// POST into a GET, or post the notification somewhere else).
	Client *http.Client
	// TracerProvider traces the calls, each a client span of the
	// processing trace whose traceparent the receiver gets; default: the
	// global one.
	TracerProvider trace.TracerProvider
}

// HeaderIdempotencyKey is sent with every webhook call: the notification's
// id, the same on every retry, so that the receiver can tell a retry from a
// new notification.
const HeaderIdempotencyKey = "Idempotency-Key"

// Notification statuses.
const (
	notificationPending = "PENDING"
	notificationSent    = "SENT"
	notificationSkipped = "SKIPPED"
	notificationFailed  = "FAILED"
)

// WebhookBody is what the webhook receives. It names the order and the
// notification, and carries no personal data.
type WebhookBody struct {
	NotificationID uuid.UUID `json:"notification_id"`
	OrderID        uuid.UUID `json:"order_id"`
	Kind           string    `json:"kind"`
	MessageID      string    `json:"message_id"`
}

// Name is the consumer's name: its consumer_name in the inbox and the
// name of its queues.
const Name = "notification"

// New returns the consumer. Every call of one notification carries the
// same Idempotency-Key.
func New(cfg Config) *inbox.Consumer {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{
			Timeout:       cfg.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	n := &notifier{cfg: cfg, where: config.URLOrigin(cfg.URL), tracer: messaging.Tracer(cfg.TracerProvider, "github.com/yourorg/orders/internal/consumer/notification")}
	c := inbox.NewConsumer(Name)
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderSubmittedV1) (inbox.Outcome, error) {
		return n.notify(ctx, tx, d, m.ID, "order_received")
	})
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderCancelledV1) (inbox.Outcome, error) {
		return n.notify(ctx, tx, d, m.ID, "order_cancelled")
	})
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderFulfilledV1) (inbox.Outcome, error) {
		return n.notify(ctx, tx, d, m.ID, "order_fulfilled")
	})
	inbox.Handle(c, func(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, m domain.OrderRejectedV1) (inbox.Outcome, error) {
		return n.notify(ctx, tx, d, m.ID, "order_rejected")
	})
	return c
}

type notifier struct {
	cfg    Config
	where  string // the webhook's URL without its secrets: config.URLOrigin
	tracer trace.Tracer
}

// notify records the notification of kind for order orderID, once, and
// delivers it: in two steps when a webhook is set, else it is SKIPPED.
func (n *notifier) notify(ctx context.Context, tx pgx.Tx, d *inbox.Delivery, orderID uuid.UUID, kind string) (inbox.Outcome, error) {
	note := notification{ID: uuid.Must(uuid.NewV7()), OrderID: orderID, Kind: kind, Status: notificationPending, MessageID: d.MessageID}
	if n.cfg.URL == "" {
		note.Status = notificationSkipped
	}
	created, err := createNotification(ctx, tx, note)
	if err != nil {
		return inbox.Outcome{}, err
	}
	if !created {
		existing, err := lockNotification(ctx, tx, note.OrderID, kind)
		if err != nil {
			return inbox.Outcome{}, err
		}
		if existing.Status == notificationSent || existing.Status == notificationSkipped {
			return inbox.Ignore(fmt.Sprintf("the %s notification exists already (%s)", kind, existing.Status)), nil
		}
		// PENDING: a retry; FAILED: a replay after the webhook refused it
		// for good (and someone fixed the cause). Deliver the same
		// notification again, with the same key.
		note = *existing
		note.Status = notificationPending
	}
	if note.Status == notificationSkipped {
		return inbox.Applied(), nil
	}
	body, err := json.Marshal(WebhookBody{NotificationID: note.ID, OrderID: note.OrderID, Kind: kind, MessageID: note.MessageID})
	if err != nil {
		return inbox.Outcome{}, err
	}
	return inbox.Outcome{External: &inbox.External{
		Call: func(ctx context.Context) error { return n.post(ctx, note.ID, body) },
		Record: func(ctx context.Context, tx pgx.Tx, callErr error) error {
			switch _, permanent := inbox.Classify(callErr); {
			case callErr == nil:
				return recordNotificationAttempt(ctx, tx, note.ID, notificationSent, "")
			case permanent:
				return recordNotificationAttempt(ctx, tx, note.ID, notificationFailed, callErr.Error())
			default:
				return recordNotificationAttempt(ctx, tx, note.ID, notificationPending, callErr.Error())
			}
		},
	}}, nil
}

// post calls the webhook. 2xx is delivered; 408, 429 and 5xx, a timeout or
// a network error are transient (the outcome of a timeout is unknown: the
// receiver may have it, which is what the Idempotency-Key is for); any
// other status is permanent.
//
// A webhook's URL often is its credential (a chat webhook's token in its
// path, a signature in its query), so nothing post returns or records
// holds more of it than config.URLOrigin leaves (its scheme and host): not the error (which becomes the
// notification's and the inbox row's last error, a log line, and the
// customer's order page), nor the client span (whose url.full is the
// redacted URL). The net/http client's own errors quote the whole URL, so
// they are rewritten here.
func (n *notifier) post(ctx context.Context, id uuid.UUID, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	ctx, span := n.tracer.Start(ctx, "POST", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodPost, semconv.URLFull(n.where)))
	defer span.End()
	err := n.call(ctx, id, body, span)
	if err != nil {
		code, _ := inbox.Classify(err)
		span.SetAttributes(semconv.ErrorTypeKey.String(code))
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

func (n *notifier) call(ctx context.Context, id uuid.UUID, body []byte, span trace.Span) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return inbox.Permanent("webhook_misconfigured", fmt.Errorf("POST %s: the URL cannot be requested", n.where))
	}
	span.SetAttributes(semconv.ServerAddress(req.URL.Hostname()))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, id.String())
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := n.cfg.Client.Do(req)
	if err != nil {
		return inbox.Retryable("webhook_unavailable", n.redact(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
		return inbox.Retryable("webhook_unavailable", fmt.Errorf("POST %s: webhook answered %s", n.where, resp.Status))
	default:
		return inbox.Permanent("webhook_rejected", fmt.Errorf("POST %s: webhook answered %s", n.where, resp.Status))
	}
}

// redactedError is an error of the HTTP client with the webhook's URL
// replaced by its redacted form; it unwraps to the client's own cause (a
// timeout, a refused connection), so that it is classified as before.
type redactedError struct {
	msg   string
	cause error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.cause }

// redact rewrites an error of n.cfg.Client: a *url.Error quotes the whole
// URL, and its cause may repeat parts of it, which are masked too.
func (n *notifier) redact(err error) error {
	cause := err
	var ue *url.Error
	if errors.As(err, &ue) {
		cause = ue.Err
	}
	msg := cause.Error()
	if u, perr := url.Parse(n.cfg.URL); perr == nil {
		for _, secret := range []string{n.cfg.URL, u.User.String(), u.RawQuery, u.EscapedPath(), u.Path, u.Fragment} {
			if len(secret) > 1 {
				msg = strings.ReplaceAll(msg, secret, "…")
			}
		}
	}
	return &redactedError{msg: "POST " + n.where + ": " + msg, cause: cause}
}
