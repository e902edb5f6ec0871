package initramfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sampleArchive returns an archive exercising every member kind, the name
// and data padding cases (lengths 0 to 5), special mode bits and owners.
func sampleArchive(t *testing.T) (*Archive, map[string]Entry) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "source.bin")
	if err := os.WriteFile(src, []byte("from a host file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	entries := []Entry{
		{Name: "bin/busybox", Mode: 0o755, Data: []byte("\x7fELF pretend")},
		{Name: "bin/sh", Mode: fs.ModeSymlink | 0o777, Data: []byte("/bin/busybox")},
		{Name: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Name: "root", Mode: fs.ModeDir | 0o700},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{Name: "etc/shadow", Mode: 0o600, UID: 0, GID: 42, Data: []byte("root:*:1::::::\n")},
		{Name: "usr/bin/su", Mode: fs.ModeSetuid | 0o755, Data: []byte("su")},
		{Name: "srv/shared", Mode: fs.ModeDir | fs.ModeSetgid | 0o775, UID: 1000, GID: 1000},
		{Name: "home/u/.profile", Mode: 0o644, UID: 1000, GID: 1000, Data: []byte("export A=1\n")},
		{Name: "empty", Mode: 0o644},
		{Name: "d/a", Mode: 0o644, Data: []byte("1")},
		{Name: "d/ab", Mode: 0o644, Data: []byte("12")},
		{Name: "d/abc", Mode: 0o644, Data: []byte("123")},
		{Name: "d/abcd", Mode: 0o644, Data: []byte("1234")},
		{Name: "d/abcde", Mode: 0o644, Data: []byte("12345")},
		{Name: "d-sibling/x", Mode: 0o644, Data: []byte("sorts after d/")},
		{Name: "/abs/name", Mode: 0o644, Data: []byte("leading slash dropped")},
		{Name: "lib/copied", Mode: 0o640, Source: src},
	}
	var ar Archive
	want := map[string]Entry{}
	for _, e := range entries {
		if err := ar.Add(e); err != nil {
			t.Fatalf("Add(%s): %v", e.Name, err)
		}
		n := strings.TrimPrefix(e.Name, "/")
		if e.Source != "" {
			e.Data, _ = os.ReadFile(e.Source)
		}
		want[n] = e
	}
	return &ar, want
}

func TestArchiveRoundTrip(t *testing.T) {
	t.Parallel()
	ar, want := sampleArchive(t)
	data, err := ar.Bytes()
	if err != nil {
		t.Fatalf("Bytes: %v", err)
	}
	size, err := ar.Size()
	if err != nil {
		t.Fatalf("Size: %v", err)
	}
	if int64(len(data)) != size {
		t.Errorf("Size: got %d, want %d (bytes written)", size, len(data))
	}
	if len(data)%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", len(data))
	}
	if !bytes.Contains(data, []byte("TRAILER!!!\x00")) {
		t.Errorf("archive has no trailer")
	}
	got, err := ReadArchive(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("ReadArchive: %v", err)
	}
	seen := map[string]bool{}
	for i, e := range got {
		// Every parent comes before its child.
		for d := filepath.Dir(e.Name); d != "."; d = filepath.Dir(d) {
			if !seen[d] {
				t.Errorf("member %d %q comes before its parent %q", i, e.Name, d)
			}
		}
		if seen[e.Name] {
			t.Errorf("member %q written twice", e.Name)
		}
		seen[e.Name] = true
	}
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(got, func(e Entry) bool { return e.Name == name })
			if i < 0 {
				t.Fatalf("member missing")
			}
			g := got[i]
			if g.Mode != w.Mode {
				t.Errorf("mode: got %v, want %v", g.Mode, w.Mode)
			}
			if g.UID != w.UID || g.GID != w.GID {
				t.Errorf("owner: got %d:%d, want %d:%d", g.UID, g.GID, w.UID, w.GID)
			}
			if !w.Mode.IsDir() && !bytes.Equal(g.Data, w.Data) {
				t.Errorf("data: got %q, want %q", g.Data, w.Data)
			}
		})
	}
	t.Run("implicit parents", func(t *testing.T) {
		for _, d := range []string{"bin", "etc", "usr", "usr/bin", "home", "home/u", "d", "abs", "lib"} {
			i := slices.IndexFunc(got, func(e Entry) bool { return e.Name == d })
			if i < 0 {
				t.Errorf("parent %q missing", d)
				continue
			}
			if got[i].Mode != fs.ModeDir|0o755 || got[i].UID != 0 {
				t.Errorf("parent %q: got mode %v uid %d, want %v uid 0", d, got[i].Mode, got[i].UID, fs.ModeDir|0o755)
			}
		}
	})
}

func TestArchiveDeterministic(t *testing.T) {
	t.Parallel()
	a, _ := sampleArchive(t)
	want, err := a.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	// The same members added in reverse order, with a replaced one.
	var b Archive
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	slices.Reverse(names)
	if err := b.File("etc/passwd", 0o600, []byte("replaced")); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := b.Add(*a.entries[n]); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("archives of the same members differ (%d vs %d bytes)", len(got), len(want))
	}
	again, err := a.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, want) {
		t.Errorf("writing the same archive twice gave different bytes")
	}
}

func TestArchiveRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		add  []Entry
	}{
		{"dot dot", []Entry{{Name: "../etc/passwd", Mode: 0o644}}},
		{"inner dot dot", []Entry{{Name: "a/../../b", Mode: 0o644}}},
		{"unclean", []Entry{{Name: "a//b", Mode: 0o644}}},
		{"dot", []Entry{{Name: ".", Mode: fs.ModeDir | 0o755}}},
		{"empty", []Entry{{Name: "", Mode: 0o644}}},
		{"root", []Entry{{Name: "/", Mode: fs.ModeDir | 0o755}}},
		{"trailer name", []Entry{{Name: "TRAILER!!!", Mode: 0o644}}},
		{"NUL", []Entry{{Name: "a\x00b", Mode: 0o644}}},
		{"newline", []Entry{{Name: "a\nb", Mode: 0o644}}},
		{"device", []Entry{{Name: "dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666}}},
		{"fifo", []Entry{{Name: "p", Mode: fs.ModeNamedPipe | 0o644}}},
		{"missing source", []Entry{{Name: "x", Mode: 0o644, Source: "/nonexistent/vibedom-test"}}},
		{"directory source", []Entry{{Name: "x", Mode: 0o644, Source: "/"}}},
		{"symlink with source", []Entry{{Name: "x", Mode: fs.ModeSymlink | 0o777, Source: "/etc/hostname"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ar Archive
			var err error
			for _, e := range tt.add {
				if err = ar.Add(e); err != nil {
					break
				}
			}
			if err == nil {
				t.Errorf("Add accepted %q", tt.add[len(tt.add)-1].Name)
			}
		})
	}
	t.Run("file as parent", func(t *testing.T) {
		var ar Archive
		if err := ar.File("a", 0o644, nil); err != nil {
			t.Fatal(err)
		}
		if err := ar.File("a/b", 0o644, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ar.Bytes(); err == nil {
			t.Errorf("Bytes accepted a file under a regular file")
		}
	})
}

func TestReadArchiveConcatenated(t *testing.T) {
	t.Parallel()
	var base, session Archive
	if err := base.Symlink("init", "/usr/bin/vibedom-guest"); err != nil {
		t.Fatal(err)
	}
	if err := base.File("etc/hostname", 0o644, []byte("base")); err != nil {
		t.Fatal(err)
	}
	if err := session.File("init", 0o755, []byte("#!/bin/sh\n")); err != nil {
		t.Fatal(err)
	}
	b1, _ := base.Bytes()
	b2, _ := session.Bytes()
	tests := []struct {
		name string
		data []byte
	}{
		{"back to back", slices.Concat(b1, b2)},
		{"zero padding between", slices.Concat(b1, make([]byte, 512), b2)},
		{"zero padding after", slices.Concat(b1, b2, make([]byte, 12))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadArchive(bytes.NewReader(tt.data))
			if err != nil {
				t.Fatalf("ReadArchive: %v", err)
			}
			var names []string
			for _, e := range got {
				names = append(names, e.Name)
			}
			want := []string{"etc", "etc/hostname", "init", "init"}
			if !slices.Equal(names, want) {
				t.Errorf("members: got %v, want %v", names, want)
			}
			if last := got[len(got)-1]; last.Mode != 0o755 || string(last.Data) != "#!/bin/sh\n" {
				t.Errorf("overriding /init: got %v %q", last.Mode, last.Data)
			}
		})
	}
}

// TestReadArchiveMalformed feeds the reader hostile input: it must fail
// cleanly, without panicking or allocating what a header claims.
func TestReadArchiveMalformed(t *testing.T) {
	t.Parallel()
	var ar Archive
	ar.File("a", 0o644, []byte("hello"))
	good, _ := ar.Bytes()
	hdr := func(namesize, filesize uint32, name string) []byte {
		var b [cpioHeaderSize]byte
		copy(b[:], cpioMagic)
		f := [13]uint32{1, sIFREG | 0o644, 0, 0, 1, 0, filesize, 0, 0, 0, 0, namesize, 0}
		for i, v := range f {
			hex8(b[6+8*i:], v)
		}
		return append(b[:], name...)
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"truncated header", good[:50]},
		{"truncated data", good[:cpioHeaderSize+4+3]},
		{"bad magic", append([]byte("070707"), good[6:]...)},
		{"not hex", append(append([]byte(nil), good[:6]...), bytes.Repeat([]byte("zz"), 60)...)},
		{"name size zero", hdr(0, 0, "")},
		{"name size huge", hdr(1<<31, 0, "x\x00")},
		{"name not terminated", hdr(2, 0, "ab")},
		{"file size past end", hdr(2, 0xfffffff0, "a\x00\x00\x00\x00\x00\x00\x00short")},
		{"stray bytes", append(slices.Clone(good), 1, 2)},
		{"garbage", []byte("this is not a cpio archive at all, not even close")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadArchive(bytes.NewReader(tt.data))
			if !errors.Is(err, ErrBadArchive) {
				t.Errorf("ReadArchive: got %v, want ErrBadArchive", err)
			}
		})
	}
	t.Run("empty", func(t *testing.T) {
		got, err := ReadArchive(bytes.NewReader(nil))
		if err != nil || len(got) != 0 {
			t.Errorf("ReadArchive(empty): got %d members, %v", len(got), err)
		}
	})
}

func needCpio(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("GNU cpio not installed (apt-get install cpio)")
	}
	return p
}

// TestArchiveGNUCpio cross-checks the writer against GNU cpio: it lists and
// extracts what we write, and we read what it writes.
func TestArchiveGNUCpio(t *testing.T) {
	t.Parallel()
	cpio := needCpio(t)
	ar, want := sampleArchive(t)
	data, err := ar.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("list", func(t *testing.T) {
		cmd := exec.CommandContext(t.Context(), cpio, "-t", "--quiet")
		cmd.Stdin = bytes.NewReader(data)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -t: %v", err)
		}
		listed := strings.Fields(string(out))
		for name := range want {
			if !slices.Contains(listed, name) {
				t.Errorf("cpio -t does not list %q (listed %v)", name, listed)
			}
		}
	})
	t.Run("extract", func(t *testing.T) {
		dir := t.TempDir()
		cmd := exec.CommandContext(t.Context(), cpio, "-idm", "--quiet", "--no-absolute-filenames")
		cmd.Dir = dir
		cmd.Stdin = bytes.NewReader(data)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cpio -idm: %v: %s", err, out)
		}
		for name, w := range want {
			p := filepath.Join(dir, name)
			fi, err := os.Lstat(p)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			switch {
			case w.Mode.Type() == fs.ModeSymlink:
				target, err := os.Readlink(p)
				if err != nil || target != string(w.Data) {
					t.Errorf("%s: link to %q (%v), want %q", name, target, err, w.Data)
				}
			case w.Mode.IsDir():
				if !fi.IsDir() {
					t.Errorf("%s: got %v, want a directory", name, fi.Mode())
				}
			default:
				got, err := os.ReadFile(p)
				if err != nil || !bytes.Equal(got, w.Data) {
					t.Errorf("%s: content %q (%v), want %q", name, got, err, w.Data)
				}
			}
			// Permission bits survive (cpio applies no umask to -i as
			// root, and as non-root only the set-id bits may drop).
			if os.Geteuid() == 0 && w.Mode.Type() != fs.ModeSymlink && fi.Mode() != w.Mode {
				t.Errorf("%s: mode %v, want %v", name, fi.Mode(), w.Mode)
			}
		}
	})
	t.Run("read GNU archive", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o750); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("gnu cpio wrote me"), 0o640)
		os.Symlink("sub/f", filepath.Join(dir, "link"))
		cmd := exec.CommandContext(t.Context(), cpio, "-o", "-H", "newc", "--quiet")
		cmd.Dir = dir
		cmd.Stdin = strings.NewReader("sub\nsub/f\nlink\n")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -o: %v", err)
		}
		got, err := ReadArchive(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("ReadArchive(GNU cpio output): %v", err)
		}
		var desc []string
		for _, e := range got {
			desc = append(desc, fmt.Sprintf("%s %v %q", e.Name, e.Mode, e.Data))
		}
		wantDesc := []string{
			fmt.Sprintf("sub %v %q", fs.ModeDir|0o750, ""),
			fmt.Sprintf("sub/f %v %q", fs.FileMode(0o640), "gnu cpio wrote me"),
			fmt.Sprintf("link %v %q", fs.ModeSymlink|0o777, "sub/f"),
		}
		if !slices.Equal(desc, wantDesc) {
			t.Errorf("members:\ngot  %q\nwant %q", desc, wantDesc)
		}
	})
}

func TestComparePaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int
	}{
		{"a", "a", 0},
		{"a", "a/b", -1},
		{"a/b", "a-c", -1}, // bytewise "a-c" < "a/b"; by component "a" < "a-c"
		{"a/b", "a/c", -1},
		{"b", "a/z", 1},
		{"usr/bin/[", "usr/bin/[[", -1},
	}
	for _, tt := range tests {
		t.Run(tt.a+" vs "+tt.b, func(t *testing.T) {
			if got := comparePaths(tt.a, tt.b); got != tt.want {
				t.Errorf("comparePaths(%q, %q): got %d, want %d", tt.a, tt.b, got, tt.want)
			}
			if got := comparePaths(tt.b, tt.a); got != -tt.want {
				t.Errorf("comparePaths(%q, %q): got %d, want %d", tt.b, tt.a, got, -tt.want)
			}
		})
	}
}
