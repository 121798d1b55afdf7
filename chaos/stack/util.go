package stack

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/outboxref/outbox-inbox/chaos/procs"
)

// freePort asks the kernel for a free TCP port on 127.0.0.1, one this
// process has not used before.
func freePort() (int, error) {
	port, err := procs.FreePort()
	if err != nil {
		return 0, fmt.Errorf("stack: %w", err)
	}
	return port, nil
}

// tail returns the last few KB of a log, for error messages.
func tail(b []byte) string {
	const max = 4 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
