package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestDetachRefusesABadName: run --detach opens the host's log, named
// after the session, before the host starts: a name that is not one (a
// path) is refused first, and nothing is written outside the logs folder.
func TestDetachRefusesABadName(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	ws := t.TempDir()
	out := filepath.Join(t.TempDir(), "elsewhere")
	name := "/" + strings.Repeat("../", 30) + out[1:]
	_, stderr, code := c.Run(t, "", "run", "--detach", "--preflight", "off", "--name", name, ws)
	if code == 0 {
		t.Fatal("run --detach accepted a session name that is a path")
	}
	if !strings.Contains(stderr, "session name") {
		t.Errorf("the error does not say what is wrong: %s", stderr)
	}
	if _, err := os.Stat(out + ".log"); err == nil {
		t.Errorf("run --detach --name %q wrote %s.log", name, out)
	}
}
