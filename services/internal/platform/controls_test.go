package platform

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// TestControlsOnlyInFailpointBuilds: each control run's switch turns a
// guarantee off. A default build refuses to start with one set, naming it,
// before it touches anything; a failpoint build (the harness's) gets past
// that point. make test runs it in both builds.
func TestControlsOnlyInFailpointBuilds(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]func(*Config){
		"INBOX_DISABLED":         func(c *Config) { c.InboxDisabled = true },
		"DOMAIN_GUARD_DISABLED":  func(c *Config) { c.DomainGuardDisabled = true },
		"BAD_DEPLOY":             func(c *Config) { c.BadDeploy = true },
		"EFFECT_KEYS_DISABLED":   func(c *Config) { c.EffectKeysDisabled = true },
		"RELAY_PARALLEL":         func(c *Config) { c.RelayParallel = true },
		"RELAY_DRIVER=textbook":  func(c *Config) { c.RelayDriver = "textbook" },
		"RELAY_DRIVER=watermill": func(c *Config) { c.RelayDriver = "watermill" },
	} {
		cfg := defaults
		cfg.DatabaseURL, cfg.HTTPAddr, cfg.Instance = "postgres://nowhere.invalid/x", "127.0.0.1:0", "controls"
		set(&cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := Run(ctx, cfg, Service{Name: "controls", Topic: "controls"})
		cancel()
		require.Error(t, err, name)
		if failpoint.Enabled {
			require.NotContains(t, err.Error(), "only a failpoint build", "%s: a failpoint build honours it", name)
		} else {
			require.ErrorContains(t, err, name)
			require.ErrorContains(t, err, "only a failpoint build")
		}
	}
	require.Empty(t, controlsSet(defaults), "the defaults switch nothing off")
}
