package alpinetest

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
)

// nodeFiles finds the pinned Node.js files under .cache (as
// clitest.NodeFiles fetches them), or skips.
func nodeFiles(t *testing.T, arch string) (*NodeFiles, string) {
	t.Helper()
	assets, err := FindAssets(arch)
	if err != nil {
		t.Skipf("no Debian userland for %s: %v", arch, err)
	}
	pin, err := NodePinFor(arch)
	if err != nil {
		t.Skip(err)
	}
	da, _ := DebianArch(arch)
	cache := filepath.Dir(filepath.Dir(assets))
	n := &NodeFiles{Tarball: filepath.Join(cache, "npm", pin.TarballName()), DebDir: filepath.Join(cache, "nodedebs", da)}
	for _, f := range append([]string{n.Tarball}, filepath.Join(n.DebDir, "*.deb")) {
		if m, _ := filepath.Glob(f); len(m) == 0 {
			t.Skipf("no %s: the e2e test TestGeminiToolCallVM fetches it", f)
		}
	}
	return n, assets
}

// TestDebianRepoNode: with Node, the repository's nodejs holds the
// official Node.js 20 build at usr/bin/node, its C++ runtime comes with it
// through so: dependencies, and the cache entry sits in CacheDir/node
// without evicting the plain repository's entries. Serial: a parallel
// test building the plain repository on a cold cache would change the
// entries it compares.
func TestDebianRepoNode(t *testing.T) {
	arch := "x86_64"
	n, assets := nodeFiles(t, arch)
	key, err := NewKey("test-mirror@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	cacheDir := CacheDirFor(assets)
	plainBefore, _ := filepath.Glob(filepath.Join(cacheDir, arch+"-*"))
	r, err := BuildDebianRepo(DebianOptions{Arch: arch, Assets: assets, Root: t.TempDir(), Key: key, CacheDir: cacheDir, Node: n})
	if err != nil {
		t.Fatal(err)
	}
	if plainAfter, _ := filepath.Glob(filepath.Join(cacheDir, arch+"-*")); !slices.Equal(plainBefore, plainAfter) {
		t.Errorf("the plain repository's cache entries changed: %v, then %v", plainBefore, plainAfter)
	}
	if m, _ := filepath.Glob(filepath.Join(cacheDir, "node", arch+"-*")); len(m) != 1 {
		t.Errorf("node cache entries: %v", m)
	}
	if slices.Contains(r.StandIns, "nodejs") {
		t.Errorf("nodejs is a stand-in: %v", r.StandIns)
	}
	srv := r.Serve()
	defer srv.Close()
	o := r.Options(srv.URL, arch, key)
	idx, err := alpine.FetchIndexes(t.Context(), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := alpine.Resolve(idx, alpine.World(nil), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range lock.Packages {
		names = append(names, p.Name)
	}
	for _, want := range []string{"nodejs", "libstdc++", "libgcc", "musl"} {
		if !slices.Contains(names, want) {
			t.Errorf("the lock has no %s: %v", want, names)
		}
	}
	i := slices.Index(names, "nodejs")
	paths, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, &alpine.Lock{Branch: lock.Branch, Arch: lock.Arch, World: lock.World, Packages: lock.Packages[i : i+1]})
	if err != nil {
		t.Fatal(err)
	}
	e := &entries{}
	if err := alpine.Extract(paths[0], arch, lock.Packages[i], key.Ring, e); err != nil {
		t.Fatal(err)
	}
	node := e.content["usr/bin/node"]
	f, err := elf.NewFile(bytes.NewReader(node))
	if err != nil {
		t.Fatalf("usr/bin/node: %v (%d bytes)", err, len(node))
	}
	needed, _ := f.ImportedLibraries()
	if f.Machine != elf.EM_X86_64 || !slices.Contains(needed, "libstdc++.so.6") {
		t.Errorf("usr/bin/node: %v, needs %v", f.Machine, needed)
	}
	if !bytes.Contains(node, []byte("v"+NodeVersion)) {
		t.Errorf("usr/bin/node does not name v%s", NodeVersion)
	}
}

// TestNodeInputsPinned: a tarball or a Debian package that differs from
// its pin is refused, with what to do next.
func TestNodeInputsPinned(t *testing.T) {
	t.Parallel()
	arch := "x86_64"
	n, _ := nodeFiles(t, arch)
	if _, _, err := nodeInputs(arch, n); err != nil {
		t.Fatalf("the pinned files: %v", err)
	}
	tamper := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bad := *n
	bad.Tarball = filepath.Join(t.TempDir(), filepath.Base(n.Tarball))
	tamper(n.Tarball, bad.Tarball)
	if _, _, err := nodeInputs(arch, &bad); err == nil || !strings.Contains(err.Error(), "integrity") || !strings.Contains(err.Error(), "fetch") {
		t.Errorf("a changed tarball: %v", err)
	}
	bad = *n
	bad.DebDir = t.TempDir()
	debs, _ := filepath.Glob(filepath.Join(n.DebDir, "*.deb"))
	for i, d := range debs {
		if i == 0 {
			tamper(d, filepath.Join(bad.DebDir, filepath.Base(d)))
		} else {
			os.Symlink(d, filepath.Join(bad.DebDir, filepath.Base(d)))
		}
	}
	if _, _, err := nodeInputs(arch, &bad); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("a changed .deb: %v", err)
	}
	if _, err := NodePinFor("aarch64"); err == nil || !strings.Contains(err.Error(), "no pinned") {
		t.Errorf("aarch64: %v", err)
	}
}
