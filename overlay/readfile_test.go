//go:build unix

package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadWorkspaceFile(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o644)
	os.MkdirAll(filepath.Join(ws, "d"), 0o755)
	os.WriteFile(filepath.Join(ws, "d", "f"), []byte("inside"), 0o644)
	os.WriteFile(filepath.Join(ws, "big"), make([]byte, 2048), 0o644)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(ws, "link"))
	os.Symlink(outside, filepath.Join(ws, "dirlink"))
	syscall.Mkfifo(filepath.Join(ws, "fifo"), 0o644)

	if b, err := ReadWorkspaceFile(ws, "d/f", 1024); err != nil || string(b) != "inside" {
		t.Fatalf("read d/f: %q %v", b, err)
	}
	tests := []struct{ rel, want string }{
		{"link", "symlink"},
		{"dirlink/secret", "symlink"},
		{"big", "larger than 1024 bytes"},
		{"fifo", "not a regular file"},
		{"../x", ""},
		{"/etc/passwd", ""},
		{"missing", "no such file"},
	}
	for _, tt := range tests {
		b, err := ReadWorkspaceFile(ws, tt.rel, 1024)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %q %v, want an error with %q", tt.rel, b, err, tt.want)
		}
		if errors.Is(err, ErrSymlinkInPath) != (tt.want == "symlink") {
			t.Errorf("%s: ErrSymlinkInPath mismatch: %v", tt.rel, err)
		}
	}
}
