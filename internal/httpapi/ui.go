package httpapi

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/yourorg/orders/internal/auth"
	"github.com/yourorg/orders/internal/database"
	"github.com/yourorg/orders/internal/domain"
	"github.com/yourorg/orders/internal/store"
	"github.com/yourorg/orders/internal/timeline"
)

// The order timeline pages under /ui/: server-rendered HTML for people,
// with html/template (which escapes every value) and no JavaScript. They
// only read, each page in one read-only transaction, and show a caller
// what the API would: a customer its own orders (authn.go). A browser
// signs in at /ui/login, which keeps its token in a cookie.

//go:embed ui/*.html
var uiFiles embed.FS

// uiPageSize is the number of orders on a page of /ui/.
const uiPageSize = 50

// uiPages holds one template per page, each with the shared layout.
var uiPages = parsePages("orders.html", "order.html", "error.html", "login.html")

func parsePages(names ...string) map[string]*template.Template {
	funcs := template.FuncMap{
		"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
		// A span of the order's life, to the millisecond: 1.234s, 850ms.
		"duration": func(d time.Duration) string { return d.Round(time.Millisecond).String() },
		"money": func(cents int64, currency string) string {
			sign := ""
			if cents < 0 {
				sign, cents = "-", -cents
			}
			return fmt.Sprintf("%s%d.%02d %s", sign, cents/100, cents%100, currency)
		},
	}
	layout := template.Must(template.New("layout").Funcs(funcs).ParseFS(uiFiles, "ui/layout.html"))
	pages := map[string]*template.Template{}
	for _, name := range names {
		pages[name] = template.Must(template.Must(layout.Clone()).ParseFS(uiFiles, "ui/"+name))
	}
	return pages
}

// uiSecurityPolicy lets a page load nothing but its own inline styles:
// no script runs, whatever a value in it holds.
const uiSecurityPolicy = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// renderPage writes page with data as the response, or returns the error
// of the template, before anything is written.
func renderPage(c echo.Context, status int, page string, data any) error {
	var buf bytes.Buffer
	if err := uiPages[page].ExecuteTemplate(&buf, "layout", data); err != nil {
		return fmt.Errorf("render %s: %w", page, err)
	}
	h := c.Response().Header()
	h.Set("Content-Security-Policy", uiSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	return c.HTMLBlob(status, buf.Bytes())
}

// isPage reports whether a request is for the HTML pages, whose errors are
// pages too.
func isPage(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/ui/") }

// renderErrorPage writes the problem p as an HTML page.
func renderErrorPage(c echo.Context, p Problem) error {
	return renderPage(c, p.Status, "error.html", p)
}

type ordersPage struct {
	Caller     auth.Principal
	Statuses   []domain.Status
	Status     domain.Status
	CustomerID string
	Orders     []*domain.Order
	Next       string // the link to the next page; "" on the last
}

// uiOrders: GET /ui/, the recent orders, with the filters and the keyset
// pagination of GET /v1/orders.
func (s *Server) uiOrders(c echo.Context) error {
	if err := onlyQueryParams(c, "customer_id", "status", "after"); err != nil {
		return err
	}
	params, err := listParams(c, uiPageSize, true) // the filter form sends its blank fields
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	page := ordersPage{Caller: caller(ctx), Statuses: domain.Statuses, Status: params.Status, CustomerID: params.CustomerID}
	var next *store.Cursor
	err = database.Run(ctx, s.db, readTx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		page.Orders, next, err = listVisible(ctx, tx, params)
		return err
	})
	if err != nil {
		return err
	}
	if next != nil {
		q := url.Values{"after": {encodeCursor(*next)}}
		if params.Status != "" {
			q.Set("status", string(params.Status))
		}
		if params.CustomerID != "" {
			q.Set("customer_id", params.CustomerID)
		}
		page.Next = "/ui/?" + q.Encode()
	}
	return renderPage(c, http.StatusOK, "orders.html", page)
}

type orderPage struct {
	Order    *domain.Order
	Summary  timeline.Summary // the journey, which the page leads with
	Hops     []timeline.Hop
	TraceID  string
	TraceURL string // "" when JAEGER_UI_URL is not set
}

// uiOrder: GET /ui/orders/{order_id}, the order's timeline.
func (s *Server) uiOrder(c echo.Context) error {
	if err := onlyQueryParams(c); err != nil {
		return err
	}
	id, err := orderIDParam(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	var tl *timeline.Timeline
	err = database.Run(ctx, s.db, readTx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if err := hideOthers(ctx, tx, id); err != nil {
			return err
		}
		tl, err = timeline.Read(ctx, tx, id)
		return err
	})
	if err != nil {
		return err
	}
	page := orderPage{Order: tl.Order, Summary: tl.Summary(), Hops: tl.Hops(), TraceID: tl.TraceID()}
	if page.TraceID != "" && s.cfg.JaegerUIURL != "" {
		page.TraceURL = s.cfg.JaegerUIURL + "/trace/" + page.TraceID
	}
	return renderPage(c, http.StatusOK, "order.html", page)
}
