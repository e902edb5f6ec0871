//go:build unix

package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBaselineManifest(t *testing.T) {
	t.Parallel()
	base := tree{
		"tracked.txt":   "file:tracked\n",
		"tracked2.txt":  "file:tracked 2\n",
		"dirty.txt":     "file:committed\n",
		"untracked.txt": "file:untracked\n",
		"keep.txt":      "file:keep\n",
		"link":          "link:keep.txt",
		"bin/x.sh":      "exec:#!/bin/sh\n",
	}
	have(t, "git")
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o755)
	writeTree(t, ws, base)
	mustRun(t, ws, "git", "init", "-q")
	mustRun(t, ws, "git", "add", "tracked.txt", "tracked2.txt", "dirty.txt", "keep.txt", "bin/x.sh")
	mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	writeFile(t, filepath.Join(ws, "dirty.txt"), "dirty at start\n", 0o644)
	bl, err := TakeBaseline(t.Context(), ws, filepath.Join(root, "baseline"), BaselineOptions{Mode: BaselineManifest})
	if err != nil {
		t.Fatal(err)
	}
	// The user works on the host during the session.
	writeFile(t, filepath.Join(ws, "tracked.txt"), "user edit\n", 0o644)
	os.Remove(filepath.Join(ws, "tracked2.txt"))
	writeFile(t, filepath.Join(ws, "dirty.txt"), "user edit\n", 0o644)
	writeFile(t, filepath.Join(ws, "untracked.txt"), "user edit\n", 0o644)
	writeFile(t, filepath.Join(ws, "created.txt"), "new\n", 0o644)
	bl, err = OpenBaseline(filepath.Join(root, "baseline"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path    string
		typ     FileType
		content string
		unknown bool
	}{
		{"tracked.txt", TypeFile, "tracked\n", false},    // from git
		{"tracked2.txt", TypeFile, "tracked 2\n", false}, // from git, though deleted
		{"keep.txt", TypeFile, "keep\n", false},          // unchanged on the host
		{"dirty.txt", TypeFile, "user edit\n", true},     // dirty at start, changed since: lost
		{"untracked.txt", TypeFile, "user edit\n", true}, // untracked, changed since: lost
		{"link", TypeSymlink, "", false},
		{"created.txt", "", "", false}, // did not exist at start
		{"bin", TypeDir, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			e, err := bl.Old(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if e.Type != tc.typ || string(e.Content) != tc.content || e.Unknown != tc.unknown {
				t.Errorf("got %s %q unknown=%v, want %s %q unknown=%v", e.Type, e.Content, e.Unknown, tc.typ, tc.content, tc.unknown)
			}
		})
	}
	if bl.Mode() != BaselineManifest {
		t.Errorf("mode: got %s", bl.Mode())
	}
}

// TestBaselineClone needs a file system with reflinks (btrfs, XFS, APFS):
// set VIBEDOM_REFLINK_DIR to a directory on one, else TMPDIR is tried.
func TestBaselineClone(t *testing.T) {
	t.Parallel()
	dir := os.Getenv("VIBEDOM_REFLINK_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else {
		var err error
		if dir, err = os.MkdirTemp(dir, "clone"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	ws := filepath.Join(dir, "ws")
	os.Mkdir(ws, 0o755)
	writeTree(t, ws, tree{"a.txt": "file:a\n", "d/b.txt": "file:b\n", "l": "link:a.txt", ".git/config": "file:x"})
	bl, err := TakeBaseline(t.Context(), ws, filepath.Join(dir, "baseline"), BaselineOptions{Mode: BaselineClone})
	if errors.Is(err, errCloneUnsupported) {
		t.Skipf("no copy-on-write clones on the file system of %s (set VIBEDOM_REFLINK_DIR)", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ws, "a.txt"), "changed\n", 0o644)
	os.RemoveAll(filepath.Join(ws, "d"))
	for p, want := range map[string]string{"a.txt": "a\n", "d/b.txt": "b\n"} {
		e, err := bl.Old(p)
		if err != nil || string(e.Content) != want || e.Unknown {
			t.Errorf("%s: got %q unknown=%v err=%v, want %q", p, e.Content, e.Unknown, err, want)
		}
	}
	if e, _ := bl.Old("l"); e.Type != TypeSymlink || e.Target != "a.txt" {
		t.Errorf("l: got %+v", e)
	}
}

// TestBaselineFallsBack: with no clone support the default mode is a
// manifest, silently.
func TestBaselineFallsBack(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	writeTree(t, ws, tree{"a": "file:a\n"})
	bl, err := TakeBaseline(t.Context(), ws, filepath.Join(t.TempDir(), "b"), BaselineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bl.Mode() != BaselineClone && bl.Mode() != BaselineManifest {
		t.Errorf("mode %q", bl.Mode())
	}
}

// makeBigTree writes n small files in directories of 100.
func makeBigTree(b testing.TB, dir string, n int) {
	for i := 0; i < n; i++ {
		p := filepath.Join(dir, fmt.Sprintf("d%03d", i/100), fmt.Sprintf("f%05d.txt", i))
		if i%100 == 0 {
			os.MkdirAll(filepath.Dir(p), 0o755)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat("x", 200)+fmt.Sprint(i)+"\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineManifest50k: a manifest of 50,000 files (git repo with
// everything committed, so blob ids are recorded too).
func BenchmarkBaselineManifest50k(b *testing.B) {
	ws := b.TempDir()
	makeBigTree(b, ws, 50_000)
	for _, withGit := range []bool{false, true} {
		name := "plain"
		if withGit {
			name = "git"
			mustRun(b, ws, "git", "init", "-q")
			mustRun(b, ws, "git", "add", "-A")
			mustRun(b, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := TakeBaseline(b.Context(), ws, filepath.Join(b.TempDir(), fmt.Sprint("b", i)), BaselineOptions{Mode: BaselineManifest}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkBaselineClone50k: a copy-on-write clone of 50,000 files; needs
// VIBEDOM_REFLINK_DIR on a reflink file system (or TMPDIR on one).
func BenchmarkBaselineClone50k(b *testing.B) {
	dir := os.Getenv("VIBEDOM_REFLINK_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	dir, err := os.MkdirTemp(dir, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ws := filepath.Join(dir, "ws")
	os.Mkdir(ws, 0o755)
	makeBigTree(b, ws, 50_000)
	for i := 0; b.Loop(); i++ {
		_, err := TakeBaseline(b.Context(), ws, filepath.Join(dir, fmt.Sprint("b", i)), BaselineOptions{Mode: BaselineClone})
		if errors.Is(err, errCloneUnsupported) {
			b.Skip("no copy-on-write clones here (set VIBEDOM_REFLINK_DIR)")
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
