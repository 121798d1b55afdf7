// Package procs builds the service binaries and runs them as real OS
// processes, so the demo and the chaos harness exercise exactly what users
// deploy, and a kill is a real kill.
package procs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Build compiles the given main packages (e.g. "./services/orders") into dir,
// with the failpoint build tag (pkg/failpoint: the harness arms crash windows
// through the environment; a default build ignores it), and returns the
// binary paths by package base name. It runs from the module root, which it
// finds from the working directory.
func Build(ctx context.Context, dir string, pkgs ...string) (map[string]string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	bins := map[string]string{}
	args := []string{"build", "-tags", "failpoint", "-o", dir + string(os.PathSeparator)}
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %v: %w\n%s", pkgs, err, out)
	}
	for _, p := range pkgs {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// ModuleRoot walks up from the working directory to the folder with go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago and that FreeAddr has not returned before in this process. The kernel
// may hand the same ephemeral port to two binds in a row once the first
// listener is closed; a caller that asks for several ports before binding any
// of them (a Kafka node's three listeners, a stack's services) would then get
// the same port twice.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// FreePort is FreeAddr's port.
func FreePort() (int, error) {
	handedMu.Lock()
	defer handedMu.Unlock()
	// Hold every rejected listener open until a fresh port is found, so the
	// kernel cannot offer the same one again.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 1000 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if !handed[port] {
			handed[port] = true
			return port, nil
		}
	}
	return 0, errors.New("find a free port: every port offered was handed out before")
}

var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)

// Proc is one service process that can be started, killed and restarted
// with the same binary, environment and address.
type Proc struct {
	Service string // e.g. "inventory"
	Name    string // e.g. "inventory-2"
	Bin     string
	Env     []string // KEY=VALUE, added to the parent's environment
	Addr    string   // its HTTP_ADDR
	Log     io.Writer
	// EnvHook, when set, is called before every start; what it returns is
	// added to Env for that incarnation only (the chaos harness arms each
	// incarnation with its own crash window this way).
	EnvHook func(*Proc) []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	status error
	starts int
	// held is set by Stop and cleared by Start: a process stopped on purpose
	// stays down (Held); started is closed by the next Start.
	held    bool
	started chan struct{}
}

// Start launches the process. It dies with the parent (Pdeathsig), so an
// interrupted run leaves no orphans.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.Bin)
	cmd.Env = append(append(os.Environ(), p.Env...), "HTTP_ADDR="+p.Addr, "INSTANCE="+p.Name)
	if p.EnvHook != nil {
		cmd.Env = append(cmd.Env, p.EnvHook(p)...)
	}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.cmd, p.exited, p.status = cmd, make(chan struct{}), nil
	p.starts++
	p.held = false
	if p.started != nil {
		close(p.started)
		p.started = nil
	}
	go func(cmd *exec.Cmd, exited chan struct{}) {
		err := cmd.Wait()
		p.mu.Lock()
		p.status = err
		p.mu.Unlock()
		close(exited)
	}(cmd, p.exited)
	return nil
}

// Exited is closed when the current incarnation exits.
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Pid returns the current incarnation's pid.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// ExitStatus returns how the last incarnation ended (nil: exit code 0, or
// still running).
func (p *Proc) ExitStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Starts counts how often the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Signal sends sig to the current incarnation.
func (p *Proc) Signal(sig syscall.Signal) error {
	pid := p.Pid()
	if pid == 0 {
		return errors.New("not started")
	}
	return syscall.Kill(pid, sig)
}

// Kill sends SIGKILL and waits for the process to be gone: the incarnation
// it signalled, whose exit it waits for is read with its pid, so a
// supervisor that starts the next one at once does not leave Kill waiting
// on the new one's exit (it did: TestSuperviseLeavesAStoppedProcessDown
// hung under make test, the restarted sleeper alive).
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	if syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) == nil {
		<-exited
	}
}

// Held returns nil unless the process was stopped on purpose (Stop) and
// not started since; then a channel that the next Start closes. A
// supervisor restarting what exits leaves a held process down until then.
func (p *Proc) Held() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		return nil
	}
	if p.started == nil {
		p.started = make(chan struct{})
	}
	return p.started
}

// Stop asks the process to shut down gracefully (SIGTERM) and waits up to
// timeout before killing it. It returns the exit error of a process that
// did not exit cleanly. The process stays down (Held) until Start.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.Pid() == 0 {
		return nil
	}
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
	select {
	case <-p.Exited():
		return nil // already gone
	default:
	}
	p.Signal(syscall.SIGTERM) //nolint:errcheck
	select {
	case <-p.Exited():
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.status
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %s; killed", p.Name, timeout)
	}
}

// WaitReady polls GET /readyz until it answers 200 or ctx ends.
func (p *Proc) WaitReady(ctx context.Context) error {
	url := "http://" + p.Addr + "/readyz"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w", p.Name, ctx.Err())
		case <-p.Exited():
			return fmt.Errorf("%s exited before it was ready", p.Name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Supervision says how Supervise restarts processes.
type Supervision struct {
	Delay     func() time.Duration // before each restart
	OnRestart func(*Proc)          // after each restart, when set
	OnHeld    func(*Proc)          // when set, when a process stopped on purpose is left down
}

// Supervise restarts each of ps that exits, after s.Delay, until ctx ends:
// what a container orchestrator does. A process stopped on purpose
// (Proc.Stop) stays down until it is started.
func Supervise(ctx context.Context, ps []*Proc, s Supervision) {
	for _, p := range ps {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-p.Exited():
				}
				if held := p.Held(); held != nil {
					if s.OnHeld != nil {
						s.OnHeld(p)
					}
					select {
					case <-ctx.Done():
						return
					case <-held:
						continue
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(s.Delay()):
				}
				if err := p.Start(); err != nil {
					return
				}
				if s.OnRestart != nil {
					s.OnRestart(p)
				}
			}
		}()
	}
}
