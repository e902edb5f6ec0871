package image

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
	"github.com/vibedom/vibedom/vm"
)

func e2fsck(t *testing.T, img string) {
	t.Helper()
	bin, err := exec.LookPath("e2fsck")
	if err != nil {
		if bin, err = exec.LookPath("/usr/sbin/e2fsck"); err != nil {
			t.Logf("e2fsck not installed: the image's consistency is not checked")
			return
		}
	}
	out, err := exec.Command(bin, "-fn", img).CombinedOutput()
	if err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

// TestBuildGuestImage: the first build in a home fetches, verifies and
// builds everything; a second run is warm and needs no mirror; a session
// finds the image; a second home shares it; a damaged root image is
// refused and rebuilt from the package cache.
func TestBuildGuestImage(t *testing.T) {
	t.Parallel()
	url, key, _ := testMirror(t)
	o := GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url, Keys: key.Ring}
	// The first build is the shared guest image's (sharedGuestHome): a
	// cold build from the shared mirror into a home of its own, made once
	// for this test binary. This test only reads that home, or writes
	// beside what is in it; it damages a copy.
	h, r := sharedGuestHome(t)
	if !r.Built || !r.Fresh || r.Packages < 10 {
		t.Errorf("first build: %+v", r)
	}
	fi, err := os.Stat(r.Root)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 || filepath.Base(r.Root) != r.RootSHA+".ext4" || fi.Size() != r.RootSize {
		t.Errorf("root image %s: mode %v size %d, result %+v", r.Root, fi.Mode(), fi.Size(), r)
	}
	e2fsck(t, r.Root)
	m, err := ReadGuestManifest(h.GuestManifest(r.Arch))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range alpine.BootWorld {
		if !slices.ContainsFunc(m.Lock.Packages, func(p alpine.LockedPackage) bool { return p.Name == b }) {
			t.Errorf("lock has no %s", b)
		}
	}
	t.Logf("cold build: %d packages, root image %d MiB, %s", r.Packages, r.RootSize>>20, r.Took)

	// Warm: nothing changed, nothing fetched (the mirror is gone).
	o2 := o
	o2.Mirror = "http://127.0.0.1:9/alpine"
	r2, err := BuildGuest(t.Context(), h, o2)
	if err != nil {
		t.Fatalf("warm init needed the mirror: %v", err)
	}
	if r2.Built || r2.Fresh || r2.RootSHA != r.RootSHA {
		t.Errorf("warm: %+v", r2)
	}
	t.Logf("warm init: %s", r2.Took)

	// A session finds it.
	gb, err := LoadGuest(t.Context(), h, vm.Arch(runtime.GOARCH), nil)
	if err != nil {
		t.Fatal(err)
	}
	if gb.RootImage != r.Root || gb.Image.Kernel == "" {
		t.Errorf("load: %+v", gb)
	}

	// A second home with the same lock shares the root image file: the
	// images cache is content-addressed.
	h2 := home.Home(t.TempDir())
	os.Symlink(h.Images(), h2.Images())
	os.MkdirAll(filepath.Join(string(h2), "cache"), 0o700)
	os.Symlink(h.APKCache(), h2.APKCache())
	r3, err := BuildGuest(t.Context(), h2, o)
	if err != nil {
		t.Fatal(err)
	}
	if fi1, fi3 := statOrNil(r.Root), statOrNil(r3.Root); r3.Built || fi1 == nil || fi3 == nil || !os.SameFile(fi1, fi3) {
		t.Errorf("same lock, second home: built=%v root %s, want the shared %s", r3.Built, r3.Root, r.Root)
	}

	// A damaged root image is noticed (its identity changed, so it is
	// hashed again) and refused: in a home that is a copy of h (every file
	// copied, none linked), built there from the cache.
	h = copiedHome(t, h)
	rc, err := BuildGuest(t.Context(), h, o)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Built || rc.RootSHA != r.RootSHA || !strings.HasPrefix(rc.Root, h.Images()) {
		t.Errorf("a copy of the home: built=%v root %s, want %s's copy of %s", rc.Built, rc.Root, h.Images(), r.RootSHA)
	}
	os.Chmod(rc.Root, 0o644)
	f, err := os.OpenFile(rc.Root, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("x"), 4096*3+17)
	f.Close()
	if _, err := LoadGuest(t.Context(), h, vm.Arch(runtime.GOARCH), nil); !errors.Is(err, ErrRootImage) {
		t.Errorf("damaged root image: %v, want ErrRootImage", err)
	}
	// init rebuilds it (from the cache, without the mirror).
	r4, err := BuildGuest(t.Context(), h, o2)
	if err != nil {
		t.Fatal(err)
	}
	if !r4.Built || r4.RootSHA != r.RootSHA {
		t.Errorf("rebuild after damage: built=%v sha %s, want %s (the build is reproducible)", r4.Built, r4.RootSHA, r.RootSHA)
	}
	if err := VerifyRootImage(h.Images(), r4.Root, r4.RootSHA, true); err != nil {
		t.Error(err)
	}
}

func TestGuestImagePackageList(t *testing.T) {
	t.Parallel()
	url, key, repo := testMirror(t)
	h := seededHome(t)
	o := GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url, Keys: key.Ring}
	if _, err := BuildGuest(t.Context(), h, o); err != nil {
		t.Fatal(err)
	}
	// A name no repository has: an error naming it; the image stays.
	os.WriteFile(h.PackagesFile(), []byte("# mine\nno-such-tool\n"), 0o600)
	_, err := BuildGuest(t.Context(), h, o)
	if !errors.Is(err, alpine.ErrMissing) || !strings.Contains(err.Error(), "no-such-tool") {
		t.Errorf("unknown package: %v", err)
	}
	if _, err := LoadGuest(t.Context(), h, vm.Arch(runtime.GOARCH), nil); err != nil {
		t.Errorf("the previous image must stay usable: %v", err)
	}
	// Not a package name: the line is named.
	os.WriteFile(h.PackagesFile(), []byte("git\nrm -rf /\n"), 0o600)
	if _, err := BuildGuest(t.Context(), h, o); err == nil || !strings.Contains(err.Error(), "packages.txt:2") {
		t.Errorf("bad line: %v", err)
	}
	// A package the mirror has but the default list does not: it joins,
	// everything else keeps its locked version.
	var extra string
	for _, p := range repo.Packages {
		if !slices.Contains(alpine.World(nil), p.Name) && !slices.Contains(repo.StandIns, p.Name) {
			extra = p.Name
			break
		}
	}
	if extra == "" {
		t.Skip("the test repository has no package outside the default list")
	}
	os.WriteFile(h.PackagesFile(), []byte(extra+"\n"), 0o600)
	r, err := BuildGuest(t.Context(), h, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(r.Extra, extra) {
		t.Errorf("extra packages: %v", r.Extra)
	}
	for _, c := range r.Changes {
		if !strings.HasPrefix(c, "added ") && !strings.HasPrefix(c, "removed ") {
			t.Errorf("a changed list moved a locked package: %s", c)
		}
	}
}

func TestGuestImageRefusesForeignKeys(t *testing.T) {
	t.Parallel()
	url, _, _ := testMirror(t)
	h := home.Home(t.TempDir())
	// No keyring: Alpine's release keys, which did not sign the test mirror.
	_, err := BuildGuest(t.Context(), h, GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url})
	if !errors.Is(err, alpine.ErrSignature) {
		t.Fatalf("test mirror under the release keys: %v, want ErrSignature", err)
	}
	if _, err := os.Stat(h.GuestManifest(mustAlpineArch(t))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a manifest was written after a refused index")
	}
}

func mustAlpineArch(t *testing.T) string {
	a, err := alpine.GuestArch(runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func statOrNil(p string) os.FileInfo {
	fi, err := os.Stat(p)
	if err != nil {
		return nil
	}
	return fi
}

// TestGuestImageUpdate: a newer package on the mirror changes nothing
// until --update, which moves to it, says so, and builds a new root image;
// a mirror replaying an older index is refused.
func TestGuestImageUpdate(t *testing.T) {
	t.Parallel()
	oldMirror, key, shared := testMirror(t)
	url, repo := cloneMirror(t, shared) // changed below
	h := seededHome(t)
	o := GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: url, Keys: key.Ring}
	r1, err := BuildGuest(t.Context(), h, o)
	if err != nil {
		t.Fatal(err)
	}
	arch := mustAlpineArch(t)
	var old string
	for _, p := range repo.Packages {
		if p.Name == "less" {
			old = p.Version
		}
	}
	if _, err := repo.Build("main", alpinetest.Spec{Name: "less", Version: "9999-r0", Arch: arch, Key: key,
		Files: []alpinetest.File{{Name: "usr/", Type: '5'}, {Name: "usr/bin/", Type: '5'}, {Name: "usr/bin/less-new", Body: []byte("new")}}}); err != nil {
		t.Fatal(err)
	}
	if err := repo.WriteIndexes(arch, key, "updated"); err != nil {
		t.Fatal(err)
	}
	r2, err := BuildGuest(t.Context(), h, o)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Fresh || r2.Built || r2.RootSHA != r1.RootSHA {
		t.Errorf("without --update the lock moved: %+v", r2)
	}
	o.Update = true
	r3, err := BuildGuest(t.Context(), h, o)
	if err != nil {
		t.Fatal(err)
	}
	want := "less " + old + " -> 9999-r0"
	if !r3.Built || r3.RootSHA == r1.RootSHA || !slices.ContainsFunc(r3.Changes, func(c string) bool { return strings.Contains(c, want) }) {
		t.Errorf("--update: built=%v changes %v (want %q)", r3.Built, r3.Changes, want)
	}
	// A mirror serving the old index again (still validly signed, the
	// shared mirror the clone was made from) cannot move the lock back.
	h2 := home.Home(t.TempDir())
	os.MkdirAll(filepath.Dir(h2.GuestManifest(arch)), 0o700)
	b, _ := os.ReadFile(h.GuestManifest(arch))
	os.WriteFile(h2.GuestManifest(arch), b, 0o600)
	_, err = BuildGuest(t.Context(), h2, GuestOptions{Arch: vm.Arch(runtime.GOARCH), Mirror: oldMirror, Keys: key.Ring, Update: true})
	if !errors.Is(err, alpine.ErrLockDrift) || !strings.Contains(err.Error(), "older") {
		t.Errorf("replayed older index: %v", err)
	}
}
