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
// is its owner's alone; an existing file is kept unless forced, and one
// from an older version gets what it lacks, its own values untouched.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.env"), filepath.Join(dir, "b.env")
	for _, p := range []string{a, b} {
		if added, err := Write(p, false); err != nil || len(added) != len(Variables) {
			t.Fatalf("added %v: %v", added, err)
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

	if added, err := Write(a, false); err != nil || len(added) != 0 {
		t.Errorf("a complete file: added %v: %v", added, err)
	}
	for _, v := range Variables {
		if read(a)[v] != ea[v] {
			t.Errorf("a write without -force changed %s", v)
		}
	}

	// A file an older version wrote: no Kafka passwords, no final newline.
	old := filepath.Join(dir, "old.env")
	if err := os.WriteFile(old, []byte("# mine\nPOSTGRES_PASSWORD=kept\nAPI_TOKEN=kept-too"), 0o644); err != nil {
		t.Fatal(err)
	}
	added, err := Write(old, false)
	if err != nil || len(added) != len(Variables)-2 || added[0] != "PROVIDER_TOKEN" {
		t.Fatalf("an old file: added %v: %v", added, err)
	}
	eo := read(old)
	if eo["POSTGRES_PASSWORD"] != "kept" || eo["API_TOKEN"] != "kept-too" || len(eo) != len(Variables) {
		t.Errorf("an old file after the write: %v", eo)
	}
	for _, v := range added {
		if eo[v] == "" {
			t.Errorf("an old file: %s added empty", v)
		}
	}
	if fi, err := os.Stat(old); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("an old 0644 file: mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if err := os.Chmod(a, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(a, true); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(a); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("after -force over a 0644 file: mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if read(a)["POSTGRES_PASSWORD"] == ea["POSTGRES_PASSWORD"] {
		t.Error("-force kept the old secrets")
	}
}
