// Package loadgen drives the example services over HTTP as a client would:
// it seeds stock, creates and pays orders, retries a payment whose response
// was lost, and deliberately pays some orders twice.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxref/outbox-inbox/services/events"
)

// Client talks to one or more replicas of each service, round robin, and
// moves to the next replica when one does not answer.
type Client struct {
	Orders    []string // base URLs, e.g. http://127.0.0.1:8081
	Inventory []string
	HTTP      *http.Client

	next    atomic.Uint64
	retries atomic.Int64
}

// NewClient returns a client with a short per-request timeout that keeps
// enough idle connections for many concurrent clients (Go's default keeps
// two per host, and opens and closes the rest on every request).
func NewClient(orders, inventory []string) *Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 256
	return &Client{Orders: orders, Inventory: inventory, HTTP: &http.Client{Timeout: 5 * time.Second, Transport: t}}
}

// Retries counts requests that were sent again after no response.
func (c *Client) Retries() int64 { return c.retries.Load() }

// do sends one request, retrying on transport errors and 5xx answers (a
// killed or restarting replica) until ctx ends. It decodes a 2xx body into
// out.
func (c *Client) do(ctx context.Context, bases []string, method, path string, body, out any) error {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		base := bases[int(c.next.Add(1))%len(bases)]
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(payload))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.HTTP.Do(req)
		if err == nil {
			data, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case rerr != nil:
				err = rerr
			case resp.StatusCode >= 500:
				err = fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
			case resp.StatusCode >= 300:
				return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
			default:
				if out == nil {
					return nil
				}
				return json.Unmarshal(data, out)
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w (last error: %v)", method, path, ctx.Err(), err)
		}
		c.retries.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(min(attempt+1, 10)) * 50 * time.Millisecond):
		}
	}
}

// StockItem is one SKU's seeded quantity.
type StockItem struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

// SeedStock sets the available quantity of each SKU.
func (c *Client) SeedStock(ctx context.Context, stock map[string]int) error {
	items := make([]StockItem, 0, len(stock))
	for sku, n := range stock {
		items = append(items, StockItem{sku, n})
	}
	return c.do(ctx, c.Inventory, http.MethodPut, "/stock", items, nil)
}

// Order is the orders API's answer.
type Order struct {
	ID     string        `json:"id"`
	Status string        `json:"status"`
	Lines  []events.Line `json:"lines"`
}

// CreateOrder creates an order. A retried create may create a second order
// that is never paid; the checker only looks at paid orders.
func (c *Client) CreateOrder(ctx context.Context, lines []events.Line) (Order, error) {
	var o Order
	err := c.do(ctx, c.Orders, http.MethodPost, "/orders", map[string]any{"lines": lines}, &o)
	return o, err
}

// Pay pays an order, retrying until some replica answers: exactly what a
// client does after a lost response. The service must publish one OrderPaid
// however often this is sent.
func (c *Client) Pay(ctx context.Context, id string) (Order, error) {
	var o Order
	err := c.do(ctx, c.Orders, http.MethodPost, "/orders/"+id+"/pay", nil, &o)
	return o, err
}

// Plan describes a load run.
type Plan struct {
	Orders       int    // how many orders to create and pay
	Concurrency  int    // concurrent clients. Defaults to 16.
	DoubleSubmit int    // pay every Nth order twice at once (0: never)
	Seed         uint64 // seeds the order contents
	// Rate, when > 0, caps orders per second across all clients.
	Rate float64
	// OnPaid, when set, is called after each order was paid.
	OnPaid func(Order)
}

// Result is what a load run did.
type Result struct {
	Paid          []Order // every order paid (each once, however often it was submitted)
	DoubleSubmits int
	Retries       int64
}

// SKUs returns the catalogue: n SKUs named sku-00, sku-01, ...
func SKUs(n int) []string {
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("sku-%02d", i)
	}
	return skus
}

// StockFor returns a stock level per SKU for a run of n orders over skus:
// plenty for most, scarce for the last two, so some orders are rejected for
// lack of stock all through the run.
func StockFor(n int, skus []string) map[string]int {
	stock := map[string]int{}
	for i, sku := range skus {
		if i >= len(skus)-2 {
			stock[sku] = max(2, n/200)
		} else {
			stock[sku] = n/2 + 10
		}
	}
	return stock
}

// Lines returns 1-3 random lines over skus.
func Lines(r *rand.Rand, skus []string) []events.Line {
	n := 1 + r.IntN(3)
	lines := make([]events.Line, 0, n)
	seen := map[string]bool{}
	for len(lines) < n {
		sku := skus[r.IntN(len(skus))]
		if seen[sku] {
			continue
		}
		seen[sku] = true
		lines = append(lines, events.Line{SKU: sku, Quantity: 1 + r.IntN(3)})
	}
	return lines
}

// Run creates and pays plan.Orders orders with plan.Concurrency clients.
func Run(ctx context.Context, c *Client, skus []string, plan Plan) (Result, error) {
	if plan.Concurrency == 0 {
		plan.Concurrency = 16
	}
	var (
		mu      sync.Mutex
		res     Result
		firstEr error
		issued  atomic.Int64
		wg      sync.WaitGroup
	)
	var tick <-chan time.Time
	if plan.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / plan.Rate))
		defer t.Stop()
		tick = t.C
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for w := range plan.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(plan.Seed, uint64(w)))
			for {
				i := int(issued.Add(1))
				if i > plan.Orders || ctx.Err() != nil {
					return
				}
				if tick != nil {
					select {
					case <-tick:
					case <-ctx.Done():
						return
					}
				}
				o, double, err := createAndPay(ctx, c, Lines(r, skus), plan.DoubleSubmit > 0 && i%plan.DoubleSubmit == 0)
				mu.Lock()
				if err != nil {
					if firstEr == nil {
						firstEr = err
						cancel()
					}
				} else {
					res.Paid = append(res.Paid, o)
					if double {
						res.DoubleSubmits++
					}
				}
				mu.Unlock()
				if err == nil && plan.OnPaid != nil {
					plan.OnPaid(o)
				}
			}
		}()
	}
	wg.Wait()
	res.Retries = c.Retries()
	return res, firstEr
}

func createAndPay(ctx context.Context, c *Client, lines []events.Line, double bool) (Order, bool, error) {
	o, err := c.CreateOrder(ctx, lines)
	if err != nil {
		return Order{}, false, err
	}
	if !double {
		paid, err := c.Pay(ctx, o.ID)
		return paid, false, err
	}
	// Two payments of the same order at the same moment: a double click.
	errs := make(chan error, 2)
	var paid Order
	var once sync.Once
	for range 2 {
		go func() {
			p, err := c.Pay(ctx, o.ID)
			if err == nil {
				once.Do(func() { paid = p })
			}
			errs <- err
		}()
	}
	err = errors.Join(<-errs, <-errs)
	return paid, true, err
}
