//go:build unix

package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnsureDirRefusesAnotherUsersFolder: a sessions or logs folder owned by
// another user is refused even when its mode is private, since its owner can
// replace what the session reads back from it.
func TestEnsureDirRefusesAnotherUsersFolder(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("needs root to give a folder to another user")
	}
	dir := filepath.Join(t.TempDir(), "sessions")
	if err := ensureDir(dir); err != nil {
		t.Fatalf("own folder refused: %v", err)
	}
	if err := os.Chown(dir, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	err := ensureDir(dir)
	if err == nil || !strings.Contains(err.Error(), "owned by another user (uid 12345)") {
		t.Fatalf("another user's folder: %v", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Fatalf("not one line: %q", err)
	}
}
