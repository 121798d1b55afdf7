package provider

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Defaults of the settings where zero means "the default".
const (
	DefaultHTTPAddr      = "127.0.0.1:8083"
	DefaultKeyTTL        = 24 * time.Hour // Stripe prunes keys once they are at least 24 hours old
	DefaultKeyLockTime   = 30 * time.Second
	DefaultSweepInterval = time.Hour
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes = 16 << 10
	// MaxKeyLength is Stripe's limit on an idempotency key.
	MaxKeyLength = 255
	// MaxAmount is the largest amount taken, in minor units (Stripe's
	// eight digits).
	MaxAmount = 99_999_999
)

// Config is read from the environment (LoadConfig); each field's env tag
// names its variable. Fields without one are for programs and tests.
type Config struct {
	// DatabaseURL is the provider's own database. PROVIDER_DATABASE_URL,
	// or DATABASE_URL when that is unset. Required.
	DatabaseURL string `env:"PROVIDER_DATABASE_URL"`
	// DatabaseStandbys, when over 0, is how many of the database's
	// streaming standbys must hold a capture before the provider answers it
	// (pkg/standby): a real provider's answer is durable, and on an
	// asynchronously replicated test bed this one's is too.
	DatabaseStandbys int64 `env:"PROVIDER_DATABASE_STANDBYS"`
	// HTTPAddr defaults to DefaultHTTPAddr.
	HTTPAddr string `env:"HTTP_ADDR"`
	// HTTPToken, when set, is the API key every POST must carry
	// ("Authorization: Bearer <token>", 401 otherwise), as a real
	// provider's secret key. Beyond loopback the provider refuses to start
	// without one.
	HTTPToken string `env:"HTTP_TOKEN"`
	// Instance names the process in logs. Defaults to host-pid.
	Instance string `env:"INSTANCE"`
	// LogLevel defaults to info.
	LogLevel string `env:"LOG_LEVEL"`

	// Every POST waits a latency drawn uniformly from [LatencyMin,
	// LatencyMax] while it holds its idempotency key, as a real provider
	// spends its time talking to the card network. Both default to 0.
	LatencyMin time.Duration `env:"PROVIDER_LATENCY_MIN"`
	LatencyMax time.Duration `env:"PROVIDER_LATENCY_MAX"`
	// FailRate is the share of POSTs answered 500 before anything is done
	// or stored: a retry with the same key runs afresh. Defaults to 0.
	FailRate float64 `env:"PROVIDER_FAIL_RATE"`
	// LostResponseRate is the share of POSTs that are executed and
	// committed (capture and stored response) and then never answered: the
	// connection is closed without a byte, after LostResponseDelay (or
	// sooner, when the client gives up). Defaults to 0.
	LostResponseRate  float64       `env:"PROVIDER_LOST_RESPONSE_RATE"`
	LostResponseDelay time.Duration `env:"PROVIDER_LOST_RESPONSE_DELAY"`
	// DeclineAmount, when not 0, declines every capture of exactly this
	// amount (402 card_declined), besides the declining card tokens
	// (DeclinedSources). Defaults to 0.
	DeclineAmount int64 `env:"PROVIDER_DECLINE_AMOUNT"`
	// Seed seeds the faults and latencies; the same seed and the same
	// sequence of POSTs draw the same faults. 0 picks one at random, which
	// Run logs so that a run can be repeated.
	Seed uint64 `env:"PROVIDER_SEED"`
	// KeyTTL is how long an idempotency key is remembered; an older key is
	// treated as never seen and swept. Defaults to DefaultKeyTTL.
	KeyTTL time.Duration `env:"PROVIDER_KEY_TTL"`
	// KeyLockTimeout is how long a key may stay in progress before another
	// request with it may take it over (its holder is taken to be dead:
	// the process crashed). The holder, if alive after all, cannot then
	// complete: the takeover fences it off. Must exceed LatencyMax.
	// Defaults to DefaultKeyLockTime.
	KeyLockTimeout time.Duration `env:"PROVIDER_KEY_LOCK_TIMEOUT"`
	// SweepInterval is how often keys older than KeyTTL are deleted.
	// Defaults to DefaultSweepInterval.
	SweepInterval time.Duration `env:"PROVIDER_SWEEP_INTERVAL"`

	// Logger defaults to a text logger on stderr at LogLevel.
	Logger *slog.Logger
	// Now is the clock for created_at and key expiry. Defaults to time.Now.
	Now func() time.Time
}

// EnvVars lists the variables LoadConfig reads.
func EnvVars() []string {
	names := []string{"DATABASE_URL"}
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		if name := t.Field(i).Tag.Get("env"); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// LoadConfig reads Config from the environment. It does not fill defaults
// or check ranges: New and Run do.
func LoadConfig() (Config, error) {
	var cfg Config
	v := reflect.ValueOf(&cfg).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("env")
		if name == "" {
			continue
		}
		raw := strings.TrimSpace(os.Getenv(name))
		if name == "PROVIDER_DATABASE_URL" && raw == "" {
			raw = strings.TrimSpace(os.Getenv("DATABASE_URL"))
		}
		if raw == "" {
			continue
		}
		if err := setField(v.Field(i), raw); err != nil {
			return cfg, fmt.Errorf("%s=%q: %w", name, raw, err)
		}
	}
	if cfg.DatabaseURL == "" {
		return cfg, errors.New("PROVIDER_DATABASE_URL (or DATABASE_URL) is required")
	}
	return cfg, nil
}

func setField(f reflect.Value, raw string) error {
	switch f.Interface().(type) {
	case string:
		f.SetString(raw)
	case time.Duration:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
	case int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return err
		}
		f.SetInt(n)
	case uint64:
		n, err := strconv.ParseUint(raw, 10, 64)
		if err != nil {
			return err
		}
		f.SetUint(n)
	case float64:
		x, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return err
		}
		f.SetFloat(x)
	default:
		return fmt.Errorf("unsupported field type %s", f.Type())
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Instance == "" {
		host, _ := os.Hostname()
		c.Instance = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.KeyTTL == 0 {
		c.KeyTTL = DefaultKeyTTL
	}
	if c.KeyLockTimeout == 0 {
		c.KeyLockTimeout = DefaultKeyLockTime
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		var l slog.Level
		if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
			l = slog.LevelInfo
		}
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
}

// Validate returns an error naming the first field that is out of range.
func (c Config) Validate() error {
	switch {
	case c.LatencyMin < 0 || c.LatencyMax < 0:
		return errors.New("PROVIDER_LATENCY_MIN and PROVIDER_LATENCY_MAX must not be negative")
	case c.LatencyMax != 0 && c.LatencyMax < c.LatencyMin:
		return errors.New("PROVIDER_LATENCY_MAX must not be below PROVIDER_LATENCY_MIN")
	case c.FailRate < 0 || c.FailRate > 1:
		return errors.New("PROVIDER_FAIL_RATE must be within [0, 1]")
	case c.LostResponseRate < 0 || c.LostResponseRate > 1:
		return errors.New("PROVIDER_LOST_RESPONSE_RATE must be within [0, 1]")
	case c.LostResponseDelay < 0:
		return errors.New("PROVIDER_LOST_RESPONSE_DELAY must not be negative")
	case c.DeclineAmount < 0:
		return errors.New("PROVIDER_DECLINE_AMOUNT must not be negative")
	case c.KeyTTL < 0 || c.KeyLockTimeout < 0 || c.SweepInterval < 0:
		return errors.New("PROVIDER_KEY_TTL, PROVIDER_KEY_LOCK_TIMEOUT and PROVIDER_SWEEP_INTERVAL must not be negative")
	case c.KeyLockTimeout != 0 && c.KeyLockTimeout <= max(c.LatencyMin, c.LatencyMax):
		return errors.New("PROVIDER_KEY_LOCK_TIMEOUT must exceed PROVIDER_LATENCY_MAX, or live requests would be taken over")
	}
	return nil
}
