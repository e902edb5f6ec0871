package alpinetest

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/image/alpine"
)

// entries keeps every extracted entry of one package.
type entries struct {
	list    []alpine.Entry
	content map[string][]byte
}

func (e *entries) WriteEntry(en alpine.Entry, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if e.content == nil {
		e.content = map[string][]byte{}
	}
	e.list = append(e.list, en)
	e.content[en.Path] = b
	return nil
}

// debianRepo builds the Debian-sourced repository for arch, or skips.
func debianRepo(t *testing.T, arch string, key *Key) *DebianRepo {
	t.Helper()
	assets, err := FindAssets(arch)
	if err != nil {
		t.Skipf("no Debian userland for %s: %v", arch, err)
	}
	start := time.Now()
	r, err := BuildDebianRepo(DebianOptions{Arch: arch, Assets: assets, Root: t.TempDir(), Key: key, CacheDir: CacheDirFor(assets)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s repository built in %v (cached: %v)", arch, time.Since(start).Round(time.Millisecond), r.Cached)
	return r
}

// TestDebianRepo: the Debian-sourced repository of each arch goes
// through the whole of package alpine (index, verify, resolve with the
// default world, download, verify, extract); every package is what it
// claims: a stand-in is empty and says so, every other package has files.
func TestDebianRepo(t *testing.T) {
	t.Parallel()
	key, err := NewKey("test-mirror@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range alpine.Arches {
		t.Run(arch, func(t *testing.T) {
			r := debianRepo(t, arch, key)
			srv := r.Serve()
			defer srv.Close()
			o := r.Options(srv.URL, arch, key)
			idx, err := alpine.FetchIndexes(t.Context(), nil, o)
			if err != nil {
				t.Fatal(err)
			}
			world := alpine.World(nil)
			lock, err := alpine.Resolve(idx, world, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			paths, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, lock)
			if err != nil {
				t.Fatal(err)
			}
			desc := map[string]string{}
			for _, ix := range idx {
				for _, p := range ix.Packages {
					desc[p.Name] = p.Description
				}
			}
			got := map[string]*entries{}
			for i, p := range lock.Packages {
				e := &entries{}
				if err := alpine.Extract(paths[i], arch, p, key.Ring, e); err != nil {
					t.Fatal(err)
				}
				got[p.Name] = e
			}
			for _, n := range world {
				if got[n] == nil {
					t.Errorf("%s is in the world but not in the lock", n)
				}
			}
			standIns := StandInNames(nil)
			if !slices.Equal(standIns, r.StandIns) {
				t.Errorf("stand-ins %v, StandInNames %v", r.StandIns, standIns)
			}
			for name, e := range got {
				stand := slices.Contains(standIns, name)
				if stand != (desc[name] == StandInDescription) {
					t.Errorf("%s: stand-in %v, description %q", name, stand, desc[name])
				}
				if stand != (len(e.list) == 0) {
					t.Errorf("%s: stand-in %v, %d entries", name, stand, len(e.list))
				}
			}
			for _, real := range []string{"bash", "git", "musl", "zlib", "pcre2", "ncurses-libs", "busybox", "busybox-static", "linux-virt", "alpine-baselayout", "alpine-release", "ca-certificates-bundle"} {
				if slices.Contains(standIns, real) {
					t.Errorf("%s is a stand-in", real)
				}
			}

			machine := map[string]elf.Machine{"x86_64": elf.EM_X86_64, "aarch64": elf.EM_AARCH64}[arch]
			checkELF := func(pkg, p string) {
				t.Helper()
				b := got[pkg].content[p]
				f, err := elf.NewFile(bytes.NewReader(b))
				if err != nil {
					t.Errorf("%s: %s is not ELF: %v", pkg, p, err)
					return
				}
				if f.Machine != machine {
					t.Errorf("%s: %s is %v", pkg, p, f.Machine)
				}
			}
			checkELF("git", "usr/bin/git")
			checkELF("bash", "bin/bash")
			checkELF("busybox", "bin/busybox")
			checkELF("busybox-static", "bin/busybox.static")
			paths0 := string(got["busybox"].content["etc/busybox-paths.d/busybox"])
			if !strings.Contains(paths0, "/bin/sh\n") || !strings.Contains(paths0, "/usr/bin/wc\n") {
				t.Errorf("busybox-paths: %.200q", paths0)
			}
			if n := strings.Count(string(got["ca-certificates-bundle"].content["etc/ssl/certs/ca-certificates.crt"]), "BEGIN CERTIFICATE"); n < 100 {
				t.Errorf("%d certificates in the bundle", n)
			}
			if !strings.Contains(string(got["alpine-release"].content["etc/os-release"]), "vibedom test mirror (Debian-sourced)") {
				t.Error("os-release does not say it is the test mirror")
			}
			// Every dropped file is one of git's network helpers.
			for _, d := range r.Dropped {
				if !strings.HasPrefix(d, "git: usr/lib/git-core/git-") || !(strings.Contains(d, "http") || strings.Contains(d, "ftp") || strings.Contains(d, "imap")) {
					t.Errorf("dropped %s", d)
				}
			}
			if len(r.Dropped) == 0 {
				t.Error("git's HTTP helpers were kept, yet the repository carries no libcurl")
			}

			// linux-virt: the kernel, modules as .ko.gz for this release.
			lv := got["linux-virt"]
			kern := lv.content["boot/vmlinuz-virt"]
			switch arch {
			case "aarch64":
				if len(kern) < 64 || string(kern[0:2]) != "MZ" || string(kern[4:8]) != "zimg" || string(kern[24:29]) != "gzip\x00" {
					t.Fatalf("aarch64 vmlinuz-virt is not a zboot image: % x", kern[:min(64, len(kern))])
				}
				off, size := binary.LittleEndian.Uint32(kern[8:]), binary.LittleEndian.Uint32(kern[12:])
				zr, err := gzip.NewReader(bytes.NewReader(kern[off : off+size]))
				if err != nil {
					t.Fatal(err)
				}
				head := make([]byte, 64)
				if _, err := io.ReadFull(zr, head); err != nil || string(head[56:60]) != "ARM\x64" {
					t.Errorf("zboot payload is not an arm64 Image: %v % x", err, head)
				}
			case "x86_64":
				if len(kern) < 0x206 || string(kern[0x202:0x206]) != "HdrS" {
					t.Error("x86_64 vmlinuz-virt is not a bzImage")
				}
			}
			dir := "usr/lib/modules/" + r.KernelRelease + "/"
			order := string(lv.content[dir+"modules.order"])
			if !strings.Contains(order, "kernel/fs/overlayfs/overlay.ko\n") {
				t.Errorf("modules.order does not list overlay.ko")
			}
			ko := lv.content[dir+"kernel/fs/overlayfs/overlay.ko.gz"]
			zr, err := gzip.NewReader(bytes.NewReader(ko))
			if err != nil {
				t.Fatalf("overlay.ko.gz: %v", err)
			}
			raw, _ := io.ReadAll(zr)
			if f, err := elf.NewFile(bytes.NewReader(raw)); err != nil || f.Machine != machine {
				t.Errorf("overlay.ko.gz is not a %v module: %v", machine, err)
			}
			var plain int
			for p := range lv.content {
				if strings.HasSuffix(p, ".ko") || strings.HasSuffix(p, ".ko.xz") || strings.HasSuffix(p, ".ko.zst") {
					plain++
				}
			}
			if plain != 0 {
				t.Errorf("%d modules not as .ko.gz", plain)
			}
			for _, f := range []string{"modules.builtin", "modules.builtin.modinfo"} {
				if len(lv.content[dir+f]) == 0 {
					t.Errorf("linux-virt has no %s", f)
				}
			}

			// A second build of the same inputs comes from the cache and
			// signs with whatever key it is given.
			again := debianRepo(t, arch, key)
			if !again.Cached {
				t.Error("second build did not use the cache")
			}
		})
	}
}

// TestZbootWrap: what ZbootWrap makes has the header image/kernel.go reads.
func TestZbootWrap(t *testing.T) {
	t.Parallel()
	img := make([]byte, 4096)
	copy(img[56:], "ARM\x64")
	z, err := ZbootWrap(img)
	if err != nil {
		t.Fatal(err)
	}
	off, size := binary.LittleEndian.Uint32(z[8:]), binary.LittleEndian.Uint32(z[12:])
	zr, err := gzip.NewReader(bytes.NewReader(z[off : off+size]))
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(zr)
	if !bytes.Equal(back, img) {
		t.Error("payload does not unpack to the Image")
	}
	if _, err := ZbootWrap([]byte("not a kernel at all, not even close to one, and long enough: 64 bytes")); err == nil {
		t.Error("wrapped something that is not an arm64 Image")
	}
}
