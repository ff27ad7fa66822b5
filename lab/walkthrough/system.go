package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging/inbox"
	"github.com/yourorg/orders/internal/messaging/inbox/inboxadmin"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/messaging/outbox/outboxadmin"
)

// system is the running order service, seen from outside: its HTTP API,
// the consumer's admin endpoints, the webhook receiver, and the database
// and broker it uses. The walkthrough only reads the database (a test
// would; an operator would), except where it says otherwise.
type system struct {
	cfg  Config
	http *http.Client
	db   *pgxpool.Pool
	amqp *amqp.Connection
	// where names the system the walkthrough talks to, for its first words.
	where string
	// Which of the web UIs the hints point to answer (make dev runs none).
	jaeger, rabbitUI, grafana, prometheus bool
}

// order is the API's view of an order (GET /v1/orders/{id}).
type order struct {
	ID      string `json:"order_id"`
	Status  string `json:"status"`
	History []struct {
		From      string  `json:"from_status"`
		To        string  `json:"to_status"`
		MessageID *string `json:"message_id"`
	} `json:"history"`
}

// path is the history as "SUBMITTED → FULFILLMENT_REQUESTED → ...".
func (o order) path() string {
	var p []string
	for _, h := range o.History {
		p = append(p, h.To)
	}
	return strings.Join(p, " → ")
}

// do sends an HTTP request with a JSON body (or none) and decodes a JSON
// answer into out (when not nil); it returns the status code.
func (s *system) do(ctx context.Context, method, url string, header http.Header, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if s.cfg.APIToken != "" && strings.HasPrefix(url, s.cfg.APIURL+"/v1/") {
		req.Header.Set("Authorization", "Bearer "+s.cfg.APIToken)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %w", method, url, err)
		}
	}
	return resp.StatusCode, nil
}

// createOrder posts an order of one item with sku and returns it.
func (s *system) createOrder(ctx context.Context, sku, correlationID string) (order, error) {
	body := map[string]any{
		"customer_id": "walkthrough",
		"currency":    "EUR",
		"items":       []map[string]any{{"sku": sku, "quantity": 1, "unit_price_cents": 1999}},
	}
	var o order
	code, err := s.do(ctx, http.MethodPost, s.cfg.APIURL+"/v1/orders", http.Header{"X-Correlation-Id": {correlationID}}, body, &o)
	if err != nil {
		return o, err
	}
	if code != http.StatusCreated {
		return o, failf("POST /v1/orders answered %d, want 201", code)
	}
	return o, nil
}

// getOrder reads an order with its history.
func (s *system) getOrder(ctx context.Context, id string) (order, error) {
	var o order
	code, err := s.do(ctx, http.MethodGet, s.cfg.APIURL+"/v1/orders/"+id, nil, nil, &o)
	if err == nil && code != http.StatusOK {
		err = failf("GET /v1/orders/%s answered %d", id, code)
	}
	return o, err
}

// cancelOrder posts the cancel and returns the status code.
func (s *system) cancelOrder(ctx context.Context, id string) (int, error) {
	return s.do(ctx, http.MethodPost, s.cfg.APIURL+"/v1/orders/"+id+"/cancel", nil, nil, nil)
}

// waitStatus waits until the order has status.
func (s *system) waitStatus(ctx context.Context, id, status string) error {
	return waitUntil(ctx, s.cfg.Timeout, fmt.Sprintf("order %s to be %s", id, status), func(ctx context.Context) (bool, error) {
		var got string
		err := s.db.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1`, id).Scan(&got)
		return got == status, err
	})
}

// settled waits until every outbox row of the order is PUBLISHED and every
// message of the order that a consumer received is PROCESSED, and no new
// message appeared meanwhile: the order's flow has come to rest.
func (s *system) settled(ctx context.Context, id string, wantInbox int) error {
	return waitUntil(ctx, s.cfg.Timeout, "the messages of order "+id+" to be published and processed", func(ctx context.Context) (bool, error) {
		messages, rows, err := s.messages(ctx, id)
		if err != nil {
			return false, err
		}
		for _, m := range messages {
			if m.Status != "PUBLISHED" {
				return false, nil
			}
		}
		for _, r := range rows {
			if r.Status != inbox.StatusProcessed {
				return false, nil
			}
		}
		return len(rows) >= wantInbox, nil
	})
}

// messages reads the order's outbox rows and its consumers' inbox rows,
// through the outbox's and the inbox's read APIs (orderctl order shows the
// same).
func (s *system) messages(ctx context.Context, orderID string) ([]outboxadmin.Message, []inboxadmin.Row, error) {
	messages, err := outboxadmin.Aggregate(ctx, s.db, domain.AggregateOrder, orderID)
	if err != nil {
		return nil, nil, err
	}
	rows, err := inboxadmin.Aggregate(ctx, s.db, orderID)
	return messages, rows, err
}

// rows runs a query and returns every row as text, for the narrator's tables.
func (s *system) rows(ctx context.Context, query string, args ...any) ([][]string, error) {
	rs, err := s.db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out [][]string
	for rs.Next() {
		vals, err := rs.Values()
		if err != nil {
			return nil, err
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = text(v)
		}
		out = append(out, row)
	}
	return out, rs.Err()
}

// text renders a database value for a table.
func text(v any) string {
	switch v := v.(type) {
	case nil:
		return "∅"
	case time.Time:
		return v.UTC().Format("15:04:05.000000")
	case pgtype.Interval:
		return ms(time.Duration(v.Microseconds) * time.Microsecond)
	case [16]byte:
		return uuid.UUID(v).String()
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// outboxRow reads the order's message of messageType the way the relay
// publishes it.
func (s *system) outboxRow(ctx context.Context, orderID, messageType string) (outbox.Row, error) {
	messages, err := outboxadmin.Aggregate(ctx, s.db, domain.AggregateOrder, orderID)
	if err != nil {
		return outbox.Row{}, err
	}
	i := slices.IndexFunc(messages, func(m outboxadmin.Message) bool { return m.Type == messageType })
	if i < 0 {
		return outbox.Row{}, failf("order %s has no %s message", orderID, messageType)
	}
	row, err := outboxadmin.Get(ctx, s.db, messages[i].ID)
	if err != nil {
		return outbox.Row{}, err
	}
	if n := s.partitions(); n > 0 { // the relays put the partition on it
		row.Partition = outbox.PartitionOf(row.AggregateID, n)
	}
	return row, nil
}

// partitions is the system's MESSAGE_PARTITIONS as its queues say: the
// number of fulfillment's partition queues, orders.fulfillment.p0 on (0:
// none).
func (s *system) partitions() int {
	n := 0
	for ; n < outbox.MaxPartitions; n++ {
		q := (inbox.Topology{Consumer: "fulfillment", Partitions: n + 1}).WorkQueues()[n]
		if _, err := s.queueDepth(q); err != nil {
			break
		}
	}
	return n
}

// publish sends msg to the exchange, mandatory and under a publisher
// confirm, as the relay does: an unroutable or refused message is an error.
func (s *system) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	ch, err := s.amqp.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	select {
	case r := <-returns:
		return failf("the broker returned the message as unroutable (%s): is order-consumer running?", r.ReplyText)
	default:
	}
	if !acked {
		return failf("the broker refused the message (nack)")
	}
	return nil
}

// queueDepth is the number of ready messages in a queue.
func (s *system) queueDepth(name string) (int, error) {
	ch, err := s.amqp.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return q.Messages, err
}

// peek finds the message with messageID in a queue and returns it without
// taking it away: it gets messages without acknowledging them until it
// meets that one, then closes the channel, which puts them all back.
func (s *system) peek(name, messageID string) (amqp.Delivery, error) {
	ch, err := s.amqp.Channel()
	if err != nil {
		return amqp.Delivery{}, err
	}
	defer ch.Close()
	for range 10000 {
		d, ok, err := ch.Get(name, false)
		if err != nil {
			return amqp.Delivery{}, err
		}
		if !ok {
			break
		}
		if d.MessageId == messageID {
			return d, nil
		}
	}
	return amqp.Delivery{}, failf("message %s is not in %s", messageID, name)
}

// consumerMetric adds up the series of a consumer counter on the consumer's
// /metrics for one consumer_name ("" for all).
func (s *system) consumerMetric(ctx context.Context, name, consumer string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.ConsumerAdminURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if consumer != "" && !strings.Contains(line, `consumer_name="`+consumer+`"`) {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum, nil
}

// notification is one entry of the webhook receiver's GET /notifications.
type notification struct {
	OrderID  string `json:"order_id"`
	Kind     string `json:"kind"`
	Requests int    `json:"requests"`
}

// notifications lists what the webhook receiver recorded for an order;
// nil, nil when no receiver is configured.
func (s *system) notifications(ctx context.Context, orderID string) ([]notification, error) {
	if s.cfg.WebhookURL == "" {
		return nil, nil
	}
	var all []notification
	code, err := s.do(ctx, http.MethodGet, s.cfg.WebhookURL+"/notifications", nil, nil, &all)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, failf("GET %s/notifications answered %d", s.cfg.WebhookURL, code)
	}
	var out []notification
	for _, n := range all {
		if n.OrderID == orderID {
			out = append(out, n)
		}
	}
	return out, nil
}

// armCrash asks the consumer to exit after the commit of the next delivery
// of messageType, before its ack.
func (s *system) armCrash(ctx context.Context, messageType string) error {
	code, err := s.do(ctx, http.MethodPost, s.cfg.ConsumerAdminURL+"/faults/crash-after-commit", nil,
		map[string]string{"message_type": messageType}, nil)
	switch {
	case err != nil:
		return err
	case code == http.StatusNotFound || code == http.StatusMethodNotAllowed:
		return failf("the consumer has no fault endpoint: start order-consumer with CONSUMER_FAULTS_ENDPOINT=true (make dev and docker-compose.demo.yml do)")
	case code != http.StatusAccepted:
		return failf("POST /faults/crash-after-commit answered %d", code)
	}
	return nil
}

// ready reports whether url answers 200.
func (s *system) ready(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	code, err := s.do(ctx, http.MethodGet, url, nil, nil, nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("answered %d", code)
	}
	return nil
}

// envelope is the relay's AMQP message for an outbox row.
var envelope = outbox.Publishing
