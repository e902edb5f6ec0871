package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "two" || fi.Mode().Perm() != 0o640 {
		t.Errorf("got %q %v", b, fi.Mode())
	}
	// A failure (the target is a folder) leaves the old content and no
	// temporary file.
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if err := WriteFile(filepath.Join(dir, "sub"), []byte("x"), 0o600); err == nil {
		t.Error("replaced a folder")
	}
	// A failure mid-way (a folder we cannot write to) leaves nothing.
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o755)
	os.WriteFile(filepath.Join(ro, "f"), []byte("old"), 0o644)
	os.Chmod(ro, 0o555)
	defer os.Chmod(ro, 0o755)
	if os.Geteuid() != 0 {
		if err := WriteFile(filepath.Join(ro, "f"), []byte("new"), 0o644); err == nil {
			t.Error("wrote into a read-only folder")
		}
		if b, _ := os.ReadFile(filepath.Join(ro, "f")); string(b) != "old" {
			t.Errorf("old content lost: %q", b)
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}
