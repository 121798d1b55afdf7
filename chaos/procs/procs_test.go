package procs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// A Kafka node asks for three ports before it binds any of them; the kernel
// readily offers a just-closed port again, so FreeAddr must remember what it
// handed out (a CI run failed with INTERNAL and CONTROLLER on one port).
func TestFreeAddrNeverRepeats(t *testing.T) {
	seen := map[string]int{}
	for i := range 2000 {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		if j, dup := seen[addr]; dup {
			t.Fatalf("FreeAddr returned %s at call %d and again at call %d", addr, j, i)
		}
		seen[addr] = i
	}
}

// TestSuperviseLeavesAStoppedProcessDown: a supervised process that dies is
// restarted; one stopped on purpose stays down until the test starts it
// again (an e2e test stopped inventory to keep it out of the way, and the
// supervisor brought it back 100 ms later: the test's order was sometimes
// rejected before the wrong answer it staged was applied).
func TestSuperviseLeavesAStoppedProcessDown(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sleeper")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &Proc{Name: "sleeper", Bin: bin, Log: io.Discard}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer p.Kill()
	restarted, held := make(chan *Proc, 10), make(chan *Proc, 10)
	var delays atomic.Int64
	Supervise(ctx, []*Proc{p}, Supervision{
		Delay:     func() time.Duration { delays.Add(1); return 0 },
		OnRestart: func(p *Proc) { restarted <- p },
		OnHeld:    func(p *Proc) { held <- p },
	})
	await := func(ch chan *Proc, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("the supervisor never %s", what)
		}
	}

	p.Kill()
	await(restarted, "restarted a killed process")
	p.Stop(10 * time.Second) //nolint:errcheck // sleep dies of the SIGTERM: how it ends is not the point
	await(held, "left a stopped process down")
	if p.Held() == nil {
		t.Fatal("a stopped process is not held")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	await(restarted, "restarted a process killed after it was started again")
	if got := [2]int64{int64(p.Starts()), delays.Load()}; got != [2]int64{4, 2} {
		t.Fatalf("starts and restarts %v, want [4 2]: the first start, a restart, the test's start, a restart", got)
	}
	select {
	case p := <-restarted:
		t.Fatalf("restarted %s once more", p.Name)
	case p := <-held:
		t.Fatalf("%s held again", p.Name)
	default:
	}
}
