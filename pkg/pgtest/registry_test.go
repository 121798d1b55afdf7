package pgtest

import (
	"archive/tar"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRegistryRefusesWhatItDidNotPin: a jar whose hash is not the pinned
// one (a mirror serving something else) is refused and nothing is cached.
func TestRegistryRefusesWhatItDidNotPin(t *testing.T) {
	var asked string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.URL.Path
		w.Write([]byte("not the jar")) //nolint:errcheck
	}))
	defer srv.Close()
	cache := t.TempDir()
	t.Setenv("PGTEST_MAVEN_REPO", srv.URL)
	t.Setenv("PGTEST_CACHE", cache)
	_, err := registryBin(context.Background())
	if err == nil || !strings.Contains(err.Error(), "refusing it") {
		t.Fatalf("registryBin = %v, want the hash refused", err)
	}
	if !strings.HasPrefix(asked, "/io/zonky/test/postgres/") || !strings.HasSuffix(asked, "-"+RegistryVersion+".jar") {
		t.Errorf("asked the mirror for %s", asked)
	}
	if matches, _ := filepath.Glob(filepath.Join(cache, "postgres-*")); len(matches) > 0 {
		t.Errorf("cached %v", matches)
	}
}

// TestUntarStaysInside: names and links leaving the archive's directory
// are refused.
func TestUntarStaysInside(t *testing.T) {
	for _, h := range []tar.Header{
		{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "bin/../../evil", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "lib/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		{Name: "lib/link", Typeflag: tar.TypeSymlink, Linkname: "../../etc/passwd"},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Close()
		dir := t.TempDir()
		if err := untar(tar.NewReader(&b), dir); err == nil {
			t.Errorf("%s (%s) unpacked", h.Name, h.Linkname)
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(dir), "evil")); err == nil {
			t.Errorf("%s written outside", h.Name)
		}
	}
}
