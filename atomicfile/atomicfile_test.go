package atomicfile

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// temps lists the temporary files left in dir.
func temps(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func readMode(t *testing.T, p string) (string, os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), fi.Mode().Perm()
}

func TestWriteFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b, mode := readMode(t, p); b != "two" || mode != 0o640 {
		t.Errorf("got %q %v, want %q %v", b, mode, "two", os.FileMode(0o640))
	}
	// A failure (the target is a folder) leaves the folder and no
	// temporary file.
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if err := WriteFile(filepath.Join(dir, "sub"), []byte("x"), 0o600); err == nil {
		t.Error("replaced a folder")
	}
	// A failure mid-way (a folder we cannot write to) leaves the old
	// content.
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o755)
	os.WriteFile(filepath.Join(ro, "f"), []byte("old"), 0o644)
	os.Chmod(ro, 0o555)
	defer os.Chmod(ro, 0o755)
	if os.Geteuid() != 0 {
		err := WriteFile(filepath.Join(ro, "f"), []byte("new"), 0o644)
		if err == nil || !strings.Contains(err.Error(), filepath.Join(ro, "f")) {
			t.Errorf("wrote into a read-only folder, or the error does not name the path: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(ro, "f")); string(b) != "old" {
			t.Errorf("old content lost: %q", b)
		}
	}
	if left := temps(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		old    string // "" for no file before
		commit bool
		want   string // "" for absent after
	}{
		{name: "commit creates", commit: true, want: "new"},
		{name: "commit replaces", old: "old", commit: true, want: "new"},
		{name: "abort leaves nothing", commit: false},
		{name: "abort keeps the old", old: "old", commit: false, want: "old"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "image.ext4")
			if tt.old != "" {
				os.WriteFile(p, []byte(tt.old), 0o644)
			}
			f, err := New(p, 0o444)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(f.Name()) != dir || f.Name() == p || f.Path() != p {
				t.Errorf("temporary file %s (final %s): want a name of its own in %s", f.Name(), f.Path(), dir)
			}
			// Streamed, sought and read back, as an image builder does.
			io.WriteString(f, "nXw")
			f.WriteAt([]byte("e"), 1)
			f.Seek(0, io.SeekStart)
			if b, _ := io.ReadAll(f); string(b) != "new" {
				t.Errorf("read back %q", b)
			}
			// Nothing is visible at the final path before Commit.
			if b, err := os.ReadFile(p); tt.old == "" && err == nil || tt.old != "" && string(b) != tt.old {
				t.Errorf("before commit the final path holds %q (%v)", b, err)
			}
			if tt.commit {
				if err := f.Commit(); err != nil {
					t.Fatal(err)
				}
				if err := f.Commit(); !errors.Is(err, ErrDone) {
					t.Errorf("second Commit: %v, want ErrDone", err)
				}
			}
			f.Abort()
			f.Abort()
			b, err := os.ReadFile(p)
			switch {
			case tt.want == "" && err == nil:
				t.Errorf("the final path exists: %q", b)
			case tt.want != "" && string(b) != tt.want:
				t.Errorf("the final path holds %q (%v), want %q", b, err, tt.want)
			}
			if tt.commit {
				if _, mode := readMode(t, p); mode != 0o444 {
					t.Errorf("mode %v, want 0444", mode)
				}
			}
			if left := temps(t, dir); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

func TestCommitAfterAbort(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "f")
	f, err := New(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Abort()
	if err := f.Commit(); !errors.Is(err, ErrDone) {
		t.Errorf("Commit after Abort: %v, want ErrDone", err)
	}
	if _, err := os.Stat(p); err == nil {
		t.Error("Commit after Abort made the file")
	}
}

func TestCommitFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "sub")
	os.Mkdir(p, 0o755)
	os.WriteFile(filepath.Join(p, "keep"), nil, 0o644)
	f, err := New(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("x")
	if err := f.Commit(); err == nil {
		t.Fatal("a file replaced a non-empty folder")
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		t.Errorf("the folder is gone: %v", err)
	}
	if left := temps(t, dir); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestCrashBeforeCommit kills a writer half-way: the final path keeps its
// old content, and only a temporary file of another name is left.
func TestCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	if p := os.Getenv("ATOMICFILE_CRASH"); p != "" {
		f, err := New(p, 0o644)
		if err != nil {
			os.Exit(3)
		}
		f.WriteString("half of the new")
		f.Sync()
		os.Exit(2) // no Commit, no Abort, no deferred cleanup
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	os.WriteFile(p, []byte("old"), 0o644)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestCrashBeforeCommit$")
	cmd.Env = append(os.Environ(), "ATOMICFILE_CRASH="+p)
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("the writer did not crash as planned: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("after a crash the final path holds %q, want the old content", b)
	}
	if left := temps(t, dir); len(left) != 1 || !strings.HasPrefix(left[0], ".state.json.tmp-") {
		t.Errorf("temporary files left: %v, want one named .state.json.tmp-*", left)
	}
}

func TestMove(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	part := filepath.Join(dir, "partial", "pkg.part")
	final := filepath.Join(dir, "pkg")
	os.Mkdir(filepath.Dir(part), 0o755)
	os.WriteFile(part, []byte("all of it"), 0o644)
	os.WriteFile(final, []byte("stale"), 0o644)
	if err := Move(part, final); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(final); string(b) != "all of it" {
		t.Errorf("moved file holds %q", b)
	}
	if _, err := os.Stat(part); err == nil {
		t.Error("the source is still there")
	}
	if err := Move(part, final); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("moving a missing file: %v, want ErrNotExist", err)
	}
	if b, _ := os.ReadFile(final); string(b) != "all of it" {
		t.Errorf("a failed move changed the target: %q", b)
	}
}
