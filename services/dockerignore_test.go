package services_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// TestBuildContextHoldsWhatTheImagesBuild: every Go file (and embedded file)
// of every package the images' `go build` compiles, in this module, is in
// the build context .dockerignore leaves. Without an engine nothing else
// sees it: the images stopped building when chaos/stack began to import
// deploy/kafka (embedding its pom.xml), which .dockerignore left out.
func TestBuildContextHoldsWhatTheImagesBuild(t *testing.T) {
	df, err := os.ReadFile(servicesFile)
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`go build [^;]*`).Find(df)
	if build == nil {
		t.Fatalf("%s: no `go build` line", servicesFile)
	}
	var pkgs []string
	for _, f := range strings.Fields(string(build)) {
		if strings.HasPrefix(f, "./") {
			pkgs = append(pkgs, f)
		}
	}
	if len(pkgs) < 5 {
		t.Fatalf("%s builds %v: want the services, the demo, the dashboard, the provider, the healthcheck", servicesFile, pkgs)
	}
	f, err := os.Open("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	ignored, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f",
		`{{if not .Standard}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	files := []string{"go.mod", "go.sum", "go.work", "pkg/go.mod", "pkg/go.sum"}
	for _, abs := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, abs); err == nil && !strings.HasPrefix(rel, "..") {
			files = append(files, rel)
		}
	}
	if len(files) < 50 {
		t.Fatalf("only %d files of this repository in the images' packages: the listing is wrong", len(files))
	}
	for _, rel := range files {
		if skip, err := ignored.MatchesOrParentMatches(filepath.ToSlash(rel)); err != nil {
			t.Fatal(err)
		} else if skip {
			t.Errorf("%s is built into the images but .dockerignore leaves it out of the build context", rel)
		}
	}
	t.Logf("%d files of %d packages' dependencies are in the build context", len(files), len(pkgs))
}
