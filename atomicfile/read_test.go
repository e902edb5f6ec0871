package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadLimited(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("12345"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		max     int64
		want    string
		wantErr string
	}{
		{"fits", p, 5, "12345", ""},
		{"one byte too many", p, 4, "", "is larger than 4 bytes"},
		{"missing", filepath.Join(dir, "none"), 5, "", "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ReadLimited(tt.path, tt.max)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(b) != tt.want {
				t.Fatalf("ReadLimited = %q, %v; want %q", b, err, tt.want)
			}
		})
	}
	if _, err := ReadLimited(filepath.Join(dir, "none"), 1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: err = %v, want fs.ErrNotExist", err)
	}
}
