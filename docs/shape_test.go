package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the library or the services: a reader
// follows one without scrolling (a long one is steps to name).
const maxFuncLines = 80

// TestNoLongFunctions fails for each function in pkg/ and services/
// (tests aside) longer than maxFuncLines, from its func line to its brace.
func TestNoLongFunctions(t *testing.T) {
	seen := 0
	for _, dir := range []string{"pkg", "services"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				seen++
				start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
				if n := end.Line - start.Line + 1; n > maxFuncLines {
					rel, _ := filepath.Rel(repoRoot, path)
					t.Errorf("%s:%d: %s is %d lines, over %d: name its steps", rel, start.Line, fn.Name.Name, n, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if seen < 500 {
		t.Fatalf("only %d functions found in pkg/ and services/: the check checks nothing", seen)
	}
}
