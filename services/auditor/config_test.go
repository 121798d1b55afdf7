package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	base := map[string]string{"ORDERS_DATABASE_URL": "postgres:///orders", "INVENTORY_DATABASE_URL": "postgres:///inventory", "AUDIT_DATABASE_URL": "postgres:///audit"}
	cfg, err := loadConfig(env(base))
	require.NoError(t, err)
	require.Equal(t, config{OrdersURL: "postgres:///orders", InventoryURL: "postgres:///inventory", AuditURL: "postgres:///audit",
		Grace: 2 * time.Minute, Interval: 5 * time.Second, Batch: 1000, HTTPAddr: defaultHTTPAddr}, cfg)

	for name, c := range map[string]struct {
		set  map[string]string
		want string
	}{
		"no database":      {map[string]string{"ORDERS_DATABASE_URL": ""}, "ORDERS_DATABASE_URL is required"},
		"a service's":      {map[string]string{"AUDIT_DATABASE_URL": "postgres:///orders"}, "a database of the auditor's own"},
		"grace":            {map[string]string{"AUDIT_GRACE": "soon"}, `AUDIT_GRACE="soon"`},
		"negative":         {map[string]string{"AUDIT_INTERVAL": "-5s"}, `AUDIT_INTERVAL="-5s"`},
		"batch":            {map[string]string{"AUDIT_BATCH": "0"}, `AUDIT_BATCH="0"`},
		"batch, too large": {map[string]string{"AUDIT_BATCH": "1000000"}, `AUDIT_BATCH="1000000"`},
	} {
		kv := map[string]string{}
		for k, v := range base {
			kv[k] = v
		}
		for k, v := range c.set {
			kv[k] = v
		}
		_, err := loadConfig(env(kv))
		require.ErrorContains(t, err, c.want, name)
	}
}
