package clitest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Git runs git with args in dir, away from the user's and the system's
// git configuration, and returns what it printed; it fails t if git fails.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// CommitAll makes ws a git repository with one commit, message msg, of
// everything in it, and returns the commit.
func CommitAll(t testing.TB, ws, msg string) string {
	t.Helper()
	Git(t, ws, "init", "-q")
	Git(t, ws, "add", "-A")
	Git(t, ws, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", msg)
	return strings.TrimSpace(Git(t, ws, "rev-parse", "HEAD"))
}
