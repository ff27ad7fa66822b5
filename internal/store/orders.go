package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store/dbsqlc"
)

// HistoryEntry is one row of an order's state history.
type HistoryEntry struct {
	From          domain.Status // "" for the creation of the order
	To            domain.Status
	MessageID     *string // nil when an HTTP request caused it
	CorrelationID string
	// Reason says why, when the move alone does not: the warehouse's
	// answer to a REJECTED order ("out of stock: OOS-1"). "" otherwise.
	Reason    string
	CreatedAt time.Time
}

// CreateOrder inserts a new order, its items and the first row of its
// history. It returns the order as stored (with its timestamps).
func CreateOrder(ctx context.Context, db database.DBTX, o *domain.Order, cause domain.Cause) (*domain.Order, error) {
	items := o.Items()
	p := dbsqlc.CreateOrderParams{
		OrderID: o.ID(), CustomerID: o.CustomerID(), Currency: o.Currency(),
		Status: string(o.Status()), Version: int32(o.Version()), TotalCents: o.TotalCents(),
		MessageID: database.NilIfEmpty(cause.MessageID), CorrelationID: database.NilIfEmpty(cause.CorrelationID),
	}
	for i, it := range items {
		p.LineNos = append(p.LineNos, int32(i+1))
		p.Skus = append(p.Skus, it.SKU)
		p.Quantities = append(p.Quantities, int32(it.Quantity))
		p.UnitPricesCents = append(p.UnitPricesCents, it.UnitPriceCents)
	}
	row, err := queries.CreateOrder(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("insert order %s: %w", o.ID(), Translate(err))
	}
	return domain.OrderFromDatabase(o.ID(), o.CustomerID(), o.Currency(), o.Status(), o.Version(),
		items, row.CreatedAt, row.UpdatedAt), nil
}

// GetOrder reads an order and its items. A missing order is
// domain.ErrNotFound.
func GetOrder(ctx context.Context, db database.DBTX, id uuid.UUID) (*domain.Order, error) {
	row, err := queries.GetOrder(ctx, db, id)
	if err != nil {
		return nil, fmt.Errorf("get order %s: %w", id, Translate(err))
	}
	return withItems(ctx, db, row)
}

// OrderCustomer returns the customer_id of an order, or domain.ErrNotFound.
func OrderCustomer(ctx context.Context, db database.DBTX, id uuid.UUID) (string, error) {
	customerID, err := queries.GetOrderCustomer(ctx, db, id)
	if err != nil {
		return "", fmt.Errorf("get order %s: %w", id, Translate(err))
	}
	return customerID, nil
}

func withItems(ctx context.Context, db database.DBTX, row dbsqlc.Order) (*domain.Order, error) {
	orders, err := attachItems(ctx, db, []dbsqlc.Order{row})
	if err != nil {
		return nil, err
	}
	return orders[0], nil
}

// attachItems reads the items of all rows in one query.
func attachItems(ctx context.Context, db database.DBTX, rows []dbsqlc.Order) ([]*domain.Order, error) {
	ids := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		ids[i] = r.OrderID
	}
	itemRows, err := queries.ListOrderItems(ctx, db, ids)
	if err != nil {
		return nil, fmt.Errorf("list order items: %w", Translate(err))
	}
	items := make(map[uuid.UUID][]domain.Item, len(rows))
	for _, it := range itemRows {
		items[it.OrderID] = append(items[it.OrderID], domain.Item{
			SKU: it.Sku, Quantity: int(it.Quantity), UnitPriceCents: it.UnitPriceCents,
		})
	}
	orders := make([]*domain.Order, len(rows))
	for i, r := range rows {
		orders[i] = domain.OrderFromDatabase(r.OrderID, r.CustomerID, r.Currency, domain.Status(r.Status),
			int(r.Version), items[r.OrderID], r.CreatedAt, r.UpdatedAt)
	}
	return orders, nil
}

// Move is a transition that happened.
type Move struct {
	From, To  domain.Status
	Version   int
	CreatedAt time.Time // of the order
	UpdatedAt time.Time // the time of the move
}

// MoveOrder applies trigger t to order id in one statement: it locks the
// order, moves it only if its status is one t starts from (the guard, with
// version + 1), and records the move in the order's history with cause.
// It returns the move and the status the order had. A move that needs
// its reason recorded is MoveOrderBecause's.
//
// When the order does not move, the error wraps domain.ErrStaleTransition
// (the order is past t: a duplicate, a late message, a lost race) or
// domain.ErrInvalidTransition (t is not possible yet); a missing order is
// domain.ErrNotFound; cause.MessageID moving the same order twice is
// domain.ErrConflict.
func MoveOrder(ctx context.Context, db database.DBTX, id uuid.UUID, t domain.Trigger, cause domain.Cause) (Move, domain.Status, error) {
	return MoveOrderBecause(ctx, db, id, t, cause, "")
}

// MoveOrderBecause is MoveOrder that records, with the move and in the
// same statement, why the order made it (HistoryEntry.Reason): what a
// reader of the history could not tell from the trigger alone, such as
// the skus an order was rejected for. reason "" records none.
func MoveOrderBecause(ctx context.Context, db database.DBTX, id uuid.UUID, t domain.Trigger, cause domain.Cause, reason string) (Move, domain.Status, error) {
	to, from, err := domain.Target(t)
	if err != nil {
		return Move{}, "", err
	}
	if len(from) == 1 {
		return moveFrom(ctx, db, id, t, from[0], to, cause, reason)
	}
	froms := make([]string, len(from))
	for i, f := range from {
		froms[i] = string(f)
	}
	row, err := queries.MoveOrder(ctx, db, dbsqlc.MoveOrderParams{
		OrderID: id, ToStatus: string(to), FromStatuses: froms,
		MessageID: database.NilIfEmpty(cause.MessageID), CorrelationID: database.NilIfEmpty(cause.CorrelationID),
		Reason: database.NilIfEmpty(reason),
	})
	if err != nil {
		return Move{}, "", fmt.Errorf("move order %s on %s: %w", id, t, Translate(err))
	}
	current := domain.Status(row.CurrentStatus)
	if row.FromStatus == nil {
		_, err := domain.Next(current, t) // explains why it did not move
		return Move{}, current, fmt.Errorf("order %s: %w", id, err)
	}
	return Move{From: domain.Status(*row.FromStatus), To: to, Version: int(*row.Version), CreatedAt: *row.CreatedAt, UpdatedAt: *row.UpdatedAt}, current, nil
}

// moveFrom is MoveOrder for a trigger with one starting status: a guarded
// UPDATE (its row lock is the only one needed), and, only when it moved
// nothing, a read of the status to say why.
func moveFrom(ctx context.Context, db database.DBTX, id uuid.UUID, t domain.Trigger, from, to domain.Status, cause domain.Cause, reason string) (Move, domain.Status, error) {
	row, err := queries.MoveOrderFrom(ctx, db, dbsqlc.MoveOrderFromParams{
		OrderID: id, FromStatus: string(from), ToStatus: string(to),
		MessageID: database.NilIfEmpty(cause.MessageID), CorrelationID: database.NilIfEmpty(cause.CorrelationID),
		Reason: database.NilIfEmpty(reason),
	})
	if err == nil {
		return Move{From: from, To: to, Version: int(row.Version), CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt}, from, nil
	}
	if err = Translate(err); !errors.Is(err, domain.ErrNotFound) {
		return Move{}, "", fmt.Errorf("move order %s on %s: %w", id, t, err)
	}
	status, err := queries.GetOrderStatus(ctx, db, id)
	if err != nil {
		return Move{}, "", fmt.Errorf("order %s: %w", id, Translate(err))
	}
	current := domain.Status(status)
	_, err = domain.Next(current, t) // explains why it did not move
	return Move{}, current, fmt.Errorf("order %s: %w", id, err)
}

// TransitionRecorded reports whether message messageID already moved order
// id: how a consumer tells its own earlier effect from someone else's.
func TransitionRecorded(ctx context.Context, db database.DBTX, id uuid.UUID, messageID string) (bool, error) {
	ok, err := queries.TransitionExists(ctx, db, dbsqlc.TransitionExistsParams{OrderID: id, MessageID: &messageID})
	if err != nil {
		return false, fmt.Errorf("look up transition of order %s by message %s: %w", id, messageID, Translate(err))
	}
	return ok, nil
}

// History returns the state history of an order, oldest first.
func History(ctx context.Context, db database.DBTX, id uuid.UUID) ([]HistoryEntry, error) {
	rows, err := queries.ListTransitions(ctx, db, id)
	if err != nil {
		return nil, fmt.Errorf("history of order %s: %w", id, Translate(err))
	}
	history := make([]HistoryEntry, len(rows))
	for i, r := range rows {
		history[i] = HistoryEntry{
			From:          domain.Status(database.Deref(r.FromStatus)),
			To:            domain.Status(r.ToStatus),
			MessageID:     r.MessageID,
			CorrelationID: database.Deref(r.CorrelationID),
			Reason:        database.Deref(r.Reason),
			CreatedAt:     r.CreatedAt,
		}
	}
	return history, nil
}

// Cursor is a position in the newest-first list of orders: the last order
// of the previous page.
type Cursor struct {
	CreatedAt time.Time
	OrderID   uuid.UUID
}

// ListParams selects a page of orders.
type ListParams struct {
	Status     domain.Status // "" for every status
	CustomerID string        // "" for every customer
	After      *Cursor       // nil for the first page
	Limit      int
}

// ListOrders returns one page of orders, newest first, and the cursor of the
// next page (nil on the last page). Keyset pagination: however many orders
// are inserted meanwhile, walking the pages returns every order that existed
// when the walk began exactly once.
func ListOrders(ctx context.Context, db database.DBTX, p ListParams) ([]*domain.Order, *Cursor, error) {
	after := Cursor{CreatedAt: endOfTime, OrderID: maxUUID}
	if p.After != nil {
		after = *p.After
	}
	limit := int32(p.Limit) + 1 // one more tells whether a next page exists
	var (
		rows []dbsqlc.Order
		err  error
	)
	// One query per combination of filters, so that each has a plan that
	// fits it (a query with optional filters gets one generic plan).
	switch {
	case p.Status == "" && p.CustomerID == "":
		rows, err = queries.ListOrders(ctx, db, dbsqlc.ListOrdersParams{
			AfterCreatedAt: after.CreatedAt, AfterOrderID: after.OrderID, MaxRows: limit,
		})
	case p.CustomerID == "":
		rows, err = queries.ListOrdersByStatus(ctx, db, dbsqlc.ListOrdersByStatusParams{
			Status: string(p.Status), AfterCreatedAt: after.CreatedAt, AfterOrderID: after.OrderID, MaxRows: limit,
		})
	case p.Status == "":
		rows, err = queries.ListOrdersByCustomer(ctx, db, dbsqlc.ListOrdersByCustomerParams{
			CustomerID: p.CustomerID, AfterCreatedAt: after.CreatedAt, AfterOrderID: after.OrderID, MaxRows: limit,
		})
	default:
		rows, err = queries.ListOrdersByCustomerAndStatus(ctx, db, dbsqlc.ListOrdersByCustomerAndStatusParams{
			CustomerID: p.CustomerID, Status: string(p.Status),
			AfterCreatedAt: after.CreatedAt, AfterOrderID: after.OrderID, MaxRows: limit,
		})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list orders: %w", Translate(err))
	}
	var next *Cursor
	if len(rows) > p.Limit {
		rows = rows[:p.Limit]
		last := rows[len(rows)-1]
		next = &Cursor{CreatedAt: last.CreatedAt, OrderID: last.OrderID}
	}
	if len(rows) == 0 {
		return nil, nil, nil
	}
	orders, err := attachItems(ctx, db, rows)
	return orders, next, err
}

var (
	// endOfTime is later than any created_at: the cursor of the first page.
	endOfTime = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	maxUUID   = uuid.Max
)
