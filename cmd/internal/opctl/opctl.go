// Package opctl holds what the operator commands (cmd/inboxctl,
// cmd/outboxctl) share: their frame (Tool: the signals, the command line,
// the database), who is at the keyboard, and how a long value is cut for a
// table.
package opctl

import (
	"os/user"
	"strings"
)

// Operator is who acts when -by is not given: the OS user, else $USER.
func Operator(getenv func(string) string) string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return getenv("USER")
}

// Clip puts s on one line and cuts it to n bytes (whole UTF-8 characters),
// marking the cut with an ellipsis.
func Clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
