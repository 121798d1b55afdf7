package main

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// defaultHTTPAddr is where GET /findings, /metrics and /healthz answer.
const defaultHTTPAddr = "127.0.0.1:8084"

// config is read from the environment; each field names its variable.
type config struct {
	OrdersURL    string        // ORDERS_DATABASE_URL, required: orders' database (read only)
	InventoryURL string        // INVENTORY_DATABASE_URL, required: inventory's database (read only)
	AuditURL     string        // AUDIT_DATABASE_URL, required: the auditor's own database (its watermarks, findings and stock ledger)
	Grace        time.Duration // AUDIT_GRACE: how old an order, decision or sale must be before it is examined (audit.GraceDefault)
	Interval     time.Duration // AUDIT_INTERVAL: the pause between rounds (audit.IntervalDefault)
	Batch        int           // AUDIT_BATCH: entities per scan (audit.BatchDefault)
	// ORDERS_API_URL: orders' HTTP API. Set, the auditor repairs what the
	// domain can (repair.go: it asks orders to refund a capture inventory
	// rejected); unset, it only reports.
	OrdersAPI   string
	OrdersToken string // ORDERS_API_TOKEN: orders' HTTP_TOKEN, sent with each repair
	HTTPAddr    string // HTTP_ADDR: defaults to 127.0.0.1:8084
	LogLevel    string // LOG_LEVEL: debug, info (the default), warn, error
}

func loadConfig(getenv func(string) string) (config, error) {
	get := func(name string) string { return strings.TrimSpace(getenv(name)) }
	cfg := config{
		OrdersURL: get("ORDERS_DATABASE_URL"), InventoryURL: get("INVENTORY_DATABASE_URL"), AuditURL: get("AUDIT_DATABASE_URL"),
		OrdersAPI: get("ORDERS_API_URL"), OrdersToken: get("ORDERS_API_TOKEN"),
		HTTPAddr: get("HTTP_ADDR"), LogLevel: get("LOG_LEVEL"),
		Grace: audit.GraceDefault, Interval: audit.IntervalDefault, Batch: audit.BatchDefault,
	}
	var errs []error
	for name, into := range map[string]*time.Duration{"AUDIT_GRACE": &cfg.Grace, "AUDIT_INTERVAL": &cfg.Interval} {
		if raw := get(name); raw != "" {
			d, err := time.ParseDuration(raw)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive duration (2m, 5s)", name, raw))
			}
			*into = d
		}
	}
	if raw := get("AUDIT_BATCH"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n <= 0 || n > 100_000 {
			errs = append(errs, fmt.Errorf("AUDIT_BATCH=%q: want a number from 1 to 100000", raw))
		}
		cfg.Batch = n
	}
	for name, v := range map[string]string{"ORDERS_DATABASE_URL": cfg.OrdersURL, "INVENTORY_DATABASE_URL": cfg.InventoryURL, "AUDIT_DATABASE_URL": cfg.AuditURL} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		}
	}
	if cfg.OrdersAPI != "" {
		if u, err := url.Parse(cfg.OrdersAPI); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("ORDERS_API_URL=%q: want orders' base URL (http://host:port)", cfg.OrdersAPI))
		}
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = defaultHTTPAddr
	}
	if cfg.AuditURL != "" && (cfg.AuditURL == cfg.OrdersURL || cfg.AuditURL == cfg.InventoryURL) {
		errs = append(errs, errors.New("AUDIT_DATABASE_URL must be a database of the auditor's own, not a service's"))
	}
	return cfg, errors.Join(errs...)
}
