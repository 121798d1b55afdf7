package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetPages are the pages whose Go code docs/snippets/snippets.go
// compiles: README.md's ```go blocks, and the code of the packages' doc.go.
var snippetPages = []string{
	"README.md",
	"pkg/inbox/doc.go",
	"pkg/inbox/inboxkafka/doc.go",
	"pkg/inbox/inboxadmin/doc.go",
	"pkg/outbox/doc.go",
	"pkg/effect/doc.go",
	"pkg/audit/doc.go",
}

// TestSnippetsCompile fails for each Go block of snippetPages that
// docs/snippets/snippets.go does not hold line for line (indentation
// aside): a block edited on its page alone, or one no compiled code backs.
func TestSnippetsCompile(t *testing.T) {
	compiled, err := os.ReadFile(filepath.Join(repoRoot, "docs", "snippets", "snippets.go"))
	if err != nil {
		t.Fatal(err)
	}
	have := "\n" + strings.Join(trimmed(strings.Split(string(compiled), "\n")), "\n") + "\n"
	blocks := 0
	for _, page := range snippetPages {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(page)))
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range goBlocks(page, string(b)) {
			blocks++
			if want := "\n" + strings.Join(trimmed(block), "\n") + "\n"; !strings.Contains(have, want) {
				t.Errorf("%s: this Go block is not in docs/snippets/snippets.go, so nothing compiles it:\n%s", page, strings.Join(block, "\n"))
			}
		}
	}
	if blocks < len(snippetPages) {
		t.Fatalf("%d Go blocks in %d pages: the check checks nothing", blocks, len(snippetPages))
	}
}

// goBlocks returns a page's Go blocks: a Markdown page's ```go fences, a
// Go file's doc-comment code (lines "//\t…", a block ending at a line that
// is not one).
func goBlocks(page, text string) [][]string {
	var blocks [][]string
	var cur []string
	in := false
	flush := func() {
		if len(cur) > 0 {
			blocks = append(blocks, cur)
		}
		cur, in = nil, false
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasSuffix(page, ".md") {
			switch {
			case strings.HasPrefix(line, "```go"):
				in = true
			case in && strings.HasPrefix(line, "```"):
				flush()
			case in:
				cur = append(cur, line)
			}
			continue
		}
		if code, ok := strings.CutPrefix(line, "//\t"); ok {
			cur = append(cur, code)
		} else {
			flush()
		}
	}
	flush()
	return blocks
}

// trimmed is lines without their indentation and without blank lines.
func trimmed(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l = strings.TrimLeft(l, " \t"); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// quotedFrom is a link to a file of the repository, as pattern.md names
// the file of the quote that follows it.
var quotedFrom = regexp.MustCompile(`\]\(\.\./([^)#]+)\)`)

// TestPatternQuotes fails for each Go block of pattern.md that the file
// linked last before it does not hold line for line (indentation aside): a
// quote that the code no longer says.
func TestPatternQuotes(t *testing.T) {
	b, err := os.ReadFile("pattern.md")
	if err != nil {
		t.Fatal(err)
	}
	quotes, file, in := 0, "", false
	var block []string
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```go"):
			in, block = true, nil
		case in && strings.HasPrefix(line, "```"):
			in = false
			quotes++
			if file == "" {
				t.Errorf("pattern.md:%d: a quote with no file linked before it", i+1)
				continue
			}
			src, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(file)))
			if err != nil {
				t.Errorf("pattern.md:%d: %v", i+1, err)
				continue
			}
			have := "\n" + strings.Join(trimmed(strings.Split(string(src), "\n")), "\n") + "\n"
			if want := "\n" + strings.Join(trimmed(block), "\n") + "\n"; !strings.Contains(have, want) {
				t.Errorf("pattern.md:%d: %s does not say this (any more):\n%s", i+1, file, strings.Join(block, "\n"))
			}
		case in:
			block = append(block, line)
		default:
			if m := quotedFrom.FindAllStringSubmatch(line, -1); m != nil {
				file = m[len(m)-1][1]
			}
		}
	}
	if quotes < 10 {
		t.Fatalf("pattern.md quotes %d blocks: the check checks little", quotes)
	}
}
