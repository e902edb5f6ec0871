package alpine_test

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

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// writeAPK builds a package with files and returns its path and lock entry.
func writeAPK(t *testing.T, files []alpinetest.File) (string, alpine.LockedPackage) {
	b, p := buildAPK(t, alpinetest.Spec{Name: "x", Version: "1-r0", Arch: "x86_64", Files: files})
	path := filepath.Join(t.TempDir(), p.File())
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, alpine.LockedPackage{Name: p.Name, Version: p.Version, Arch: p.Arch, Repo: "main", Checksum: p.Checksum, Size: p.Size}
}

func TestExtractEntries(t *testing.T) {
	t.Parallel()
	path, lp := writeAPK(t, []alpinetest.File{
		{Name: "bin/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Mode: 0o4755, Body: []byte("elf"), PAX: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02", "APK-TOOLS.checksum.SHA1": "x"}},
		{Name: "bin/sh", Type: tar.TypeSymlink, Link: "/bin/busybox"},
		{Name: "bin/ash", Type: tar.TypeLink, Link: "bin/busybox"},
		{Name: "./etc/motd", Body: []byte("hi")},
		{Name: ".", Type: tar.TypeDir, Mode: 0o755}, // the root itself: skipped
	})
	var m memFS
	if err := alpine.Extract(path, "x86_64", lp, testRing(t), &m); err != nil {
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
	t.Parallel()
	cases := []struct {
		name  string
		files []alpinetest.File
	}{
		{"dot-dot", []alpinetest.File{{Name: "../etc/passwd", Body: []byte("x")}}},
		{"inner dot-dot", []alpinetest.File{{Name: "usr/../../x", Body: []byte("x")}}},
		{"absolute", []alpinetest.File{{Name: "/etc/passwd", Body: []byte("x")}}},
		{"through a symlink", []alpinetest.File{{Name: "etc", Type: tar.TypeSymlink, Link: "/host/etc"}, {Name: "etc/passwd", Body: []byte("x")}}},
		{"hard link outside", []alpinetest.File{{Name: "x", Type: tar.TypeLink, Link: "../../etc/shadow"}}},
		{"hard link to nothing", []alpinetest.File{{Name: "x", Type: tar.TypeLink, Link: "etc/shadow"}}},
		{"char device", []alpinetest.File{{Name: "dev/mem", Type: tar.TypeChar}}},
		{"fifo", []alpinetest.File{{Name: "p", Type: tar.TypeFifo}}},
		{"root as a file", []alpinetest.File{{Name: ".", Body: []byte("x")}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, lp := writeAPK(t, c.files)
			var m memFS
			err := alpine.Extract(path, "x86_64", lp, testRing(t), &m)
			if !errors.Is(err, alpine.ErrUnsafePath) || !strings.Contains(err.Error(), "x-1-r0.apk") {
				t.Fatalf("error %v, want ErrUnsafePath naming the package", err)
			}
		})
	}
}

// TestExtractVerifiesFirst: a package whose data was swapped hands out no
// entry at all.
func TestExtractVerifiesFirst(t *testing.T) {
	t.Parallel()
	path, lp := writeAPK(t, []alpinetest.File{{Name: "a", Body: []byte("honest")}})
	b, _ := os.ReadFile(path)
	other, _ := buildAPK(t, alpinetest.Spec{Name: "x", Version: "1-r0", Arch: "x86_64", Files: []alpinetest.File{{Name: "a", Body: []byte("evil!!")}}})
	head := len(b) - len(dataMember(t, b))
	b = append(b[:head:head], dataMember(t, other)...)
	os.WriteFile(path, b, 0o644)
	lp.Size = int64(len(b))
	var m memFS
	if err := alpine.Extract(path, "x86_64", lp, testRing(t), &m); !errors.Is(err, alpine.ErrChecksum) || len(m.entries) != 0 {
		t.Fatalf("error %v, %d entries handed out", err, len(m.entries))
	}
}

// TestNoarchPackage: a noarch package (.PKGINFO arch = noarch) is listed
// under the repository's arch in the index and verifies there.
func TestNoarchPackage(t *testing.T) {
	t.Parallel()
	b, p := buildAPK(t, alpinetest.Spec{Name: "docs", Version: "1-r0", Arch: "x86_64", PKGINFOArch: "noarch"})
	path := filepath.Join(t.TempDir(), p.File())
	os.WriteFile(path, b, 0o644)
	lp := alpine.LockedPackage{Name: p.Name, Version: p.Version, Arch: "x86_64", Repo: "main", Checksum: p.Checksum, Size: p.Size}
	if err := alpine.VerifyFile(path, "x86_64", lp, testRing(t)); err != nil {
		t.Fatal(err)
	}
}

// TestMemberBoundCoversTrailingData: bytes after a member's tar stream
// count toward the member's decompressed bound, so a small signature
// member cannot expand without limit.
func TestMemberBoundCoversTrailingData(t *testing.T) {
	t.Parallel()
	var raw bytes.Buffer
	zw := gzip.NewWriter(&raw)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: ".SIGN.RSA." + testKeyName, Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("sig"))
	tw.Close()
	zw.Write(make([]byte, 2*alpine.MaxSignatures*(alpine.MaxSignature+4096))) // zeros after the tar end
	zw.Close()
	_, err := alpine.ReadIndex("APKINDEX.tar.gz", "main", "x86_64", bytes.NewReader(raw.Bytes()), testRing(t))
	if err == nil || !strings.Contains(err.Error(), "larger than vibedom accepts") {
		t.Fatalf("err %v", err)
	}
}
