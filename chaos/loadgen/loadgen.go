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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/services/events"
)

// Client talks to one or more replicas of each service, round robin, and
// moves to the next replica when one does not answer.
type Client struct {
	Orders    []string // base URLs, e.g. http://127.0.0.1:8081
	Inventory []string
	HTTP      *http.Client
	// Token, when set, is sent with every state-changing request as
	// "Authorization: Bearer <token>" (the services' HTTP_TOKEN).
	Token string

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
		if c.Token != "" {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
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
				return &RefusedError{Method: method, Path: path, Status: resp.Status, Body: string(bytes.TrimSpace(data))}
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

// RefusedError is an answer below 500 that is not a success: the service
// received the request and declined it (an unknown order, an invalid body).
// Unlike a timeout or a 5xx, whose request may have committed before the
// answer was lost, it says that nothing was done.
type RefusedError struct {
	Method, Path, Status string
	Body                 string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Body)
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
	return c.CreateOrderWithCard(ctx, lines, "")
}

// CreateOrderWithCard creates an order paid with card (a token such as
// tok_declined, which the payment provider declines; "" is the default).
func (c *Client) CreateOrderWithCard(ctx context.Context, lines []events.Line, card string) (Order, error) {
	body := map[string]any{"lines": lines}
	if card != "" {
		body["card"] = card
	}
	var o Order
	err := c.do(ctx, c.Orders, http.MethodPost, "/orders", body, &o)
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

// DeclinedCard is the card token the payment provider always declines.
const DeclinedCard = "tok_declined"

// Plan describes a load run.
type Plan struct {
	Orders       int    // how many orders to create and pay
	Concurrency  int    // concurrent clients. Defaults to 16.
	DoubleSubmit int    // pay every Nth order twice at once (0: never)
	DeclineEvery int    // every Nth order pays with a card the provider declines (0: none)
	Seed         uint64 // seeds the order contents
	// Rate, when > 0, caps orders per second across all clients.
	Rate float64
	// OnPaid, when set, is called after each order was paid.
	OnPaid func(Order)
}

// Result is what a load run did. Every order whose creation was answered
// is in exactly one of Paid, Unpaid and Unknown.
type Result struct {
	Paid []Order // every order paid (each once, however often it was submitted)
	// Unpaid are orders created and not paid: the run ended before their
	// payment was sent, or the service refused it.
	Unpaid []string
	// Unknown are orders whose payment was sent and never answered (the
	// run ended while it was retried): it may have committed or not.
	Unknown       []string
	DoubleSubmits int
	Retries       int64
}

// Client returns the run's account of its orders, for the checker to hold
// the databases to, by id.
func (r Result) Client() *judge.Client {
	c := &judge.Client{Unpaid: r.Unpaid, Unknown: r.Unknown}
	for _, o := range r.Paid {
		c.Paid = append(c.Paid, o.ID)
	}
	return c
}

// Add is r and then more: two load runs on the same system as one.
func (r Result) Add(more Result) Result {
	r.Paid = append(r.Paid, more.Paid...)
	r.Unpaid = append(r.Unpaid, more.Unpaid...)
	r.Unknown = append(r.Unknown, more.Unknown...)
	r.DoubleSubmits += more.DoubleSubmits
	r.Retries = more.Retries // the client's count, which both runs share
	return r
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
				double := plan.DoubleSubmit > 0 && i%plan.DoubleSubmit == 0
				card := ""
				if plan.DeclineEvery > 0 && i%plan.DeclineEvery == 0 {
					card = DeclinedCard
				}
				o, out, err := createAndPay(ctx, c, Lines(r, skus), card, double)
				mu.Lock()
				if vanished(err) {
					// The order it was told was created is gone (a failover
					// lost it): the checker, holding the database to the
					// client's account (Unpaid), says so; the load goes on.
					err = nil
				}
				if err != nil && firstEr == nil {
					firstEr = err
					cancel()
				}
				switch out {
				case paid:
					res.Paid = append(res.Paid, o)
					if double {
						res.DoubleSubmits++
					}
				case unpaid:
					res.Unpaid = append(res.Unpaid, o.ID)
				case unknown:
					res.Unknown = append(res.Unknown, o.ID)
				}
				mu.Unlock()
				if out == paid && plan.OnPaid != nil {
					plan.OnPaid(o)
				}
			}
		}()
	}
	wg.Wait()
	res.Retries = c.Retries()
	return res, firstEr
}

// vanished reports a payment answered 404: the order the client was told
// was created is not there.
func vanished(err error) bool {
	var refused *RefusedError
	return errors.As(err, &refused) && strings.HasPrefix(refused.Status, "404") && strings.HasSuffix(refused.Path, "/pay")
}

// outcome is what the client knows of one order's payment.
type outcome int

const (
	notCreated outcome = iota // the create was not answered: no id to follow (an order it made stays unpaid)
	paid                      // a payment was answered with the order
	unpaid                    // the payment was never sent, or refused
	unknown                   // the payment was sent and never answered
)

// payOutcome classifies a payment's error: refused is a definite no;
// anything else (the run ending while the request was retried, an answer
// that could not be read) may hide a committed payment.
func payOutcome(err error) outcome {
	var refused *RefusedError
	switch {
	case err == nil:
		return paid
	case errors.As(err, &refused):
		return unpaid
	default:
		return unknown
	}
}

// createAndPay creates an order and pays it, once or twice at once. On an
// error the order's outcome still says what the client knows of it.
func createAndPay(ctx context.Context, c *Client, lines []events.Line, card string, double bool) (Order, outcome, error) {
	o, err := c.CreateOrderWithCard(ctx, lines, card)
	if err != nil {
		return Order{}, notCreated, err
	}
	if err := ctx.Err(); err != nil {
		return o, unpaid, err // the run ended: not sent
	}
	if !double {
		p, err := c.Pay(ctx, o.ID)
		if err != nil {
			return o, payOutcome(err), err
		}
		return p, paid, nil
	}
	// Two payments of the same order at the same moment: a double click.
	type answer struct {
		order Order
		err   error
	}
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			p, err := c.Pay(ctx, o.ID)
			answers <- answer{p, err}
		}()
	}
	a, b := <-answers, <-answers
	err = errors.Join(a.err, b.err)
	switch {
	case a.err == nil:
		return a.order, paid, err
	case b.err == nil:
		return b.order, paid, err
	case payOutcome(a.err) == unpaid && payOutcome(b.err) == unpaid:
		return o, unpaid, err
	default:
		return o, unknown, err
	}
}
