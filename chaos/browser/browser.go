// Package browser drives headless Chromium for the browser tests (the live
// page's in dashboard/, the console's in chaos/e2e): it finds the browser,
// starts it, and saves screenshots where the docs show them.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/procs"
)

// Chromium returns the headless browser to drive, or skips the test when
// none is installed, unless REQUIRE_CHROMIUM=1 makes that a failure (CI).
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const hint = "no chromium on PATH (Debian: apt-get install chromium)"
	if os.Getenv("REQUIRE_CHROMIUM") == "1" {
		t.Fatal(hint + ", and REQUIRE_CHROMIUM=1")
	}
	t.Skip(hint + "; set REQUIRE_CHROMIUM=1 to make this a failure")
	return ""
}

// Start starts chrome with a window of width×height, outside any
// deadline, until the test ends, and returns its context: a tab, or the
// parent of the tabs chromedp.NewContext opens.
func Start(t testing.TB, chrome string, width, height int) context.Context {
	t.Helper()
	alloc, stopAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.WindowSize(width, height))...)
	t.Cleanup(stopAlloc)
	browser, stopBrowser := chromedp.NewContext(alloc)
	t.Cleanup(stopBrowser)
	require.NoError(t, chromedp.Do(browser))
	return browser
}

// Screenshot saves tab's whole page as name: into docs/ with
// UPDATE_SCREENSHOT=1 (the docs show them), else into the test's temp
// dir, so a test run leaves the work tree as it was.
func Screenshot(t testing.TB, tab context.Context, name string) {
	t.Helper()
	shot, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), name)
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		root, err := procs.ModuleRoot()
		require.NoError(t, err)
		path = filepath.Join(root, "docs", name)
	}
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
}
