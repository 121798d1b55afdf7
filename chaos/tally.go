package main

import "sync"

// tally counts faults by class, safe for concurrent use: the one counter
// behind every fault injector (kfake's, Apache Kafka's, the network's).
type tally struct {
	mu sync.Mutex
	n  map[string]int
}

func (t *tally) add(class string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[string]int{}
	}
	t.n[class]++
}

func (t *tally) get(class string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[class]
}

// counts returns a copy of every class's count.
func (t *tally) counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.n))
	for k, v := range t.n {
		out[k] = v
	}
	return out
}

func (t *tally) total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, v := range t.n {
		n += v
	}
	return n
}
