package alpine

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeAPK builds a package with files and returns its path and lock entry.
func writeAPK(t *testing.T, files []tent) (string, LockedPackage) {
	b, p := buildAPK(t, apkSpec{name: "x", version: "1-r0", arch: "x86_64", files: files})
	path := filepath.Join(t.TempDir(), p.File())
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, LockedPackage{Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: "main", Checksum: p.Checksum, Size: p.Size}
}

func TestExtractEntries(t *testing.T) {
	path, lp := writeAPK(t, []tent{
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/busybox", mode: 0o4755, body: "elf", pax: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02", "APK-TOOLS.checksum.SHA1": "x"}},
		{name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/busybox"},
		{name: "bin/ash", typ: tar.TypeLink, link: "bin/busybox"},
		{name: "./etc/motd", body: "hi"},
		{name: ".", typ: tar.TypeDir, mode: 0o755}, // the root itself: skipped
	})
	var m memFS
	if err := Extract(path, "x86_64", lp, testRing(t), &m); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range m.entries {
		got = append(got, e.Path+":"+e.Linkname)
	}
	if strings.Join(got, " ") != "bin: bin/busybox: bin/sh:/bin/busybox bin/ash:bin/busybox etc/motd:" {
		t.Errorf("entries %v", got)
	}
	if x := m.entries[1].Xattrs; len(x) != 1 || x["security.capability"] != "\x01\x00\x00\x02" {
		t.Errorf("busybox xattrs %q", x)
	}
	if m.entries[1].Mode != 0o755|fs.ModeSetuid || m.content["etc/motd"] != "hi" {
		t.Errorf("busybox mode %v, motd %q", m.entries[1].Mode, m.content["etc/motd"])
	}
}

// TestExtractRefusesUnsafe: a validly signed package still cannot name
// paths outside the root, write through its own symlinks, link to what it
// does not hold, or carry device nodes.
func TestExtractRefusesUnsafe(t *testing.T) {
	cases := []struct {
		name  string
		files []tent
	}{
		{"dot-dot", []tent{{name: "../etc/passwd", body: "x"}}},
		{"inner dot-dot", []tent{{name: "usr/../../x", body: "x"}}},
		{"absolute", []tent{{name: "/etc/passwd", body: "x"}}},
		{"through a symlink", []tent{{name: "etc", typ: tar.TypeSymlink, link: "/host/etc"}, {name: "etc/passwd", body: "x"}}},
		{"hard link outside", []tent{{name: "x", typ: tar.TypeLink, link: "../../etc/shadow"}}},
		{"hard link to nothing", []tent{{name: "x", typ: tar.TypeLink, link: "etc/shadow"}}},
		{"char device", []tent{{name: "dev/mem", typ: tar.TypeChar}}},
		{"fifo", []tent{{name: "p", typ: tar.TypeFifo}}},
		{"root as a file", []tent{{name: ".", body: "x"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, lp := writeAPK(t, c.files)
			var m memFS
			err := Extract(path, "x86_64", lp, testRing(t), &m)
			if !errors.Is(err, ErrUnsafePath) || !strings.Contains(err.Error(), "x-1-r0.apk") {
				t.Fatalf("error %v, want ErrUnsafePath naming the package", err)
			}
		})
	}
}

// TestExtractVerifiesFirst: a package whose data was swapped hands out no
// entry at all.
func TestExtractVerifiesFirst(t *testing.T) {
	path, lp := writeAPK(t, []tent{{name: "a", body: "honest"}})
	b, _ := os.ReadFile(path)
	other, _ := buildAPK(t, apkSpec{name: "x", version: "1-r0", arch: "x86_64", files: []tent{{name: "a", body: "evil!!"}}})
	head := len(b) - len(dataMember(t, b))
	b = append(b[:head:head], dataMember(t, other)...)
	os.WriteFile(path, b, 0o644)
	lp.Size = int64(len(b))
	var m memFS
	if err := Extract(path, "x86_64", lp, testRing(t), &m); !errors.Is(err, ErrChecksum) || len(m.entries) != 0 {
		t.Fatalf("error %v, %d entries handed out", err, len(m.entries))
	}
}

func TestProgressRender(t *testing.T) {
	now := time.Unix(1000, 0)
	var tty bytes.Buffer
	p := &textProgress{w: &tty, tty: true, now: func() time.Time { return now }}
	p.Begin(2, 2<<20)
	now = now.Add(time.Second)
	p.Advance("a", 1<<20)
	p.End("a", nil)
	p.Close()
	if s := tty.String(); !strings.Contains(s, "\r[===============               ] 1/2  1.0 MiB/2.0 MiB  1.0 MiB/s  ETA 0:01") {
		t.Errorf("tty output %q", s)
	}
	var plain bytes.Buffer
	q := NewProgress(&plain, false)
	q.Begin(1, 10)
	q.Advance("a", 10)
	q.End("a-1-r0", nil)
	q.Close()
	if s := plain.String(); !strings.HasPrefix(s, "[1/1] a-1-r0\n1 packages, 10 B in ") || strings.Contains(s, "\r") {
		t.Errorf("plain output %q", s)
	}
}

// TestNoarchPackage: a noarch package (.PKGINFO arch = noarch) is listed
// under the repository's arch in the index and verifies there.
func TestNoarchPackage(t *testing.T) {
	b, p := buildAPK(t, apkSpec{name: "docs", version: "1-r0", arch: "x86_64", pkginfoArch: "noarch"})
	path := filepath.Join(t.TempDir(), p.File())
	os.WriteFile(path, b, 0o644)
	lp := LockedPackage{Name: p.Name, Version: p.Version, Arch: "x86_64", Repo: "main", Checksum: p.Checksum, Size: p.Size}
	if err := VerifyFile(path, "x86_64", lp, testRing(t)); err != nil {
		t.Fatal(err)
	}
}

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		o  Options
		ok bool
	}{
		{Options{Arch: "aarch64"}, true},
		{Options{Arch: "x86_64", Mirror: "http://mirror.example/alpine/"}, true},
		{Options{Arch: "armv7"}, false},
		{Options{Arch: "x86_64", Mirror: "file:///etc"}, false},
		{Options{Arch: "x86_64", Mirror: "mirror.example"}, false},
	} {
		n, err := c.o.normalized()
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.o, err)
			continue
		}
		if c.ok && (n.Branch != Branch || n.Keys == nil || strings.HasSuffix(n.Mirror, "/")) {
			t.Errorf("%+v normalized to %+v", c.o, n)
		}
	}
	t.Setenv(MirrorEnv, " https://m.example/alpine ")
	if MirrorFromEnv() != "https://m.example/alpine" {
		t.Errorf("MirrorFromEnv %q", MirrorFromEnv())
	}
	if a, err := GuestArch("arm64"); a != "aarch64" || err != nil {
		t.Errorf("GuestArch(arm64) = %q, %v", a, err)
	}
}

// TestMemberBoundCoversTrailingData: bytes after a member's tar stream
// count toward the member's decompressed bound, so a small signature
// member cannot expand without limit.
func TestMemberBoundCoversTrailingData(t *testing.T) {
	var raw bytes.Buffer
	zw := gzip.NewWriter(&raw)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: ".SIGN.RSA." + testKeyName, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("sig"))
	tw.Close()
	zw.Write(make([]byte, 2*maxSignatures*(maxSignature+4096))) // zeros after the tar end
	zw.Close()
	_, err := ReadIndex("APKINDEX.tar.gz", "main", "x86_64", bytes.NewReader(raw.Bytes()), testRing(t))
	if err == nil || !strings.Contains(err.Error(), "larger than vibedom accepts") {
		t.Fatalf("err %v", err)
	}
}
