package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/dotenv"

	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// TestWrite: the file holds every variable, read back as docker compose
// reads an env file; the keys parse; two files share no secret; the file
// is its owner's alone; an existing file is kept unless forced.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.env"), filepath.Join(dir, "b.env")
	for _, p := range []string{a, b} {
		if err := Write(p, false); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) map[string]string {
		t.Helper()
		env, err := dotenv.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	ea, eb := read(a), read(b)
	for _, v := range Variables {
		if ea[v] == "" {
			t.Errorf("%s: no %s", a, v)
		}
		if ea[v] == eb[v] {
			t.Errorf("%s is the same in two files", v)
		}
	}
	if len(ea) != len(Variables) {
		t.Errorf("variables %v, want %v", ea, Variables)
	}
	if len(ea["POSTGRES_PASSWORD"]) < 32 {
		t.Errorf("password of %d characters", len(ea["POSTGRES_PASSWORD"]))
	}
	for _, v := range []string{"ORDERS_SIGNING_KEY", "INVENTORY_SIGNING_KEY"} {
		k, err := signature.ParseKey(ea[v])
		if err != nil {
			t.Errorf("%s: %v", v, err)
		} else if want := strings.ToLower(strings.TrimSuffix(v, "_SIGNING_KEY")) + "-"; !strings.HasPrefix(k.ID, want) {
			t.Errorf("%s: key id %q, want %s…", v, k.ID, want)
		}
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}

	if err := Write(a, false); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("an existing file was replaced without -force: %v", err)
	}
	if read(a)["POSTGRES_PASSWORD"] != ea["POSTGRES_PASSWORD"] {
		t.Error("the refused write changed the file")
	}
	if err := os.Chmod(a, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(a, true); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("after -force over a 0644 file: mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if read(a)["POSTGRES_PASSWORD"] == ea["POSTGRES_PASSWORD"] {
		t.Error("-force kept the old secrets")
	}
}
