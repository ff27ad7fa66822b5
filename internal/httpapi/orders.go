package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/messaging"
	"github.com/yourorg/orders/internal/messaging/outbox"
	"github.com/yourorg/orders/internal/store"
)

// HeaderIdempotencyKey and HeaderIdempotentReplayed implement safe retries
// of POST /v1/orders.
const (
	HeaderIdempotencyKey     = "Idempotency-Key"
	HeaderIdempotentReplayed = "Idempotent-Replayed"
	maxIdempotencyKeyLen     = 255
)

// Producer is the app_id of the messages the API writes.
const Producer = "order-api"

// messages writes the API's messages to the outbox, in the transaction of
// the change they announce.
var messages = outbox.Writer{Producer: Producer, Exchange: domain.EventsExchange, AggregateType: domain.AggregateOrder}

// List page sizes.
const (
	defaultPageSize = 50
	maxPageSize     = 200
)

// createOrderRequest is the body of POST /v1/orders.
type createOrderRequest struct {
	CustomerID string            `json:"customer_id"`
	Currency   string            `json:"currency"`
	Items      []createOrderItem `json:"items"`
}

type createOrderItem struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
	// A pointer, to tell a missing price (a broken rule) from a free item.
	UnitPriceCents *int64 `json:"unit_price_cents"`
}

// toOrder validates the request into a new order; the error is a
// *domain.ValidationError with every broken rule.
func (r createOrderRequest) toOrder(id uuid.UUID) (*domain.Order, error) {
	var missing domain.ValidationError
	items := make([]domain.Item, len(r.Items))
	for i, it := range r.Items {
		if it.UnitPriceCents == nil {
			missing.Add(fmt.Sprintf("items[%d].unit_price_cents", i), "is required")
			it.UnitPriceCents = new(int64)
		}
		items[i] = domain.Item{SKU: it.SKU, Quantity: it.Quantity, UnitPriceCents: *it.UnitPriceCents}
	}
	order, err := domain.NewOrder(id, r.CustomerID, r.Currency, items)
	var invalid *domain.ValidationError
	if errors.As(err, &invalid) {
		missing.Fields = append(missing.Fields, invalid.Fields...)
	} else if err != nil {
		return nil, err
	}
	if err := missing.Err(); err != nil {
		return nil, err
	}
	return order, nil
}

// hash identifies the request for Idempotency-Key: the SHA-256 of its
// canonical JSON, so that spacing and key order do not matter.
func (r createOrderRequest) hash() string {
	canonical, _ := json.Marshal(r)
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// orderJSON is an order in a response.
type orderJSON struct {
	OrderID    uuid.UUID      `json:"order_id"`
	CustomerID string         `json:"customer_id"`
	Status     domain.Status  `json:"status"`
	Version    int            `json:"version"`
	Currency   string         `json:"currency"`
	TotalCents int64          `json:"total_cents"`
	Items      []itemJSON     `json:"items"`
	CreatedAt  time.Time      `json:"created_at"`
	UpdatedAt  time.Time      `json:"updated_at"`
	History    *[]historyJSON `json:"history,omitempty"` // in single-order responses
}

type itemJSON struct {
	SKU            string `json:"sku"`
	Quantity       int    `json:"quantity"`
	UnitPriceCents int64  `json:"unit_price_cents"`
}

type historyJSON struct {
	FromStatus    domain.Status `json:"from_status"`
	ToStatus      domain.Status `json:"to_status"`
	MessageID     *string       `json:"message_id"`
	CorrelationID string        `json:"correlation_id"`
	Reason        string        `json:"reason,omitempty"` // why, when the move alone does not say (a rejection)
	CreatedAt     time.Time     `json:"created_at"`
}

type orderListJSON struct {
	Orders     []orderJSON `json:"orders"`
	NextCursor *string     `json:"next_cursor"`
}

func newOrderJSON(o *domain.Order) orderJSON {
	items := make([]itemJSON, 0, len(o.Items()))
	for _, it := range o.Items() {
		items = append(items, itemJSON{SKU: it.SKU, Quantity: it.Quantity, UnitPriceCents: it.UnitPriceCents})
	}
	return orderJSON{
		OrderID: o.ID(), CustomerID: o.CustomerID(), Status: o.Status(), Version: o.Version(),
		Currency: o.Currency(), TotalCents: o.TotalCents(), Items: items,
		CreatedAt: o.CreatedAt().UTC(), UpdatedAt: o.UpdatedAt().UTC(),
	}
}

func newOrderDetailJSON(o *domain.Order, history []store.HistoryEntry) orderJSON {
	out := newOrderJSON(o)
	h := make([]historyJSON, len(history))
	for i, e := range history {
		h[i] = historyJSON{FromStatus: e.From, ToStatus: e.To, MessageID: e.MessageID,
			CorrelationID: e.CorrelationID, Reason: e.Reason, CreatedAt: e.CreatedAt.UTC()}
	}
	out.History = &h
	return out
}

// createOrder: POST /v1/orders. The order, its first history row and its
// order.submitted outbox row commit in one transaction, or nothing does.
func (s *Server) createOrder(c echo.Context) error {
	if err := onlyQueryParams(c); err != nil {
		return err
	}
	var req createOrderRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	var idem *store.IdempotentRequest
	if key, ok := c.Request().Header[HeaderIdempotencyKey]; ok {
		if len(key) != 1 || !printableASCII(key[0], maxIdempotencyKeyLen) {
			return newError(http.StatusBadRequest, "invalid_idempotency_key",
				"Idempotency-Key must be 1 to 255 printable ASCII characters.")
		}
		// The key is the caller's own, its role's and its subject's
		// (store.IdempotentRequest).
		p := caller(c.Request().Context())
		idem = &store.IdempotentRequest{CallerRole: string(p.Role), Caller: p.Subject,
			Method: http.MethodPost, Path: "/v1/orders", Key: key[0], Hash: req.hash()}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	order, err := req.toOrder(id)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if !caller(ctx).Owns(order.CustomerID()) {
		return s.forbid(c, reasonOtherCustomer, "A customer may only create its own orders: customer_id must be the token's sub.")
	}

	cid := correlationID(ctx)
	var resp, replay *store.StoredResponse
	err = database.Run(ctx, s.db, writeTx, func(ctx context.Context, tx pgx.Tx) error {
		resp, replay = nil, nil // it may run again
		if idem != nil {
			stored, err := store.ClaimIdempotencyKey(ctx, tx, *idem, s.cfg.IdempotencyKeyTTL)
			if err != nil || stored != nil {
				replay = stored
				return err
			}
		}
		cause := domain.Cause{CorrelationID: cid}
		created, err := store.CreateOrder(ctx, tx, order, cause)
		if err != nil {
			return err
		}
		// The outbox row and the stored response go in one round trip
		// (execBatch), each failure wrapped as its function wraps it.
		var later execBatch
		outboxRows := later.queue(func(err error) error {
			return fmt.Errorf("insert 1 outbox rows: %w", database.Translate(err)) // as outbox.Buffer.Flush
		})
		if _, err := messages.Write(ctx, outboxRows, messaging.Cause(cause), domain.SubmittedMessage(created)); err != nil {
			return err
		}
		// Its history is the one row CreateOrder wrote, at the same now():
		// no need to read it back.
		history := []store.HistoryEntry{{To: created.Status(), CorrelationID: cause.CorrelationID, CreatedAt: created.CreatedAt()}}
		body, err := json.Marshal(newOrderDetailJSON(created, history))
		if err != nil {
			return err
		}
		resp = &store.StoredResponse{Status: http.StatusCreated, Body: body, Location: "/v1/orders/" + created.ID().String()}
		if idem != nil {
			storedResponse := later.queue(func(err error) error {
				return fmt.Errorf("store idempotent response: %w", store.Translate(err)) // as store.CompleteIdempotencyKey
			})
			if err := store.CompleteIdempotencyKey(ctx, storedResponse, *idem, *resp); err != nil {
				return err
			}
		}
		return later.send(ctx, tx)
	})
	if err != nil {
		return err
	}
	if replay != nil {
		s.metrics.replays.Add(ctx, 1)
		c.Response().Header().Set(HeaderIdempotentReplayed, "true")
		resp = replay
	} else {
		s.metrics.created.Add(ctx, 1)
	}
	c.Response().Header().Set(echo.HeaderLocation, resp.Location)
	return c.JSONBlob(resp.Status, resp.Body)
}

// getOrder: GET /v1/orders/{order_id}, with its history. The order and its
// history are read in one snapshot, so they agree.
func (s *Server) getOrder(c echo.Context) error {
	if err := onlyQueryParams(c); err != nil {
		return err
	}
	id, err := orderIDParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	var out orderJSON
	err = database.Run(ctx, s.db, readTx, func(ctx context.Context, tx pgx.Tx) error {
		if err := hideOthers(ctx, tx, id); err != nil {
			return err
		}
		order, err := store.GetOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		history, err := store.History(ctx, tx, id)
		out = newOrderDetailJSON(order, history)
		return err
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// listOrders: GET /v1/orders?customer_id=C&status=S&limit=N&after=CURSOR,
// newest first.
func (s *Server) listOrders(c echo.Context) error {
	if err := onlyQueryParams(c, "customer_id", "status", "limit", "after"); err != nil {
		return err
	}
	params, err := listParams(c, defaultPageSize, false)
	if err != nil {
		return err
	}
	// The page and its items are read in one snapshot, so they agree.
	ctx := c.Request().Context()
	var (
		orders []*domain.Order
		next   *store.Cursor
	)
	err = database.Run(ctx, s.db, readTx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		orders, next, err = listVisible(ctx, tx, params)
		return err
	})
	if err != nil {
		return err
	}
	out := orderListJSON{Orders: make([]orderJSON, len(orders))}
	for i, o := range orders {
		out.Orders[i] = newOrderJSON(o)
	}
	if next != nil {
		cursor := encodeCursor(*next)
		out.NextCursor = &cursor
	}
	return c.JSON(http.StatusOK, out)
}

// listVisible is store.ListOrders of the orders the caller may see: a
// customer's own only. A customer's customer_id filter narrows its own
// orders, so naming another customer finds none. The filter is the query's,
// so the keyset pagination is ListOrders's own.
func listVisible(ctx context.Context, tx pgx.Tx, params store.ListParams) ([]*domain.Order, *store.Cursor, error) {
	if p := caller(ctx); !p.Operator() {
		if params.CustomerID != "" && params.CustomerID != p.Subject {
			return nil, nil, nil
		}
		params.CustomerID = p.Subject
	}
	return store.ListOrders(ctx, tx, params)
}

// listParams reads the filters and the page of a list of orders from the
// query (customer_id, status, limit, after), as GET /v1/orders and the
// /ui/ page take them; limit is the page size when the query has none.
//
// A parameter given empty is a 400 for the API: "customer_id=" is a filter
// gone wrong (an unset variable in a script), and taking it for no filter
// would list every customer's orders to an operator who meant one. The
// /ui/ page's filter form sends its blank fields empty, meaning any
// (emptyMeansAny).
func listParams(c echo.Context, limit int, emptyMeansAny bool) (store.ListParams, error) {
	params := store.ListParams{Limit: limit}
	query := c.QueryParams()
	value := func(name, rule string) (string, error) {
		v, given := query[name]
		if !given || len(v) == 0 || (v[0] == "" && emptyMeansAny) {
			return "", nil
		}
		if v[0] == "" {
			return "", newError(http.StatusBadRequest, "invalid_query",
				fmt.Sprintf("Query parameter %q is empty: give %s, or leave it out.", name, rule))
		}
		return v[0], nil
	}
	invalid := func(name, rule string) error {
		return newError(http.StatusBadRequest, "invalid_query", fmt.Sprintf("%s must be %s.", name, rule))
	}

	customerRule := fmt.Sprintf("1 to %d characters of UTF-8, without NUL", domain.MaxCustomerIDLen)
	v, err := value("customer_id", customerRule)
	if err != nil {
		return params, err
	}
	if v != "" {
		if !utf8.ValidString(v) || utf8.RuneCountInString(v) > domain.MaxCustomerIDLen || strings.ContainsRune(v, 0) {
			return params, invalid("customer_id", customerRule)
		}
		params.CustomerID = v
	}
	const statusRule = "one of SUBMITTED, FULFILLMENT_REQUESTED, FULFILLED, REJECTED, CANCELLED"
	if v, err = value("status", statusRule); err != nil {
		return params, err
	}
	if v != "" {
		status, err := domain.ParseStatus(v)
		if err != nil {
			return params, invalid("status", statusRule)
		}
		params.Status = status
	}
	limitRule := fmt.Sprintf("a whole number from 1 to %d", maxPageSize)
	if v, err = value("limit", limitRule); err != nil {
		return params, err
	}
	if v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			return params, invalid("limit", limitRule)
		}
		params.Limit = n
	}
	const afterRule = "a next_cursor from an earlier page"
	if v, err = value("after", afterRule); err != nil {
		return params, err
	}
	if v != "" {
		cursor, err := decodeCursor(v)
		if err != nil {
			return params, invalid("after", afterRule)
		}
		params.After = cursor
	}
	return params, nil
}

// cancelOrder: POST /v1/orders/{order_id}/cancel. The guarded transition
// to CANCELLED and the order.cancelled outbox row commit together. The
// transition locks the order, so of two concurrent cancels one moves it and
// the other finds it CANCELLED (a 200 that changes nothing).
func (s *Server) cancelOrder(c echo.Context) error {
	if err := onlyQueryParams(c); err != nil {
		return err
	}
	id, err := orderIDParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	cid := correlationID(ctx)
	var (
		out       orderJSON
		cancelled bool
	)
	err = database.Run(ctx, s.db, writeTx, func(ctx context.Context, tx pgx.Tx) error {
		cancelled = false // it may run again
		// A customer_id never changes: read before the move, it is still
		// the order's when the move locks it.
		if err := hideOthers(ctx, tx, id); err != nil {
			return err
		}
		cause := domain.Cause{CorrelationID: cid}
		_, current, err := store.MoveOrder(ctx, tx, id, domain.TriggerCancel, cause)
		switch {
		case err == nil:
			cancelled = true
			if _, err := messages.Write(ctx, tx, messaging.Cause(cause), domain.OrderCancelledV1{ID: id}); err != nil {
				return err
			}
		case errors.Is(err, domain.ErrStaleTransition) && current == domain.StatusCancelled:
			// Cancelled already: nothing to do.
		case errors.Is(err, domain.ErrStaleTransition):
			return newError(http.StatusConflict, "order_final",
				fmt.Sprintf("The order is %s and can no longer be cancelled.", current))
		default:
			return err
		}
		order, err := store.GetOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		history, err := store.History(ctx, tx, id)
		out = newOrderDetailJSON(order, history)
		return err
	})
	if err != nil {
		return err
	}
	if cancelled {
		s.metrics.cancelled.Add(ctx, 1)
	}
	return c.JSON(http.StatusOK, out)
}

// onlyQueryParams refuses a request with a query parameter not in allowed,
// or one given twice: a misspelt filter must not silently list everything.
func onlyQueryParams(c echo.Context, allowed ...string) error {
	query := c.QueryParams()
	for _, name := range slices.Sorted(maps.Keys(query)) { // the same answer every time
		values := query[name]
		if !slices.Contains(allowed, name) {
			detail := fmt.Sprintf("Unknown query parameter %q.", name)
			if len(allowed) == 0 {
				detail = fmt.Sprintf("Unknown query parameter %q: this endpoint takes none.", name)
			}
			return newError(http.StatusBadRequest, "invalid_query", detail)
		}
		if len(values) > 1 {
			return newError(http.StatusBadRequest, "invalid_query", fmt.Sprintf("Query parameter %q is given more than once.", name))
		}
	}
	return nil
}

func orderIDParam(c echo.Context) (uuid.UUID, error) {
	id, err := uuid.Parse(c.Param("order_id"))
	if err != nil {
		return uuid.Nil, newError(http.StatusNotFound, "not_found", "No order has this id.")
	}
	return id, nil
}

// A cursor is opaque to clients: base64url of "created_at|order_id".
func encodeCursor(c store.Cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + c.OrderID.String()))
}

func decodeCursor(s string) (*store.Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	ts, id, ok := strings.Cut(string(raw), "|")
	if !ok {
		return nil, errors.New("cursor has no separator")
	}
	createdAt, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return nil, err
	}
	orderID, err := uuid.Parse(id)
	if err != nil {
		return nil, err
	}
	return &store.Cursor{CreatedAt: createdAt, OrderID: orderID}, nil
}
