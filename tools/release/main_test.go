package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTarGzReproducible(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	os.WriteFile(a, []byte("binary"), 0o600)
	when := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	entries := func() []entry {
		return []entry{{"v/vibedom", a, 0o755}, {"v/README.md", a, 0o644}}
	}
	p1, p2 := filepath.Join(dir, "1.tar.gz"), filepath.Join(dir, "2.tar.gz")
	if err := writeTarGz(p1, entries(), when); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(a, time.Now(), time.Now())
	if err := writeTarGz(p2, entries(), when); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if !bytes.Equal(b1, b2) {
		t.Error("two archives of the same files differ")
	}
	gz, err := gzip.NewReader(bytes.NewReader(b1))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(when) {
			t.Errorf("%s: uid %d gid %d time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		got = append(got, h.Name+" "+strings.TrimLeft(h.FileInfo().Mode().String(), "-"))
	}
	want := []string{"v/ drwxr-xr-x", "v/README.md rw-r--r--", "v/vibedom rwxr-xr-x"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("entries %q, want %q", got, want)
	}
}

// TestSBOM reads this test binary's build information, as it would a
// release binary's.
func TestSBOM(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "sbom.json")
	if err := writeSBOM(p, exe, "vibedom_1.0.0_linux_amd64", "v1.0.0", time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	var doc spdxDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || len(doc.Packages) < 2 || doc.Packages[0].Checksums[0].Algorithm != "SHA256" {
		t.Errorf("SBOM %s", b)
	}
	if len(doc.Relationships) != len(doc.Packages) {
		t.Errorf("%d relationships for %d packages", len(doc.Relationships), len(doc.Packages))
	}
}
