package platform

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConsoleClosedByDefault: the console is off unless CONSOLE_ADDR is
// set; beyond loopback it needs logins; logins that say nothing sure are
// refused at start.
func TestConsoleClosedByDefault(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	svc := Service{Name: "inventory"}
	con, err := newConsole(Config{}, svc, nil, log)
	require.NoError(t, err)
	require.Nil(t, con, "no CONSOLE_ADDR, no console")
	for _, c := range []struct {
		cfg  Config
		says string
	}{
		{Config{ConsoleAddr: "0.0.0.0:8091"}, "set CONSOLE_USERS"},
		{Config{ConsoleAddr: ":8091"}, "set CONSOLE_USERS"},
		{Config{ConsoleAddr: "127.0.0.1:0", ConsoleUsers: "alice:admin:0123456789abcdef"}, `role "admin"`},
		{Config{ConsoleAddr: "127.0.0.1:0", ConsoleUsers: "alice:operator:short"}, "at least 16"},
		{Config{ConsoleAddr: "127.0.0.1:0", ConsoleUsers: "alice:operator"}, "not name:role:secret"},
		{Config{ConsoleAddr: "127.0.0.1:0", ConsoleKey: "short"}, "CONSOLE_KEY"},
	} {
		_, err := newConsole(c.cfg, svc, nil, log)
		require.ErrorContains(t, err, c.says, "%+v", c.cfg)
	}
}
