//go:build linux

package alpinetest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/image/alpine"
)

// rootWriter extracts entries into an os.Root (links resolve inside it),
// as the root image writer lays packages out.
type rootWriter struct{ r *os.Root }

func (w rootWriter) WriteEntry(e alpine.Entry, rd io.Reader) error {
	if dir := path.Dir(e.Path); dir != "." {
		if err := w.r.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch e.Type {
	case alpine.TypeDir:
		if fi, err := w.r.Stat(e.Path); err == nil && fi.IsDir() {
			return nil // already there, perhaps through a link (bin -> usr/bin)
		}
		if err := w.r.Mkdir(e.Path, 0o755); err != nil {
			return err
		}
		return w.r.Chmod(e.Path, e.Mode)
	case alpine.TypeFile:
		f, err := w.r.OpenFile(e.Path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, rd); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return w.r.Chmod(e.Path, e.Mode)
	case alpine.TypeSymlink:
		if err := w.r.Remove(e.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return w.r.Symlink(e.Linkname, e.Path)
	case alpine.TypeHardlink:
		return w.r.Link(e.Linkname, e.Path)
	}
	return fmt.Errorf("%s: entry type %d", e.Path, e.Type)
}

// TestDebianUserlandRuns extracts the x86_64 repository's root packages
// (the default world without the boot set) into a directory, does what
// the root image builder does besides (busybox applet links, an agent
// user, /dev nodes), and runs git in it as that user through chroot: git --version,
// init, add, commit, diff, status. It proves the repacked userland is
// complete before any VM boots. Root and an x86_64 host only.
func TestDebianUserlandRuns(t *testing.T) {
	t.Parallel()
	if runtime.GOARCH != "amd64" || os.Getuid() != 0 {
		t.Skip("runs the x86_64 userland through chroot: needs root on an x86_64 host")
	}
	key, err := NewKey("run@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	r := debianRepo(t, "x86_64", key)
	srv := r.Serve()
	defer srv.Close()
	o := r.Options(srv.URL, "x86_64", key)
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alpine.Resolve(idx, alpine.DefaultWorld, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, lock)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// alpine-baselayout sorts first, so bin, lib, lib64 are links before
	// the Debian packages write through them.
	for i, p := range lock.Packages {
		if slices.Contains(alpine.BootWorld, p.Name) {
			t.Fatalf("%s in the root world", p.Name)
		}
		if err := alpine.Extract(paths[i], "x86_64", p, key.Ring, rootWriter{root}); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	applets, err := root.ReadFile("etc/busybox-paths.d/busybox")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(string(applets)) {
		a = strings.TrimPrefix(a, "/")
		if _, err := root.Lstat(a); err == nil {
			continue // bash's own /bin/bash, for one
		}
		if err := root.Symlink("/bin/busybox", a); err != nil {
			t.Fatal(err)
		}
	}
	passwd, _ := root.ReadFile("etc/passwd")
	group, _ := root.ReadFile("etc/group")
	root.WriteFile("etc/passwd", append(passwd, "agent:x:1000:1000:agent:/home/agent:/bin/bash\n"...), 0o644)
	root.WriteFile("etc/group", append(group, "agent:x:1000:\n"...), 0o644)
	// Device nodes, as the image builder makes them (git needs null and
	// urandom).
	for name, minor := range map[string]uint32{"null": 3, "zero": 5, "random": 8, "urandom": 9} {
		if err := unix.Mknod(filepath.Join(dir, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(1, minor))); err != nil {
			t.Fatal(err)
		}
		root.Chmod("dev/"+name, 0o666) // mknod's mode is masked by the umask
	}
	root.Mkdir("home/agent", 0o755)
	root.Chown("home/agent", 1000, 1000)

	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/home/agent", "LANG=C"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir, Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	if out := run("/usr/bin/git", "--version"); !strings.HasPrefix(out, "git version 2.") {
		t.Errorf("git --version: %q", out)
	}
	out := run("/bin/bash", "-ec", `cd ~ && mkdir w && cd w && git init -q && echo hi > a && git add a &&
git -c user.name=agent -c user.email=agent@example.invalid commit -qm one && echo more >> a &&
git --no-pager diff --stat && git status --short && git log --format=%s && id -u && cat /etc/os-release`)
	for _, want := range []string{"1 file changed, 1 insertion(+)", " M a", "one\n1000\n", "vibedom test mirror (Debian-sourced)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
