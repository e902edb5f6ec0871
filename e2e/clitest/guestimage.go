package clitest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// GuestImageHome inits a home with the test mirror's guest image for the
// host arch and returns it with the test build (TestKeysBin). It skips
// without QEMU, the guest image assets or the Debian userland.
func GuestImageHome(t *testing.T, extraInit ...string) (*CLI, string) {
	t.Helper()
	RequireVM(t)
	return InitGuestImage(t, TestKeysBin(t), New(t), extraInit...)
}

// InitGuestImage runs `bin init --mirror` against a test mirror in c's
// home, with extraInit appended, and returns c (now trusting the mirror's
// key) and bin.
func InitGuestImage(t testing.TB, bin string, c *CLI, extraInit ...string) (*CLI, string) {
	t.Helper()
	return initGuestImage(t, bin, c, false, extraInit...)
}

func initGuestImage(t testing.TB, bin string, c *CLI, node bool, extraInit ...string) (*CLI, string) {
	t.Helper()
	url, keys := serveTestMirror(t, runtime.GOARCH, node)
	c.Env = append(c.Env, "VIBEDOM_TEST_ALPINE_KEYS="+keys)
	cmd := exec.Command(bin, append([]string{"init", "--mirror", url}, extraInit...)...)
	cmd.Env = c.Env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	return c, bin
}

// ServeTestMirror serves the Debian-sourced test repository for goarch,
// signed by a key made now, and returns its URL and a folder of the key for
// $VIBEDOM_TEST_ALPINE_KEYS. It skips when the userland was not fetched.
func ServeTestMirror(t testing.TB, goarch string) (url, keys string) {
	t.Helper()
	return serveTestMirror(t, goarch, false)
}

// serveTestMirror is ServeTestMirror, with Node.js 20 as nodejs when node
// is set (NodeFiles).
func serveTestMirror(t testing.TB, goarch string, node bool) (url, keys string) {
	t.Helper()
	arch, err := alpine.GuestArch(goarch)
	if err != nil {
		t.Skip(err)
	}
	assets, err := alpinetest.FindAssets(arch)
	if err != nil {
		t.Skipf("no Debian userland for %s (scripts/fetch-assets.sh): %v", arch, err)
	}
	key, err := alpinetest.NewKey("e2e@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	o := alpinetest.DebianOptions{Arch: arch, Assets: assets, Root: t.TempDir(), Key: key, CacheDir: alpinetest.CacheDirFor(assets)}
	if node {
		o.Node = NodeFiles(t, arch)
	}
	repo, err := alpinetest.BuildDebianRepo(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := repo.Serve()
	t.Cleanup(srv.Close)
	keys = t.TempDir()
	os.MkdirAll(filepath.Join(keys, arch), 0o755)
	os.WriteFile(filepath.Join(keys, arch, key.Name), key.PublicPEM, 0o644)
	return srv.URL, keys
}
