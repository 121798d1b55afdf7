package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocNames fails for every name README.md and the pages in docs/ give
// that does not exist:
//
//   - a file or directory: a path in a code span or a code block (relative to
//     the repository root; a glob must match something), or a Markdown link's
//     target (relative to the page), with its #anchor when it points into a
//     page; a path git ignores counts as a file a command writes;
//   - a Go file's declarations: a code span ending in .go followed on the same
//     line by code spans of names (Type.method or Name), architecture.md's
//     convention, for every page;
//   - a make target: `make TARGET` in a code span or a code block;
//   - a command-line flag: in `go run ./pkg -flag`, `./bin/prog -flag` or
//     `prog -flag` (prog one of the repository's commands) it must be defined
//     with the flag package in that command's directory; a code span that is
//     a flag alone (`-inbox=off`) must be defined by some command here or be
//     one of the go tool's;
//   - an environment variable: a code span that is an UPPER_CASE name with an
//     underscore (`HTTP_TOKEN`) or an assignment (`TRACING=otlp`), and the
//     assignments that start a command in a code block, must be named in the
//     repository's Go, shell, YAML or Makefile code, or be read by a tool
//     this project uses (externalEnv).
func TestDocNames(t *testing.T) {
	docs := docPages(t)
	r := newRepo(t)
	var c checked
	for _, path := range docs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.check(path, string(b), &c) {
			t.Error(e)
		}
	}
	t.Logf("%d pages: %d paths, %d links, %d Go files with %d names, %d make targets, %d flags, %d environment variables checked",
		len(docs), c.paths, c.links, c.goFiles, c.goNames, c.targets, c.flags, c.env)
	for what, n := range map[string]int{"paths": c.paths, "links": c.links, "Go files": c.goFiles, "make targets": c.targets, "flags": c.flags, "environment variables": c.env} {
		if n == 0 {
			t.Errorf("no %s found in the pages: the check checks nothing", what)
		}
	}
}

// docPages is README.md and every page in docs/.
func docPages(t *testing.T) []string {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(repoRoot, "README.md")}, pages...)
}

// checked counts what the check looked at.
type checked struct {
	paths, links, goFiles, goNames, targets, flags, env int
}

// Flags of the go tool itself, which the pages name with `go test`, `go
// build` or alone (`-tags failpoint`).
var goToolFlags = map[string]bool{
	"tags": true, "race": true, "count": true, "run": true, "bench": true,
	"timeout": true, "v": true, "o": true, "cover": true, "benchtime": true,
}

// Environment variables the pages name that code outside this repository
// reads, each with who reads it.
var externalEnv = map[string]string{
	"OTEL_TRACES_SAMPLER": "the OpenTelemetry SDK",
	"GOMAXPROCS":          "the Go runtime",
	"GOGC":                "the Go runtime",
	"GOPROXY":             "the go command",
	"GOWORK":              "the go command",
	"GOTOOLCHAIN":         "the go command",
}

// Names with a slash, or file names, that are not files of this
// repository, each with what it is.
var notPaths = map[string]string{
	"application/json":             "a media type",
	"LISTEN/NOTIFY":                "Postgres's LISTEN and NOTIFY",
	"apache/kafka":                 "a Docker image",
	"kafka-topics.sh":              "a script in the apache/kafka image",
	"kafka-broker-api-versions.sh": "a script in the apache/kafka image",
	"kafka-leader-election.sh":     "a script of Apache Kafka's distribution",
	"chaos-status.json":            "written by go run ./chaos -status (not git-ignored)",
}

// Prefixes of names that are not files of this repository.
var notPathPrefixes = map[string]string{
	"outbox-ci/": "the Docker images deploy/ci/standins.sh tags",
}

var (
	mdLink      = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
	fence       = regexp.MustCompile("^\\s*```")
	envName     = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$`)
	assignment  = regexp.MustCompile(`^([A-Z][A-Z0-9_]*)=`)
	flagToken   = regexp.MustCompile(`^--?([a-z][a-z0-9-]*)(=.*)?$`)
	targetToken = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	pathToken   = regexp.MustCompile(`^(\./)?[A-Za-z0-9_.*-]+(/[A-Za-z0-9_.*-]*)*$`)
	fileExt     = regexp.MustCompile(`\.(go|md|yml|yaml|json|sql|sh|svg|png|xml|mod|sum|work|txt)$`)
	headingLine = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
)

// repo is what the pages are checked against.
type repo struct {
	targets  map[string]bool
	flags    map[string]map[string]bool // command directory → flags defined there
	allFlags map[string]bool
	commands map[string]string // a command's name → its directory
	code     string            // the repository's Go, shell, YAML and Makefile text
	envSeen  map[string]bool
	ignored  map[string]bool
	anchors  map[string]map[string]bool // page → its headings' anchors
	files    *files
}

func newRepo(t *testing.T) *repo {
	r := &repo{
		targets:  map[string]bool{},
		flags:    map[string]map[string]bool{},
		allFlags: map[string]bool{},
		commands: map[string]string{},
		envSeen:  map[string]bool{},
		ignored:  map[string]bool{},
		anchors:  map[string]map[string]bool{},
		files:    &files{parsed: map[string]*decls{}, errs: map[string]error{}, dirs: map[string]string{}},
	}
	mk, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_-]+):`).FindAllStringSubmatch(string(mk), -1) {
		r.targets[m[1]] = true
	}
	var code strings.Builder
	err = filepath.WalkDir(repoRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := e.Name()
		if e.IsDir() {
			if path != repoRoot && ((strings.HasPrefix(base, ".") && base != ".ci") || base == "node_modules" || base == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(repoRoot, path)
		rel = filepath.ToSlash(rel)
		switch {
		case strings.HasPrefix(rel, "docs/"):
			return nil // the pages and these tests do not count as code
		case strings.HasSuffix(base, ".go"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			code.Write(b)
			code.WriteByte('\n')
			r.addFlags(t, path, filepath.Dir(rel), b)
		case strings.HasSuffix(base, ".sh") || strings.HasSuffix(base, ".yml") || strings.HasSuffix(base, ".yaml") ||
			base == "Makefile" || base == "Dockerfile" || rel == ".ci/run":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			code.Write(b)
			code.WriteByte('\n')
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r.code = code.String()
	return r
}

// addFlags records the flags file (in directory dir, relative to the root)
// defines with the flag package, and the command a main package there is.
func (r *repo) addFlags(t *testing.T, path, dir string, src []byte) {
	f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.ToSlash(dir)
	if f.Name.Name == "main" && !strings.HasSuffix(path, "_test.go") {
		r.commands[filepath.Base(dir)] = dir
	}
	imports := false
	for _, im := range f.Imports {
		imports = imports || im.Path.Value == `"flag"`
	}
	if !imports {
		return
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		arg := -1
		switch sel.Sel.Name {
		case "String", "Bool", "Int", "Int64", "Uint", "Uint64", "Float64", "Duration", "Func", "BoolFunc":
			arg = 0
		case "StringVar", "BoolVar", "IntVar", "Int64Var", "UintVar", "Uint64Var", "Float64Var", "DurationVar", "Var", "TextVar":
			arg = 1
		}
		if arg < 0 || len(call.Args) <= arg {
			return true
		}
		lit, ok := call.Args[arg].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		if r.flags[dir] == nil {
			r.flags[dir] = map[string]bool{}
		}
		r.flags[dir][name] = true
		r.allFlags[name] = true
		return true
	})
}

// check returns what is wrong with the names the page at path gives.
func (r *repo) check(path, doc string, c *checked) []string {
	page := "docs/" + filepath.Base(path)
	if path == filepath.Join(repoRoot, "README.md") {
		page = "README.md"
	}
	var errs []string
	fail := func(line int, format string, a ...any) {
		errs = append(errs, fmt.Sprintf("%s:%d: ", page, line)+fmt.Sprintf(format, a...))
	}

	// Go files and the names after them, as architecture.md has them.
	if page != "docs/"+docPath { // TestArchitectureReferences checks that one
		refs, _, _ := parseDocAt(doc, page, false) // directories: with every other path below
		for _, ref := range refs {
			c.goFiles++
			d, err := r.files.get(ref.file)
			if err != nil {
				fail(ref.line, "%s: %v", ref.file, err)
				continue
			}
			for _, n := range ref.names {
				c.goNames++
				switch {
				case strings.Contains(n, ".") && !d.methods[n]:
					fail(ref.line, "%s declares no method %s", ref.file, n)
				case !strings.Contains(n, ".") && !d.top[n]:
					fail(ref.line, "%s declares no top-level function, type, const or var %s", ref.file, n)
				}
			}
		}
	}

	inBlock, lang := false, ""
	for i, line := range strings.Split(doc, "\n") {
		n := i + 1
		if fence.MatchString(line) {
			inBlock = !inBlock
			lang = strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), "`"))
			continue
		}
		if inBlock {
			switch lang {
			case "", "sh", "bash", "console":
				r.checkCommandLine(stripComment(line), n, c, fail)
			}
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			r.checkLink(path, m[1], n, c, fail)
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			r.checkSpan(m[1], n, c, fail)
		}
	}
	return errs
}

// stripComment cuts a shell comment off a code block's line.
func stripComment(line string) string {
	if strings.HasPrefix(strings.TrimSpace(line), "#") {
		return ""
	}
	if i := strings.Index(line, " #"); i >= 0 {
		return line[:i]
	}
	return line
}

// checkSpan checks one code span of prose.
func (r *repo) checkSpan(span string, line int, c *checked, fail func(int, string, ...any)) {
	s := strings.TrimSpace(span)
	switch {
	case envName.MatchString(s):
		r.checkEnv(s, line, c, fail)
		return
	case strings.HasPrefix(s, "-") && !strings.Contains(s, " -"):
		// A flag alone, perhaps with its value: `-inbox=off`, `-tags failpoint`.
		tok, _, _ := strings.Cut(s, " ")
		if m := flagToken.FindStringSubmatch(tok); m != nil {
			c.flags++
			if !r.allFlags[m[1]] && !goToolFlags[m[1]] && m[1] != "h" && m[1] != "help" {
				fail(line, "no command here defines the flag -%s", m[1])
			}
		}
		return
	}
	r.checkCommandLine(s, line, c, fail)
}

// checkCommandLine checks a line of a code block, or a code span, as shell
// commands: the environment they set, the make targets, the commands' flags,
// and the paths they name.
func (r *repo) checkCommandLine(line string, n int, c *checked, fail func(int, string, ...any)) {
	line = strings.NewReplacer("[", " ", "]", " ", "(", " ", ")", " ").Replace(line)
	for _, cmd := range regexp.MustCompile(`&&|\|\||[;|]`).Split(line, -1) {
		toks := strings.Fields(cmd)
		if len(toks) > 0 && toks[0] == "export" {
			toks = toks[1:]
		}
		for len(toks) > 0 {
			m := assignment.FindStringSubmatch(toks[0])
			if m == nil {
				break
			}
			r.checkEnv(m[1], n, c, fail)
			toks = toks[1:]
		}
		for _, tok := range toks {
			r.checkPath(tok, n, c, fail)
		}
		if len(toks) == 0 {
			continue
		}
		var dir string // the command whose flags follow
		args := toks[1:]
		switch {
		case toks[0] == "make":
			for _, a := range args {
				if m := assignment.FindStringSubmatch(a); m != nil {
					r.checkEnv(m[1], n, c, fail)
					continue
				}
				if !targetToken.MatchString(a) {
					break
				}
				c.targets++
				if !r.targets[a] {
					fail(n, "the Makefile has no target %s", a)
				}
			}
			continue
		case toks[0] == "go" && len(toks) > 2 && toks[1] == "run":
			i := 2
			for i < len(toks) && strings.HasPrefix(toks[i], "-") { // the go tool's flags
				r.checkGoToolFlag(toks[i], n, c, fail)
				i++
			}
			if i == len(toks) {
				continue
			}
			dir = strings.TrimSuffix(strings.TrimPrefix(toks[i], "./"), "/")
			args = toks[i+1:]
		case toks[0] == "go":
			for _, a := range args {
				if strings.HasPrefix(a, "-") {
					r.checkGoToolFlag(a, n, c, fail)
				}
			}
			continue
		default:
			name := filepath.Base(toks[0])
			d, ok := r.commands[name]
			if !ok || (strings.Contains(toks[0], "/") && !strings.HasPrefix(strings.TrimPrefix(toks[0], "./"), "bin/")) {
				continue // not a command of this repository: its flags are its own
			}
			dir = d
		}
		for _, a := range args {
			m := flagToken.FindStringSubmatch(a)
			if m == nil {
				continue
			}
			c.flags++
			if !r.flags[dir][m[1]] && m[1] != "h" && m[1] != "help" {
				fail(n, "%s defines no flag -%s", dir, m[1])
			}
		}
	}
}

func (r *repo) checkGoToolFlag(tok string, n int, c *checked, fail func(int, string, ...any)) {
	if m := flagToken.FindStringSubmatch(tok); m != nil {
		c.flags++
		if !goToolFlags[m[1]] {
			fail(n, "-%s is not a go tool flag this test knows (goToolFlags)", m[1])
		}
	}
}

// checkEnv checks that code here, or a tool it uses, reads the variable.
func (r *repo) checkEnv(name string, n int, c *checked, fail func(int, string, ...any)) {
	c.env++
	if _, ok := externalEnv[name]; ok {
		return
	}
	seen, ok := r.envSeen[name]
	if !ok {
		seen = regexp.MustCompile(`\b` + name + `\b`).MatchString(r.code)
		r.envSeen[name] = seen
	}
	if !seen {
		fail(n, "no Go, shell, YAML or Makefile code here names the environment variable %s", name)
	}
}

// checkPath checks a token that may be a path relative to the root.
func (r *repo) checkPath(tok string, n int, c *checked, fail func(int, string, ...any)) {
	tok = strings.TrimRight(strings.TrimLeft(tok, `"'`), `"',.:;`)
	if _, ok := notPaths[tok]; ok || tok == "" || !pathToken.MatchString(tok) || strings.Contains(tok, "...") {
		return
	}
	for p := range notPathPrefixes {
		if strings.HasPrefix(tok, p) {
			return
		}
	}
	first, _, _ := strings.Cut(strings.TrimPrefix(tok, "./"), "/")
	switch {
	case strings.Contains(tok, "/"):
		if i := strings.Index(first, "."); i > 0 {
			return // a host name or a module path: github.com/…
		}
	case fileExt.MatchString(tok) && !strings.HasPrefix(tok, "."):
		// a file at the root: go.work, docker-compose.yml
	case tok == ".env":
	default:
		return
	}
	c.paths++
	rel := filepath.FromSlash(strings.TrimSuffix(strings.TrimPrefix(tok, "./"), "/"))
	if strings.Contains(tok, "*") {
		if m, _ := filepath.Glob(filepath.Join(repoRoot, rel)); len(m) > 0 {
			return
		}
	} else if _, err := os.Stat(filepath.Join(repoRoot, rel)); err == nil {
		if strings.HasSuffix(tok, "/") {
			if st, _ := os.Stat(filepath.Join(repoRoot, rel)); !st.IsDir() {
				fail(n, "%s is not a directory", tok)
			}
		}
		return
	}
	if r.gitIgnored(tok) {
		return // a file a command writes
	}
	fail(n, "no such file or directory: %s", tok)
}

// gitIgnored reports whether git ignores path: an output some command writes.
func (r *repo) gitIgnored(path string) bool {
	if v, ok := r.ignored[path]; ok {
		return v
	}
	cmd := exec.Command("git", "check-ignore", "-q", "--no-index", strings.TrimPrefix(path, "./"))
	cmd.Dir = repoRoot
	v := cmd.Run() == nil
	r.ignored[path] = v
	return v
}

// checkLink checks a Markdown link of the page at page (a path from here).
func (r *repo) checkLink(page, target string, n int, c *checked, fail func(int, string, ...any)) {
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return
	}
	c.links++
	file, anchor, _ := strings.Cut(target, "#")
	dest := page
	if file != "" {
		dest = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
		if _, err := os.Stat(dest); err != nil {
			fail(n, "the link's target %s does not exist", target)
			return
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return
	}
	anchors, err := r.pageAnchors(dest)
	if err != nil {
		fail(n, "%v", err)
		return
	}
	if !anchors[anchor] {
		var have []string
		for a := range anchors {
			have = append(have, a)
		}
		sort.Strings(have)
		fail(n, "%s has no heading with the anchor #%s (it has: %s)", file, anchor, strings.Join(have, ", "))
	}
}

// pageAnchors returns the anchors GitHub gives the headings of a page.
func (r *repo) pageAnchors(path string) (map[string]bool, error) {
	if a, ok := r.anchors[path]; ok {
		return a, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a := map[string]bool{}
	inBlock := false
	for _, line := range strings.Split(string(b), "\n") {
		if fence.MatchString(line) {
			inBlock = !inBlock
			continue
		}
		if m := headingLine.FindStringSubmatch(line); m != nil && !inBlock {
			a[anchor(m[1])] = true
		}
	}
	r.anchors[path] = a
	return a, nil
}

// anchor is GitHub's anchor for a heading: lower case, spaces to hyphens,
// punctuation other than hyphens and underscores dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestReadmeFrontDoor: README.md is read in ten minutes, and its first
// screen says how to get the library, shows it in code, and gives the two
// commands a newcomer needs.
func TestReadmeFrontDoor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) >= 12_000 {
		t.Errorf("README.md is %d bytes: keep it under 12,000 (depth lives in docs/)", len(b))
	}
	lines := strings.SplitN(string(b), "\n", 51)
	first := strings.Join(lines[:min(50, len(lines))], "\n")
	for _, want := range []string{"go get github.com/outboxref/outbox-inbox/pkg", "```go", "outbox.PublishTx", "inbox.Tx", "effect.EnqueueTx", "make demo", "make test"} {
		if !strings.Contains(first, want) {
			t.Errorf("README.md's first 50 lines do not show %q", want)
		}
	}
}
