// Package docs holds the project's documentation; its tests keep it true to
// the code: architecture.md's files, functions and crash windows
// (architecture_test.go), and the files, make targets, flags and environment
// variables that README.md and every page here name (docs_test.go).
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
	"strconv"
	"strings"
	"testing"
)

// The conventions are stated at the top of architecture.md; in short: a code
// span ending in .go is a file, and the code spans right after it on the
// same line (separated only by spaces, commas, "/" or "→") are names it
// declares, Type.method or Name.

const (
	docPath  = "architecture.md"
	repoRoot = ".."
)

var (
	codeSpan  = regexp.MustCompile("`([^`\n]+)`")
	goFile    = regexp.MustCompile(`^[A-Za-z0-9_.\-/]+\.go$`)
	dirPath   = regexp.MustCompile(`^[A-Za-z0-9_.\-/]+/$`)
	separator = regexp.MustCompile(`^[\s,/→]*$`)
	name      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)
	typeDot   = regexp.MustCompile(`^[A-Z][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$`) // Type.method, Type.Field
	stepLine  = regexp.MustCompile(`^\d+\. `)
	window    = regexp.MustCompile("\\*\\*crash window\\*\\* `([^`]+)`")
)

// ref is a file named on a line of the doc, with the names after it.
type ref struct {
	line  int
	file  string
	names []string
}

// parseDoc returns the file references and directory references of
// architecture.md's text doc, and the malformed ones.
func parseDoc(doc string) (refs []ref, dirs []ref, bad []string) {
	return parseDocAt(doc, docPath, true)
}

// parseDocAt is parseDoc for the doc at path. strict holds it to
// architecture.md's conventions: a code span after a file's names that is
// not a name, or a Type.name without its file, is malformed. Otherwise such
// a span only ends the file's list of names.
func parseDocAt(doc, path string, strict bool) (refs []ref, dirs []ref, bad []string) {
	for i, line := range strings.Split(doc, "\n") {
		cur := -1 // the index in refs of the file whose names may follow
		prevEnd := 0
		for _, m := range codeSpan.FindAllStringSubmatchIndex(line, -1) {
			span := line[m[2]:m[3]]
			between := line[prevEnd:m[0]]
			prevEnd = m[1]
			switch {
			case goFile.MatchString(span):
				refs = append(refs, ref{line: i + 1, file: span})
				cur = len(refs) - 1
			case cur >= 0 && separator.MatchString(between):
				if !name.MatchString(span) {
					if strict {
						bad = append(bad, fmt.Sprintf("%s:%d: `%s` follows `%s` but is not a name (Type.method or Name); put other text between them", path, i+1, span, refs[cur].file))
					}
					cur = -1
					continue
				}
				refs[cur].names = append(refs[cur].names, span)
			default:
				cur = -1
				switch {
				case dirPath.MatchString(span):
					dirs = append(dirs, ref{line: i + 1, file: span})
				case strict && typeDot.MatchString(span):
					bad = append(bad, fmt.Sprintf("%s:%d: `%s` is named without its file, so nothing checks it: put it right after its file (`path/to/file.go` `%s`), or name it in words", path, i+1, span, span))
				}
			}
		}
	}
	return refs, dirs, bad
}

// decls is what one Go file declares.
type decls struct {
	top     map[string]bool     // functions, types, consts, vars
	methods map[string]bool     // "Type.method"
	hits    map[string][]string // function or "Type.method" → failpoint constants it Hits
	file    *ast.File           // for the failpoint constants
}

func parseGo(path string) (*decls, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	d := &decls{top: map[string]bool{}, methods: map[string]bool{}, hits: map[string][]string{}, file: f}
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			fn := decl.Name.Name
			if decl.Recv != nil && len(decl.Recv.List) == 1 {
				fn = receiverType(decl.Recv.List[0].Type) + "." + fn
				d.methods[fn] = true
			} else {
				d.top[fn] = true
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				if c, ok := failpointHit(n); ok {
					d.hits[fn] = append(d.hits[fn], c)
				}
				return true
			})
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.TypeSpec:
					d.top[spec.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range spec.Names {
						d.top[n.Name] = true
					}
				}
			}
		}
	}
	return d, nil
}

// receiverType is the name of a receiver's type: T for T, *T, T[A] and *T[A, B].
func receiverType(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}

// failpointHit reports the constant n passes, when n is failpoint.Hit(failpoint.C, …).
func failpointHit(n ast.Node) (string, bool) {
	call, ok := n.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 || !isSelector(call.Fun, "failpoint", "Hit") {
		return "", false
	}
	arg, ok := call.Args[0].(*ast.SelectorExpr)
	if !ok || !isSelector(arg, "failpoint", "") {
		return "", false
	}
	return arg.Sel.Name, true
}

func isSelector(e ast.Expr, pkg, sel string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == pkg && (sel == "" || s.Sel.Name == sel)
}

// files resolves and parses the files the doc names, once each.
type files struct {
	parsed map[string]*decls
	errs   map[string]error
	dirs   map[string]string // a dependency's package import path → its directory
}

// locate returns where file is on disk: under the repository root, or, when
// its first element holds a dot, in the dependency go list finds.
func (fc *files) locate(file string) (string, error) {
	first, _, _ := strings.Cut(file, "/")
	if !strings.Contains(first, ".") {
		return filepath.Join(repoRoot, filepath.FromSlash(file)), nil
	}
	pkg := filepath.ToSlash(filepath.Dir(file))
	dir, ok := fc.dirs[pkg]
	if !ok {
		cmd := exec.Command("go", "list", "-f", "{{.Dir}}", pkg)
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				err = fmt.Errorf("%v: %s", err, strings.TrimSpace(string(ee.Stderr)))
			}
			return "", fmt.Errorf("go list %s: %w", pkg, err)
		}
		dir = strings.TrimSpace(string(out))
		fc.dirs[pkg] = dir
	}
	return filepath.Join(dir, filepath.Base(file)), nil
}

func (fc *files) get(file string) (*decls, error) {
	if d, ok := fc.parsed[file]; ok {
		return d, fc.errs[file]
	}
	path, err := fc.locate(file)
	var d *decls
	if err == nil {
		if _, err = os.Stat(path); err == nil {
			d, err = parseGo(path)
		} else if os.IsNotExist(err) {
			err = fmt.Errorf("no such file (looked at %s)", path)
		}
	}
	fc.parsed[file], fc.errs[file] = d, err
	return d, err
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestArchitectureReferences fails for every file architecture.md names that
// does not exist, and every name it gives a file that the file does not
// declare.
func TestArchitectureReferences(t *testing.T) {
	doc := readDoc(t)
	refs, dirs, bad := parseDoc(doc)
	for _, b := range bad {
		t.Error(b)
	}
	names := 0
	for _, r := range refs {
		names += len(r.names)
	}
	if len(refs) == 0 || names == 0 {
		t.Fatalf("%s names %d files and %d functions or types: the check checks nothing (see the conventions at its top)", docPath, len(refs), names)
	}
	fc := &files{parsed: map[string]*decls{}, errs: map[string]error{}, dirs: map[string]string{}}
	for _, r := range refs {
		d, err := fc.get(r.file)
		if err != nil {
			t.Errorf("%s:%d: %s: %v", docPath, r.line, r.file, err)
			continue
		}
		for _, n := range r.names {
			switch {
			case strings.Contains(n, ".") && !d.methods[n]:
				t.Errorf("%s:%d: %s declares no method %s", docPath, r.line, r.file, n)
			case !strings.Contains(n, ".") && !d.top[n]:
				t.Errorf("%s:%d: %s declares no top-level function, type, const or var %s", docPath, r.line, r.file, n)
			}
		}
	}
	for _, r := range dirs {
		if st, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(r.file))); err != nil || !st.IsDir() {
			t.Errorf("%s:%d: no directory %s", docPath, r.line, r.file)
		}
	}
	t.Logf("%d files (%d distinct), %d names, %d directories checked", len(refs), len(fc.parsed), names, len(dirs))
}

// TestArchitectureSteps fails for a numbered step of "One message's path"
// that names no file with a function or type of it.
func TestArchitectureSteps(t *testing.T) {
	doc := readDoc(t)
	lines := strings.Split(doc, "\n")
	in, steps := false, 0
	for i, line := range lines {
		if strings.HasPrefix(line, "## ") {
			in = strings.HasPrefix(line, "## One message's path")
			continue
		}
		if !in || !stepLine.MatchString(line) {
			continue
		}
		steps++
		refs, _, _ := parseDoc(line)
		named := false
		for _, r := range refs {
			named = named || len(r.names) > 0
		}
		if !named {
			t.Errorf("%s:%d: step names no file with a function or type of it: %q", docPath, i+1, line)
		}
	}
	if steps == 0 {
		t.Fatalf(`%s has no numbered steps under "## One message's path"`, docPath)
	}
}

// TestArchitectureCrashWindows fails for a crash window of pkg/failpoint
// that has no "**crash window** `name`" line, and for such a line that does
// not name every function that hits its window.
func TestArchitectureCrashWindows(t *testing.T) {
	windows := failpointWindows(t) // constant → name
	sites := hitSites(t)           // constant → "file Func"
	if len(windows) == 0 || len(sites) == 0 {
		t.Fatalf("found %d crash windows and %d failpoint.Hit calls: the check checks nothing", len(windows), len(sites))
	}
	byName := map[string]string{}
	for c, n := range windows {
		byName[n] = c
	}
	doc := readDoc(t)
	placed := map[string]bool{}
	for i, line := range strings.Split(doc, "\n") {
		m := window.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		c, ok := byName[m[1]]
		if !ok {
			t.Errorf("%s:%d: %q is not a crash window of pkg/failpoint", docPath, i+1, m[1])
			continue
		}
		placed[m[1]] = true
		refs, _, _ := parseDoc(line)
		named := map[string]bool{}
		for _, r := range refs {
			for _, n := range r.names {
				named[r.file+" "+n] = true
			}
		}
		for _, site := range sites[c] {
			if !named[site] {
				file, fn, _ := strings.Cut(site, " ")
				t.Errorf("%s:%d: crash window %s is hit in %s %s, which its line does not name (`%s` `%s`)", docPath, i+1, m[1], file, fn, file, fn)
			}
		}
		if len(sites[c]) == 0 {
			t.Errorf("%s:%d: nothing calls failpoint.Hit(failpoint.%s, …)", docPath, i+1, c)
		}
	}
	for _, n := range windows {
		if !placed[n] {
			t.Errorf("%s places no crash window %s: add a line with **crash window** `%s` where it sits", docPath, n, n)
		}
	}
}

// failpointWindows reads the crash windows from pkg/failpoint/failpoint.go:
// its constants of type Name.
func failpointWindows(t *testing.T) map[string]string {
	d, err := parseGo(filepath.Join(repoRoot, "pkg", "failpoint", "failpoint.go"))
	if err != nil {
		t.Fatal(err)
	}
	windows := map[string]string{}
	for _, decl := range d.file.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Name" {
				continue
			}
			for i, n := range v.Names {
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("failpoint.%s is not a string literal", n.Name)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				windows[n.Name] = s
			}
		}
	}
	return windows
}

// hitSites finds every failpoint.Hit call in the repository's non-test Go
// files, as "file Func" per failpoint constant.
func hitSites(t *testing.T) map[string][]string {
	sites := map[string][]string{}
	err := filepath.WalkDir(repoRoot, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := e.Name()
		if e.IsDir() {
			if path != repoRoot && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(base, ".go") || strings.HasSuffix(base, "_test.go") {
			return nil
		}
		d, err := parseGo(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repoRoot, path)
		if err != nil {
			return err
		}
		for fn, consts := range d.hits {
			for _, c := range consts {
				sites[c] = append(sites[c], filepath.ToSlash(rel)+" "+fn)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sites
}
