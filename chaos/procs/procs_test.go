package procs

import "testing"

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
