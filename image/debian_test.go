package image

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/image/initramfs"
	kernelpkg "github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// sharedRoot is an image cache shared by the tests and benchmarks of this
// package, so the real images are built once per run.
var sharedRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vibedom-image-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedRoot = dir
	code := m.Run()
	runAtExit()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	stubOnce sync.Map // vm.Arch -> *stubGuest
)

type stubGuest struct {
	once sync.Once
	path string
	err  error
}

// testAssets returns the fetched kernel and busybox for arch, with a stand-in
// guest binary (a copy of busybox: an ELF program for arch), or skips.
func testAssets(t testing.TB, arch vm.Arch) assets.Assets {
	t.Helper()
	kdir, bb, err := assets.LocateKernel(arch)
	if err != nil {
		t.Skipf("no kernel/busybox assets for %s (run `make assets`)", arch)
	}
	v, _ := stubOnce.LoadOrStore(arch, &stubGuest{})
	sg := v.(*stubGuest)
	sg.once.Do(func() {
		data, err := os.ReadFile(bb)
		if err != nil {
			sg.err = err
			return
		}
		sg.path = filepath.Join(sharedRoot, "stub-guest-"+string(arch))
		sg.err = os.WriteFile(sg.path, data, 0o755)
	})
	if sg.err != nil {
		t.Fatal(sg.err)
	}
	return assets.Assets{Arch: arch, KernelDir: kdir, Busybox: bb, GuestBinary: sg.path}
}

// sharedImage builds (once) and returns the test image for arch.
func sharedImage(t testing.TB, arch vm.Arch) *Image {
	t.Helper()
	a := testAssets(t, arch)
	img, err := Ensure(t.Context(), filepath.Join(sharedRoot, "images"), NewDebianTest(a, nil))
	if err != nil {
		t.Fatalf("Ensure(DebianTest %s): %v", arch, err)
	}
	return img
}

func TestDebianTestImage(t *testing.T) {
	t.Parallel()
	for _, arch := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		t.Run(string(arch), func(t *testing.T) {
			a := testAssets(t, arch)
			img := sharedImage(t, arch)
			kernel, err := os.ReadFile(img.Kernel)
			if err != nil {
				t.Fatal(err)
			}
			if arch == vm.ArchAMD64 {
				// Debian's amd64 kernel has a PVH entry: the image holds
				// the decompressed vmlinux QEMU boots without firmware.
				if !kernelpkg.HasPVHNote(kernel) {
					t.Errorf("amd64 kernel is not a PVH vmlinux")
				}
			} else if err := kernelpkg.CheckHeader(kernel[:4096], arch, img.Kernel); err != nil {
				t.Errorf("kernel: %v", err)
			}
			data, err := os.ReadFile(img.Initrd)
			if err != nil {
				t.Fatal(err)
			}
			es, err := initramfs.ReadArchive(bytes.NewReader(data))
			if err != nil {
				t.Fatalf("ReadArchive: %v", err)
			}
			got := map[string]initramfs.Entry{}
			for _, e := range es {
				if _, dup := got[e.Name]; dup {
					t.Errorf("%s appears twice", e.Name)
				}
				got[e.Name] = e
				if e.UID != 0 || e.GID != 0 {
					t.Errorf("%s owned by %d:%d, want root", e.Name, e.UID, e.GID)
				}
			}
			guest, _ := os.ReadFile(a.GuestBinary)
			bb, _ := os.ReadFile(a.Busybox)
			_, release, _ := kernelpkg.Find(a.KernelDir)
			mods, err := kernelpkg.ResolveModuleList(filepath.Join(a.KernelDir, "lib/modules", release), arch, kernelpkg.GuestModules)
			if err != nil {
				t.Fatal(err)
			}
			// Each module, then the modules it needs loaded first.
			var wantList string
			for _, rel := range mods.Order {
				wantList += strings.Join(append([]string{rel}, mods.Needs[rel]...), " ") + "\n"
			}
			switch {
			case strings.HasSuffix(release, "-vibedom"):
				// vibedom's guest kernel (make kernel): everything built in.
				if wantList != "" || !slices.Contains(mods.Builtin, "ext4") {
					t.Errorf("the guest kernel's image packs modules:\n%s", wantList)
				}
			case !strings.Contains(wantList, "ext4.ko kernel/fs/jbd2/jbd2.ko"):
				t.Errorf("the module list does not say what ext4 needs:\n%s", wantList)
			}
			checks := []struct {
				name string
				mode fs.FileMode
				data []byte // nil: not checked
			}{
				{"init", fs.ModeSymlink | 0o777, []byte(proto.GuestBinaryPath)},
				{strings.TrimPrefix(proto.GuestBinaryPath, "/"), 0o755, guest},
				{"bin/busybox", 0o755, bb},
				{strings.TrimPrefix(proto.ModuleListPath, "/"), 0o644, []byte(wantList)},
				{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n")},
				{"etc/group", 0o644, []byte("root:x:0:\n")},
				{"etc/hosts", 0o644, nil},
				{"etc/nsswitch.conf", 0o644, nil},
				{"tmp", fs.ModeDir | fs.ModeSticky | 0o777, nil},
				{"var/tmp", fs.ModeDir | fs.ModeSticky | 0o777, nil},
				{"root", fs.ModeDir | 0o700, nil},
				{"proc", fs.ModeDir | 0o555, nil},
				{"sys", fs.ModeDir | 0o555, nil},
				{"dev", fs.ModeDir | 0o755, nil},
				{"run", fs.ModeDir | 0o755, nil},
				{"mnt/workspace", fs.ModeDir | 0o755, nil},
				{"mnt/scratch", fs.ModeDir | 0o755, nil},
				{"work", fs.ModeDir | 0o755, nil},
				{"etc/ssl/certs", fs.ModeDir | 0o755, nil},
			}
			for _, c := range checks {
				e, ok := got[c.name]
				if !ok {
					t.Errorf("%s missing", c.name)
					continue
				}
				if e.Mode != c.mode {
					t.Errorf("%s: mode %v, want %v", c.name, e.Mode, c.mode)
				}
				if c.data != nil && !bytes.Equal(e.Data, c.data) {
					t.Errorf("%s: content differs (%d bytes, want %d)", c.name, len(e.Data), len(c.data))
				}
			}
			// Each listed module is packed, without its signature and with
			// its BPF type information hidden, and nothing else.
			packed := 0
			for name := range got {
				if strings.HasSuffix(name, ".ko") {
					packed++
				}
			}
			if packed != len(mods.Order) {
				t.Errorf("%d module files packed, %d listed", packed, len(mods.Order))
			}
			for _, rel := range mods.Order {
				e, ok := got[path.Join("lib/modules", release, rel)]
				host, _ := os.ReadFile(filepath.Join(a.KernelDir, "lib/modules", release, rel))
				want := kernelpkg.HideBTF(kernelpkg.StripSignature(host))
				if !ok || !bytes.Equal(e.Data, want) || e.Mode != 0o644 {
					t.Errorf("module %s: packed %v, mode %v, content as expected %v", rel, ok, e.Mode, bytes.Equal(e.Data, want))
				}
				if bytes.HasSuffix(e.Data, []byte("~Module signature appended~\n")) {
					t.Errorf("module %s: packed with its signature", rel)
				}
			}
			// Busybox applets the guest and its tests rely on.
			for _, applet := range []string{"sh", "mount", "insmod", "mke2fs", "udhcpc", "poweroff", "ip", "stat", "sha256sum"} {
				found := false
				for _, dir := range []string{"bin", "sbin", "usr/bin", "usr/sbin"} {
					if e, ok := got[dir+"/"+applet]; ok && e.Mode.Type() == fs.ModeSymlink && string(e.Data) == "/bin/busybox" {
						found = true
					}
				}
				if !found {
					t.Errorf("no busybox applet link for %s", applet)
				}
			}
		})
	}
}

// TestDebianTestReproducible builds the same image in two caches: the
// outputs and digests are identical, and a second Ensure is a hit.
func TestDebianTestReproducible(t *testing.T) {
	t.Parallel()
	a := testAssets(t, vm.ArchAMD64)
	img1 := sharedImage(t, vm.ArchAMD64)
	root2 := t.TempDir()
	img2, err := Ensure(t.Context(), root2, NewDebianTest(a, nil))
	if err != nil {
		t.Fatal(err)
	}
	if img1.Digest != img2.Digest {
		t.Errorf("digest: %s vs %s", img1.Digest, img2.Digest)
	}
	for _, p := range [][2]string{{img1.Kernel, img2.Kernel}, {img1.Initrd, img2.Initrd}} {
		if fileSHA(t, p[0]) != fileSHA(t, p[1]) {
			t.Errorf("%s and %s differ", p[0], p[1])
		}
	}
	fi1, _ := os.Stat(filepath.Join(img2.Dir, "manifest.json"))
	img3, err := Ensure(t.Context(), root2, NewDebianTest(a, nil))
	if err != nil {
		t.Fatal(err)
	}
	fi3, _ := os.Stat(filepath.Join(img3.Dir, "manifest.json"))
	if img3.Dir != img2.Dir || !os.SameFile(fi1, fi3) {
		t.Errorf("second Ensure rebuilt the image")
	}
	t.Run("fewer modules is another image", func(t *testing.T) {
		img4, err := Ensure(t.Context(), root2, NewDebianTest(a, []string{"overlay"}))
		if err != nil {
			t.Fatal(err)
		}
		if img4.Dir == img2.Dir {
			t.Errorf("different module list, same image %s", img4.Dir)
		}
		es, _ := initramfs.ReadArchive(mustOpen(t, img4.Initrd))
		for _, e := range es {
			if strings.HasSuffix(e.Name, ".ko") && !strings.HasSuffix(e.Name, "/overlay.ko") {
				t.Errorf("unexpected module %s", e.Name)
			}
		}
	})
}

func fileSHA(t *testing.T, p string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// TestDebianTestRefuses checks inputs that must not make an image.
func TestDebianTestRefuses(t *testing.T) {
	t.Parallel()
	amd := testAssets(t, vm.ArchAMD64)
	arm := testAssets(t, vm.ArchARM64)
	mixed := func(f func(a *assets.Assets)) assets.Assets { a := amd; f(&a); return a }
	noKernel := t.TempDir()
	os.MkdirAll(filepath.Join(noKernel, "boot"), 0o755)
	tests := []struct {
		name    string
		assets  assets.Assets
		modules []string
		want    string
	}{
		{"guest for the other arch", mixed(func(a *assets.Assets) { a.GuestBinary = arm.Busybox }), nil, "guest binary"},
		{"busybox for the other arch", mixed(func(a *assets.Assets) { a.Busybox = arm.Busybox }), nil, "busybox"},
		{"kernel dir of the other arch", mixed(func(a *assets.Assets) { a.KernelDir = arm.KernelDir }), nil, "kernel"},
		{"guest is a script", mixed(func(a *assets.Assets) {
			p := filepath.Join(t.TempDir(), "guest")
			os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755)
			a.GuestBinary = p
		}), nil, "not an ELF"},
		{"guest missing", mixed(func(a *assets.Assets) { a.GuestBinary = "/nonexistent/vibedom-guest" }), nil, "guest"},
		{"no kernel", mixed(func(a *assets.Assets) { a.KernelDir = noKernel }), nil, "make assets"},
		{"unknown module", amd, []string{"overlay", "no_such_module"}, "no_such_module"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Ensure(t.Context(), t.TempDir(), NewDebianTest(tt.assets, tt.modules))
			t.Logf("%v", err)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Ensure: got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
