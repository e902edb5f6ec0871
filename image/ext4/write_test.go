package ext4

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testTime = time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)

func file(content string, mode uint32) *Node {
	return &Node{Type: TypeFile, Meta: Meta{Mode: 0o644, ModTime: testTime}, Size: int64(len(content)),
		Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(content)), nil }}
}

func dir(ents ...Dirent) *Node {
	return &Node{Type: TypeDir, Meta: Meta{Mode: 0o755, ModTime: testTime}, Entries: ents}
}

func fsck(t *testing.T, img string) {
	t.Helper()
	out, err := exec.Command("/usr/sbin/e2fsck", "-fn", img).CombinedOutput()
	if err != nil {
		t.Fatalf("e2fsck -fn: %v\n%s", err, out)
	}
}

func writeImage(t *testing.T, root *Node, o Options) (string, Stats) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "img.ext4")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if o.UUID == ([16]byte{}) {
		o.UUID = [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	}
	if o.Time.IsZero() {
		o.Time = testTime
	}
	st, err := Write(f, root, o)
	if err != nil {
		t.Fatal(err)
	}
	return p, st
}

// loopMount mounts img with the kernel's ext4 on a fresh folder and
// unmounts it when the test ends (before the folder is removed). It
// returns "" when this machine cannot loop-mount.
func loopMount(t *testing.T, img, opts string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "ext4", "-o", opts, img, mnt).CombinedOutput(); err != nil {
		t.Logf("cannot loop-mount here (%v: %s): the kernel mount is not checked", err, out)
		return ""
	}
	t.Cleanup(func() {
		if err := unmount(mnt); err != nil {
			t.Error(err)
		}
	})
	return mnt
}

// unmount unmounts mnt, waiting while it is busy: a process another
// parallel test forks holds a copy of every open descriptor until it
// execs, so a mount whose files were just closed can stay busy for a
// moment on a loaded machine. After 30 s busy it detaches the mount
// lazily and reports who held it.
func unmount(mnt string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command("umount", mnt).CombinedOutput()
		if err == nil || strings.Contains(string(out), "not mounted") {
			return nil
		}
		if !strings.Contains(string(out), "busy") || time.Now().After(deadline) {
			held, _ := exec.Command("fuser", "-m", mnt).CombinedOutput()
			exec.Command("umount", "-l", mnt).Run()
			return fmt.Errorf("umount %s: %v %s\nheld by:\n%s", mnt, err, out, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func debugfs(t *testing.T, img, cmd string) string {
	t.Helper()
	out, err := exec.Command("/usr/sbin/debugfs", "-R", cmd, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs %s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

func TestWriteSmall(t *testing.T) {
	t.Parallel()
	hello := file("hello\n", 0o644)
	root := dir(
		Dirent{"etc", dir(Dirent{"hostname", file("vibedom\n", 0o644)})},
		Dirent{"hello", hello},
		Dirent{"hello-link", hello},
		Dirent{"sym", &Node{Type: TypeSymlink, Target: "hello", Meta: Meta{Mode: 0o777}}},
		Dirent{"longsym", &Node{Type: TypeSymlink, Target: strings.Repeat("x/", 100), Meta: Meta{Mode: 0o777}}},
		Dirent{"null", &Node{Type: TypeCharDev, Major: 1, Minor: 3, Meta: Meta{Mode: 0o666}}},
		Dirent{"big-minor", &Node{Type: TypeBlockDev, Major: 259, Minor: 70000, Meta: Meta{Mode: 0o600}}},
		Dirent{"fifo", &Node{Type: TypeFIFO, Meta: Meta{Mode: 0o600}}},
		Dirent{"empty", file("", 0o644)},
		Dirent{"ping", &Node{Type: TypeFile, Size: 3, Meta: Meta{Mode: 0o4755, UID: 100000, GID: 1000, Xattrs: map[string]string{"security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "user.note": "hi"}},
			Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("abc")), nil }}},
	)
	img, _ := writeImage(t, root, Options{Label: "vibedom-root"})
	fsck(t, img)
	if got := debugfs(t, img, "cat /etc/hostname"); !strings.Contains(got, "vibedom\n") {
		t.Errorf("cat: %q", got)
	}
	t.Log(debugfs(t, img, "ls -l /"))
	t.Log(debugfs(t, img, "stat /ping"))
	t.Log(debugfs(t, img, "ea_list /ping"))
}

// pattern yields n deterministic bytes.
type pattern struct{ n, off int64 }

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if int64(len(b)) > p.n-p.off {
		b = b[:p.n-p.off]
	}
	for i := range b {
		b[i] = byte((p.off + int64(i)) * 7 >> 3)
	}
	p.off += int64(len(b))
	return len(b), nil
}

func TestWriteBig(t *testing.T) {
	t.Parallel()
	const size = 300 << 20
	var ents []Dirent
	for i := 0; i < 5000; i++ {
		ents = append(ents, Dirent{strings.Repeat("n", 1+i%40) + "-" + itoa(i), file(itoa(i), 0o644)})
	}
	root := dir(
		Dirent{"many", dir(ents...)},
		Dirent{"big", &Node{Type: TypeFile, Size: size, Meta: Meta{Mode: 0o644},
			Open: func() (io.ReadCloser, error) { return io.NopCloser(&pattern{n: size}), nil }}},
	)
	img, st := writeImage(t, root, Options{Label: "big"})
	t.Logf("%+v", st)
	fsck(t, img)
	out := filepath.Join(t.TempDir(), "big")
	debugfs(t, img, "dump /big "+out)
	h1 := sha256.New()
	io.Copy(h1, &pattern{n: size})
	f, _ := os.Open(out)
	h2 := sha256.New()
	io.Copy(h2, f)
	if !bytes.Equal(h1.Sum(nil), h2.Sum(nil)) {
		t.Error("big file content differs")
	}
}

func itoa(i int) string {
	return strings.TrimLeft(string(rune('0'+i/1000%10))+string(rune('0'+i/100%10))+string(rune('0'+i/10%10))+string(rune('0'+i%10)), "")
}

func TestWriteDeterministic(t *testing.T) {
	t.Parallel()
	mk := func() *Node {
		return dir(
			Dirent{"b", file("two", 0o644)},
			Dirent{"a", dir(Dirent{"x", file("one", 0o644)})},
			Dirent{"c", &Node{Type: TypeSymlink, Target: "/a/x", Meta: Meta{Mode: 0o777}}},
		)
	}
	a, _ := writeImage(t, mk(), Options{Label: "same"})
	b, _ := writeImage(t, mk(), Options{Label: "same"})
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ba, bb) {
		t.Fatal("two writes of one tree differ")
	}
	c, _ := writeImage(t, mk(), Options{Label: "other"})
	bc, _ := os.ReadFile(c)
	if bytes.Equal(ba, bc) {
		t.Fatal("the label changed nothing")
	}
}

func TestWriteReadBack(t *testing.T) {
	t.Parallel()
	caps := "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	suid := &Node{Type: TypeFile, Size: 3, Meta: Meta{Mode: 0o755 | fs.ModeSetuid, UID: 100000, GID: 70000, ModTime: testTime,
		Xattrs: map[string]string{"security.capability": caps}},
		Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("abc")), nil }}
	root := dir(
		Dirent{"tmp", &Node{Type: TypeDir, Meta: Meta{Mode: 0o777 | fs.ModeSticky}}},
		Dirent{"ping", suid},
		Dirent{"dev", dir(
			Dirent{"null", &Node{Type: TypeCharDev, Major: 1, Minor: 3, Meta: Meta{Mode: 0o666}}},
			Dirent{"nvme", &Node{Type: TypeBlockDev, Major: 259, Minor: 70000, Meta: Meta{Mode: 0o600}}},
		)},
		Dirent{"long", &Node{Type: TypeSymlink, Target: strings.Repeat("abc/", 300), Meta: Meta{Mode: 0o777}}},
	)
	img, _ := writeImage(t, root, Options{Label: "rb"})
	fsck(t, img)
	st := debugfs(t, img, "stat /ping")
	for _, want := range []string{"Mode:  04755", "User: 100000", "Group: 70000", "security.capability (20)", "0x695735a5:00000960"} {
		if !strings.Contains(st, want) {
			t.Errorf("stat /ping lacks %q:\n%s", want, st)
		}
	}
	if st := debugfs(t, img, "stat /tmp"); !strings.Contains(st, "Mode:  01777") {
		t.Errorf("sticky dir:\n%s", st)
	}
	if st := debugfs(t, img, "stat /dev/nvme"); !strings.Contains(st, "Device major/minor number: 259:70000") {
		t.Errorf("device numbers:\n%s", st)
	}
	if st := debugfs(t, img, "stat /long"); !strings.Contains(st, "Size: 1200") {
		t.Errorf("slow symlink:\n%s", st)
	}
	mountCompare(t, img, map[string]string{"/ping": "abc"}, "/long", strings.Repeat("abc/", 300))
}

// mountCompare mounts img read-only with the kernel's ext4 (root only;
// skipped elsewhere) and checks file contents and a link target.
func mountCompare(t *testing.T, img string, files map[string]string, link, target string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Log("not root: the kernel mount is not checked")
		return
	}
	mnt := loopMount(t, img, "loop,ro")
	if mnt == "" {
		return
	}
	for p, want := range files {
		b, err := os.ReadFile(filepath.Join(mnt, p))
		if err != nil || string(b) != want {
			t.Errorf("kernel read %s: %q %v", p, b, err)
		}
	}
	if got, err := os.Readlink(filepath.Join(mnt, link)); err != nil || got != target {
		t.Errorf("kernel readlink %s: %q %v", link, got, err)
	}
	fi, err := os.Stat(filepath.Join(mnt, "ping"))
	if err == nil && fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("setuid lost under the kernel: %v", fi.Mode())
	}
}

func TestWriteHostileTrees(t *testing.T) {
	t.Parallel()
	loop := dir()
	loop.Entries = []Dirent{{"self", loop}}
	sub := dir()
	short := &Node{Type: TypeFile, Size: 10, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("abc")), nil }}
	long := &Node{Type: TypeFile, Size: 2, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("abc")), nil }}
	cases := []struct {
		name string
		root *Node
		opts Options
		want string
	}{
		{"empty name", dir(Dirent{"", file("x", 0)}), Options{}, "reserved"},
		{"dot", dir(Dirent{".", file("x", 0)}), Options{}, "reserved"},
		{"dotdot", dir(Dirent{"..", file("x", 0)}), Options{}, "reserved"},
		{"slash", dir(Dirent{"a/b", file("x", 0)}), Options{}, "'/'"},
		{"nul", dir(Dirent{"a\x00b", file("x", 0)}), Options{}, "NUL"},
		{"long name", dir(Dirent{strings.Repeat("n", 256), file("x", 0)}), Options{}, "longer than 255"},
		{"duplicate", dir(Dirent{"a", file("x", 0)}, Dirent{"a", file("y", 0)}), Options{}, "two entries"},
		{"nil node", dir(Dirent{"a", nil}), Options{}, "no node"},
		{"cycle", loop, Options{}, "cycle"},
		{"dir twice", dir(Dirent{"a", sub}, Dirent{"b", sub}), Options{}, "two names"},
		{"long target", dir(Dirent{"l", &Node{Type: TypeSymlink, Target: strings.Repeat("x", 4096)}}), Options{}, "4095"},
		{"nul target", dir(Dirent{"l", &Node{Type: TypeSymlink, Target: "a\x00"}}), Options{}, "NUL"},
		{"short content", dir(Dirent{"f", short}), Options{}, "size says 10"},
		{"long content", dir(Dirent{"f", long}), Options{}, "longer than its size"},
		{"long label", dir(), Options{Label: strings.Repeat("l", 17)}, "16 bytes"},
		{"root not dir", file("x", 0), Options{}, "must be a directory"},
		{"big xattrs", dir(Dirent{"f", &Node{Type: TypeFile, Meta: Meta{Xattrs: map[string]string{"user.a": strings.Repeat("v", 200)}}}}), Options{}, "more than"},
		{"odd xattr", dir(Dirent{"f", &Node{Type: TypeFile, Meta: Meta{Xattrs: map[string]string{"weird.a": "v"}}}}), Options{}, "namespace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "img"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = Write(f, tc.root, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestWriteEmptyWritable: an empty tree with room to spare is a writable
// file system (the session's scratch disk).
func TestWriteEmptyWritable(t *testing.T) {
	t.Parallel()
	img, st := writeImage(t, dir(), Options{Label: "scratch", FreeBlocks: 2 << 30 / 4096, FreeInodes: 100000})
	fsck(t, img)
	if st.Size < 2<<30 || st.Inodes < 100000 {
		t.Errorf("stats %+v", st)
	}
	fi, _ := os.Stat(img)
	if used := diskUsage(fi); used > 16<<20 {
		t.Errorf("a 2 GiB empty image uses %d bytes on disk: it should be sparse", used)
	}
	if os.Geteuid() != 0 {
		return
	}
	mnt := loopMount(t, img, "loop")
	if mnt == "" {
		return
	}
	for i := 0; i < 200; i++ {
		os.WriteFile(filepath.Join(mnt, "f"+itoa(i)), bytes.Repeat([]byte{byte(i)}, 10000), 0o644)
	}
	os.MkdirAll(filepath.Join(mnt, "a/b/c"), 0o755)
	if err := unmount(mnt); err != nil {
		t.Fatal(err)
	}
	fsck(t, img)
}

// TestWriteScratchSized: an 8 GiB empty file system with an inode per
// 16 KiB: the inode tables outgrow group 0 and must go around the backup
// superblocks.
func TestWriteScratchSized(t *testing.T) {
	t.Parallel()
	blocks := uint64(8<<30) / 4096
	img, st := writeImage(t, dir(), Options{Label: "scratch", FreeBlocks: blocks - blocks/64, FreeInodes: (8 << 30) / (16 << 10)})
	fsck(t, img)
	if st.Inodes < 500000 {
		t.Errorf("stats %+v", st)
	}
}

func TestTreeFromDir(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "package/bin"), 0o755)
	os.WriteFile(filepath.Join(src, "package/bin/tool"), []byte("#!/bin/sh\necho tool\n"), 0o755)
	os.Symlink("bin/tool", filepath.Join(src, "package/tool"))
	root, err := TreeFromDir(src, testTime)
	if err != nil {
		t.Fatal(err)
	}
	img, _ := writeImage(t, root, Options{Label: "vibedom-agent"})
	fsck(t, img)
	if got := debugfs(t, img, "cat /package/bin/tool"); !strings.Contains(got, "echo tool") {
		t.Errorf("content: %q", got)
	}
	if st := debugfs(t, img, "stat /package/bin/tool"); !strings.Contains(st, "Mode:  0755") {
		t.Errorf("mode:\n%s", st)
	}
	if st := debugfs(t, img, "stat /package/tool"); !strings.Contains(st, "Fast link dest: \"bin/tool\"") {
		t.Errorf("link:\n%s", st)
	}
}
