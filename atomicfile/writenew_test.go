package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteNew(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "f")
	if err := WriteNew(p, []byte("one"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "one" {
		t.Fatalf("got %q %v", b, err)
	}
	if err := WriteNew(p, []byte("two"), 0o640); err == nil {
		t.Fatal("an existing file was overwritten")
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("the existing file changed: %q", b)
	}
}
