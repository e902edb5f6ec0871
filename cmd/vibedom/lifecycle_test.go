package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestLifecycleErrors: commands on a session that does not exist, or whose
// host is gone, give one line saying what to do.
func TestLifecycleErrors(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	for _, args := range [][]string{{"attach", "nope"}, {"status", "nope"}, {"exec", "nope", "--", "true"}, {"stop", "nope"}, {"pause", "nope"}, {"resume", "nope"}, {"recover", "nope"}} {
		_, stderr, code := c.Run(t, "", args...)
		msg := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "vibedom list") {
			t.Errorf("%v: exit %d, %q", args, code, msg)
		}
	}
	// A session whose state says running but whose process is gone.
	dir := filepath.Join(c.Home, "sessions", "ghost")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "scratch.img"), nil, 0o600)
	st := fmt.Sprintf(`{"name":"ghost","workspace":%q,"created":"2026-01-01T00:00:00Z","status":"running","pid":2147483646,"log_dir":%q,"control":"/nonexistent/x.sock"}`, t.TempDir(), t.TempDir())
	os.WriteFile(filepath.Join(dir, "state.json"), []byte(st), 0o600)
	out, _, _ := c.Run(t, "", "list")
	if !strings.Contains(out, "crashed, recoverable") {
		t.Errorf("list: %s", out)
	}
	for _, args := range [][]string{{"attach", "ghost"}, {"exec", "ghost", "--", "true"}, {"stop", "ghost"}, {"pause", "ghost"}, {"resume", "ghost"}} {
		_, stderr, code := c.Run(t, "", args...)
		msg := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "vibedom recover ghost") {
			t.Errorf("%v on a crashed session: exit %d, %q", args, code, msg)
		}
	}
	out, _, code := c.Run(t, "", "status", "ghost")
	if code != 0 || !strings.Contains(out, "vibedom recover ghost") {
		t.Errorf("status of a crashed session: exit %d\n%s", code, out)
	}
}
