package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/ext4"
)

func testTree(t *testing.T) *tree {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "spool")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return newTree(f)
}

type ent struct {
	typ  alpine.EntryType
	path string
	body string
	link string
	mode fs.FileMode
}

func put(t *testing.T, tr *tree, pkg string, ents ...ent) error {
	t.Helper()
	w := &pkgWriter{t: tr, pkg: alpine.LockedPackage{Name: pkg, Version: "1-r0"}}
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		err := w.WriteEntry(alpine.Entry{Path: e.path, Type: e.typ, Mode: mode, Size: int64(len(e.body)), Linkname: e.link,
			ModTime: time.Unix(1700000000, 0)}, strings.NewReader(e.body))
		if err != nil {
			return err
		}
	}
	return nil
}

func read(t *testing.T, tr *tree, p string) string {
	t.Helper()
	n := tr.lookup(p)
	if n == nil {
		t.Fatalf("%s: not in the tree", p)
	}
	b, err := tr.content(n, 1<<20)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return string(b)
}

func TestCrossPackageSymlinks(t *testing.T) {
	t.Parallel()
	tr := testTree(t)
	// The base layout links bin into usr/bin (Debian's usr-merge, and
	// Alpine's); a later package installs bin/bash through it.
	must(t, put(t, tr, "alpine-baselayout",
		ent{typ: alpine.TypeDir, path: "usr"}, ent{typ: alpine.TypeDir, path: "usr/bin"},
		ent{typ: alpine.TypeSymlink, path: "bin", link: "usr/bin"},
		ent{typ: alpine.TypeSymlink, path: "lib", link: "/usr/lib"}))
	must(t, put(t, tr, "bash", ent{typ: alpine.TypeDir, path: "bin"}, ent{typ: alpine.TypeFile, path: "bin/bash", body: "ELF"}))
	must(t, put(t, tr, "libc", ent{typ: alpine.TypeFile, path: "lib/x86_64/libc.so", body: "libc"}))
	if got := read(t, tr, "usr/bin/bash"); got != "ELF" {
		t.Errorf("usr/bin/bash: %q", got)
	}
	if got := read(t, tr, "usr/lib/x86_64/libc.so"); got != "libc" {
		t.Errorf("through an absolute link: %q", got)
	}
	if n := child(tr.root, "bin"); n == nil || n.Type != ext4.TypeSymlink {
		t.Errorf("bin is no longer the link: %+v", n)
	}
}

func TestHostileLinksStayInside(t *testing.T) {
	t.Parallel()
	tr := testTree(t)
	// Links that climb above the root land at the root, as in the guest's
	// chroot; nothing ever refers to the host.
	must(t, put(t, tr, "evil", ent{typ: alpine.TypeSymlink, path: "up", link: "../../../../etc"}))
	must(t, put(t, tr, "evil2", ent{typ: alpine.TypeFile, path: "up/passwd-from-evil", body: "x"}))
	if got := read(t, tr, "etc/passwd-from-evil"); got != "x" {
		t.Errorf("escape not clamped: %q", got)
	}
	// Loops end with an error naming the package.
	must(t, put(t, tr, "loop", ent{typ: alpine.TypeSymlink, path: "a", link: "b"}, ent{typ: alpine.TypeSymlink, path: "b", link: "a"}))
	err := put(t, tr, "victim", ent{typ: alpine.TypeFile, path: "a/file", body: "x"})
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "victim") {
		t.Errorf("loop: %v", err)
	}
	// A path through a regular file.
	must(t, put(t, tr, "f", ent{typ: alpine.TypeFile, path: "plain", body: "x"}))
	if err := put(t, tr, "g", ent{typ: alpine.TypeFile, path: "plain/under", body: "y"}); !errors.Is(err, ErrConflict) {
		t.Errorf("through a file: %v", err)
	}
}

func TestConflicts(t *testing.T) {
	t.Parallel()
	tr := testTree(t)
	must(t, put(t, tr, "one", ent{typ: alpine.TypeFile, path: "etc/motd", body: "hello"}))
	// The same content from two packages is fine (apk allows it).
	must(t, put(t, tr, "two", ent{typ: alpine.TypeFile, path: "etc/motd", body: "hello"}))
	err := put(t, tr, "three", ent{typ: alpine.TypeFile, path: "etc/motd", body: "other"})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "one-1-r0") || !strings.Contains(err.Error(), "three-1-r0") {
		t.Errorf("different content: %v", err)
	}
	if err := put(t, tr, "four", ent{typ: alpine.TypeDir, path: "etc/motd"}); !errors.Is(err, ErrConflict) {
		t.Errorf("a directory over a file: %v", err)
	}
	if err := put(t, tr, "five", ent{typ: alpine.TypeSymlink, path: "etc/motd", link: "/dev/null"}); !errors.Is(err, ErrConflict) {
		t.Errorf("a link over a file: %v", err)
	}
	// Hard links share the node.
	must(t, put(t, tr, "six", ent{typ: alpine.TypeFile, path: "usr/bin/x", body: "bin"}, ent{typ: alpine.TypeHardlink, path: "usr/bin/y", link: "usr/bin/x"}))
	if tr.lookup("usr/bin/x") != tr.lookup("usr/bin/y") {
		t.Error("hard link is not the same inode")
	}
	if err := put(t, tr, "seven", ent{typ: alpine.TypeHardlink, path: "usr/bin/z", link: "etc"}); !errors.Is(err, ErrUnsafe) {
		t.Errorf("hard link to a directory: %v", err)
	}
}

func TestSetup(t *testing.T) {
	t.Parallel()
	tr := testTree(t)
	must(t, put(t, tr, "alpine-baselayout",
		ent{typ: alpine.TypeFile, path: "etc/passwd", body: "root:x:0:0:root:/root:/bin/ash\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"},
		ent{typ: alpine.TypeFile, path: "etc/group", body: "root:x:0:root\nwheel:x:10:root\n"}))
	must(t, put(t, tr, "busybox", ent{typ: alpine.TypeFile, path: "bin/busybox", body: "bb", mode: 0o755},
		ent{typ: alpine.TypeFile, path: "etc/busybox-paths.d/busybox", body: "/bin/busybox\n/bin/sh\n/bin/ls\n/usr/bin/env\n/bin/bash\n"}))
	must(t, put(t, tr, "bash", ent{typ: alpine.TypeFile, path: "bin/bash", body: "real bash", mode: 0o755}))
	must(t, put(t, tr, "ca-certificates-bundle", ent{typ: alpine.TypeFile, path: "etc/ssl/certs/ca-certificates.crt", body: "-----BEGIN CERTIFICATE-----\n"}))
	lock := &alpine.Lock{Packages: []alpine.LockedPackage{{Name: "busybox"}, {Name: "doas"}, {Name: "bash"}}}
	if err := tr.setup(lock, nil); err != nil {
		t.Fatal(err)
	}
	if n := tr.lookup("bin/bash"); n == nil || n.Type != ext4.TypeFile {
		t.Error("an applet link replaced the real bash")
	}
	if n := child(mustDir(t, tr, "bin"), "sh"); n == nil || n.Target != "/bin/busybox" {
		t.Errorf("bin/sh: %+v", n)
	}
	pw := read(t, tr, "etc/passwd")
	for _, want := range []string{"root:x:0:0:root:/root:/bin/ash\n", "nobody:x:65534", "agent:x:1000:1000:vibedom agent:/home/agent:/bin/bash\n"} {
		if !strings.Contains(pw, want) {
			t.Errorf("passwd lacks %q:\n%s", want, pw)
		}
	}
	if gr := read(t, tr, "etc/group"); !strings.Contains(gr, "wheel:x:10:root,agent\n") || !strings.Contains(gr, "agent:x:1000:\n") {
		t.Errorf("group:\n%s", gr)
	}
	if sh := read(t, tr, "etc/shadow"); !strings.Contains(sh, "agent:!:") || !strings.Contains(sh, "root:!:") {
		t.Errorf("shadow:\n%s", sh)
	}
	if d := read(t, tr, "etc/doas.d/vibedom.conf"); d != "permit nopass agent as root\n" {
		t.Errorf("doas: %q", d)
	}
	if n := tr.lookup("etc/doas.d/vibedom.conf"); n.Meta.Mode.Perm() != 0o400 || n.Meta.UID != 0 {
		t.Errorf("doas conf mode %v uid %d", n.Meta.Mode, n.Meta.UID)
	}
	if h := tr.lookup("home/agent"); h == nil || h.Meta.UID != AgentUID {
		t.Errorf("agent home: %+v", h)
	}
	if n := tr.lookup("tmp"); n.Meta.Mode != 0o777|fs.ModeSticky {
		t.Errorf("tmp mode %v", n.Meta.Mode)
	}
	if n := child(mustDir(t, tr, "dev"), "null"); n == nil || n.Type != ext4.TypeCharDev || n.Major != 1 || n.Minor != 3 {
		t.Errorf("dev/null: %+v", n)
	}
}

func TestSetupRefuses(t *testing.T) {
	t.Parallel()
	base := func(t *testing.T, passwd string) *tree {
		tr := testTree(t)
		must(t, put(t, tr, "alpine-baselayout", ent{typ: alpine.TypeFile, path: "etc/passwd", body: passwd}))
		must(t, put(t, tr, "ca", ent{typ: alpine.TypeFile, path: "etc/ssl/certs/ca-certificates.crt", body: "pem"}))
		return tr
	}
	lock := &alpine.Lock{}
	if err := base(t, "bob:x:1000:1000::/home/bob:/bin/sh\n").setup(lock, nil); err == nil || !strings.Contains(err.Error(), "uid 1000 is taken by bob") {
		t.Errorf("uid taken: %v", err)
	}
	if err := base(t, "agent:x:0:0::/root:/bin/sh\n").setup(lock, nil); err == nil || !strings.Contains(err.Error(), "uid 0") {
		t.Errorf("agent as root: %v", err)
	}
	if err := base(t, "broken line\n").setup(lock, nil); err == nil || !strings.Contains(err.Error(), "/etc/passwd") {
		t.Errorf("malformed passwd: %v", err)
	}
	tr := testTree(t)
	if err := tr.setup(lock, nil); err == nil || !strings.Contains(err.Error(), "ca-certificates-bundle") {
		t.Errorf("no CA bundle: %v", err)
	}
	tr = base(t, "")
	must(t, put(t, tr, "busybox", ent{typ: alpine.TypeFile, path: "bin/busybox", body: "bb"},
		ent{typ: alpine.TypeFile, path: "etc/busybox-paths.d/busybox", body: "/bin/../../etc/evil\n"}))
	if err := tr.setup(&alpine.Lock{Packages: []alpine.LockedPackage{{Name: "busybox"}}}, nil); err == nil || !strings.Contains(err.Error(), "not an applet path") {
		t.Errorf("hostile applet list: %v", err)
	}
	tr = base(t, "")
	must(t, put(t, tr, "busybox", ent{typ: alpine.TypeFile, path: "bin/busybox", body: "bb"}))
	if err := tr.setup(&alpine.Lock{Packages: []alpine.LockedPackage{{Name: "busybox"}}}, nil); err == nil || !strings.Contains(err.Error(), "busybox-paths.d") {
		t.Errorf("no applet list: %v", err)
	}
}

func mustDir(t *testing.T, tr *tree, p string) *ext4.Node {
	t.Helper()
	d, err := tr.resolveDir(p, false, ext4.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
