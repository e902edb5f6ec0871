package image

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/vm"
)

// The tests of this package share, per test binary, one signing key, one
// Debian-sourced test mirror per Alpine arch and one guest image built
// from the host arch's mirror: building and signing a mirror, and a cold
// guest image build, are most of this package's time. The shared ones are
// only read; a test that changes a mirror changes a clone of it
// (cloneMirror), and a test that builds into a home starts from a copy of
// the shared image cache (seededHome). Everything lives under sharedRoot
// and is removed, and the servers closed, when TestMain ends.

// atExit holds what TestMain runs after the tests (servers to close).
var atExit struct {
	sync.Mutex
	fns []func()
}

func runAtExit() {
	atExit.Lock()
	defer atExit.Unlock()
	for _, f := range atExit.fns {
		f()
	}
	atExit.fns = nil
}

var sharedKey = sync.OnceValues(func() (*alpinetest.Key, error) {
	return alpinetest.NewKey("image-test@vibedom-1.rsa.pub")
})

type sharedRepo struct {
	once sync.Once
	url  string
	repo *alpinetest.DebianRepo
	skip string // why the tests that need it skip
	err  error
}

var sharedRepos sync.Map // Alpine arch -> *sharedRepo

// sharedMirror returns the test mirror for an Alpine arch, signed by the
// shared key and served until the test binary ends (built, or taken from
// its cache, once). It skips when the Debian userland has not been
// fetched. Callers must not change it: see cloneMirror.
func sharedMirror(t *testing.T, arch string) (string, *alpinetest.Key, *alpinetest.DebianRepo) {
	t.Helper()
	key, err := sharedKey()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := sharedRepos.LoadOrStore(arch, &sharedRepo{})
	r := v.(*sharedRepo)
	r.once.Do(func() {
		userland, err := alpinetest.FindAssets(arch)
		if err != nil {
			r.skip = fmt.Sprintf("no Debian userland for %s (scripts/fetch-assets.sh): %v", arch, err)
			return
		}
		r.repo, r.err = alpinetest.BuildDebianRepo(alpinetest.DebianOptions{Arch: arch, Assets: userland,
			Root: filepath.Join(sharedRoot, "mirror-"+arch), Key: key, CacheDir: alpinetest.CacheDirFor(userland)})
		if r.err != nil {
			return
		}
		srv := r.repo.Serve()
		r.url = srv.URL
		atExit.Lock()
		atExit.fns = append(atExit.fns, srv.Close)
		atExit.Unlock()
	})
	if r.skip != "" {
		t.Skip(r.skip)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.url, key, r.repo
}

// testMirror is the host's guest arch's shared mirror; it skips when
// there is no guest binary to build an image with.
func testMirror(t *testing.T) (url string, key *alpinetest.Key, repo *alpinetest.DebianRepo) {
	t.Helper()
	arch, err := alpine.GuestArch(runtime.GOARCH)
	if err != nil {
		t.Skip(err)
	}
	if _, err := assets.LocateGuest(vm.Arch(runtime.GOARCH)); err != nil {
		t.Skipf("no guest binary: %v", err)
	}
	return sharedMirror(t, arch)
}

// cloneMirror serves, until the test ends, a copy of repo that the test
// may change (alpinetest.DebianRepo.Clone).
func cloneMirror(t *testing.T, repo *alpinetest.DebianRepo) (string, *alpinetest.DebianRepo) {
	t.Helper()
	c, err := repo.Clone(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := c.Serve()
	t.Cleanup(srv.Close)
	return srv.URL, c
}

// sharedGuest is a home where BuildGuest built the host arch's shared
// mirror's guest image, once per test binary, and what that cold build
// returned.
var sharedGuest struct {
	once   sync.Once
	home   home.Home
	result *GuestResult
	err    error
}

// sharedGuestHome returns the shared guest image's home and the result of
// its cold build. Callers must not change what is in it (they may add
// beside it: the images cache is content-addressed).
func sharedGuestHome(t *testing.T) (home.Home, *GuestResult) {
	t.Helper()
	url, key, _ := testMirror(t)
	sharedGuest.once.Do(func() {
		h := home.Home(filepath.Join(sharedRoot, "guest-home"))
		if sharedGuest.err = os.MkdirAll(string(h), 0o700); sharedGuest.err != nil {
			return
		}
		sharedGuest.result, sharedGuest.err = BuildGuest(context.Background(), h, GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url, Keys: key.Ring})
		sharedGuest.home = h
	})
	if sharedGuest.err != nil {
		t.Fatalf("the shared guest image: %v", sharedGuest.err)
	}
	return sharedGuest.home, sharedGuest.result
}

// seededHome returns a new home, with no guest manifest, whose image
// cache and package cache are a copy of sharedGuest's: BuildGuest from
// the shared mirror (or a clone of it) resolves, verifies the cached
// packages and finds the root and boot images already built (the images
// cache is content-addressed, as for a second home). Read-only files (the
// images, the packages) are hard-linked: nothing writes into one, new
// ones are written beside and renamed; the rest is copied.
func seededHome(t *testing.T) home.Home {
	t.Helper()
	src, _ := sharedGuestHome(t)
	return homeCopy(t, src, true)
}

// copiedHome is seededHome from src with every file copied, none linked:
// the test may write into them.
func copiedHome(t *testing.T, src home.Home) home.Home {
	t.Helper()
	return homeCopy(t, src, false)
}

func homeCopy(t *testing.T, src home.Home, link bool) home.Home {
	t.Helper()
	h := home.Home(t.TempDir())
	for _, dir := range []func(home.Home) string{home.Home.Images, home.Home.APKCache} {
		if err := copyTree(dir(h), dir(src), link); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// copyTree copies the tree src to dst: with link, read-only regular files
// as hard links; other regular files and directories as copies.
func copyTree(dst, src string, link bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(to, fi.Mode().Perm()|0o700)
		case !fi.Mode().IsRegular():
			return nil // locks' sockets and the like: made again on use
		case link && fi.Mode().Perm()&0o222 == 0:
			if os.Link(p, to) == nil {
				return nil
			}
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
