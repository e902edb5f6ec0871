package image

import (
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/image/initramfs"
	"github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// TestAlpineBootFromTestMirror builds the boot image from the
// Debian-sourced test mirror (alpinetest.BuildDebianRepo) through the
// whole of package alpine: the index is fetched and verified, the boot
// world resolved, linux-virt and busybox-static downloaded and verified,
// then AlpineBoot unwraps vmlinuz-virt (an EFI zboot image on aarch64) and
// packs the guest modules from linux-virt's .ko.gz files, whose
// modules.order names them .ko as kbuild writes it.
func TestAlpineBootFromTestMirror(t *testing.T) {
	t.Parallel()
	for _, arch := range []vm.Arch{vm.ArchARM64, vm.ArchAMD64} {
		t.Run(string(arch), func(t *testing.T) {
			t.Parallel()
			aa, err := alpine.GuestArch(string(arch))
			if err != nil {
				t.Fatal(err)
			}
			guest, err := assets.LocateGuest(arch)
			if errors.Is(err, assets.ErrNoGuest) {
				t.Skipf("no guest binary: %v", err)
			}
			url, key, r := sharedMirror(t, aa)
			o := r.Options(url, aa, key)
			idx, err := alpine.FetchIndexes(t.Context(), nil, o)
			if err != nil {
				t.Fatal(err)
			}
			lock, err := alpine.Resolve(idx, alpine.BootWorld, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			paths, err := alpine.Fetch(t.Context(), alpine.FetchOptions{Options: o, CacheDir: t.TempDir()}, lock)
			if err != nil {
				t.Fatal(err)
			}
			ab := &AlpineBoot{GuestArch: arch, GuestBinary: guest, Keys: key.Ring}
			for i, p := range lock.Packages {
				switch p.Name {
				case "linux-virt":
					ab.Linux = BootPackage{Locked: p, Path: paths[i]}
				case "busybox-static":
					ab.Busybox = BootPackage{Locked: p, Path: paths[i]}
				}
			}
			dir := t.TempDir()
			out, err := ab.Build(t.Context(), nil, dir)
			if err != nil {
				t.Fatal(err)
			}
			kern, err := os.ReadFile(filepath.Join(dir, out.Kernel))
			if err != nil {
				t.Fatal(err)
			}
			switch arch {
			case vm.ArchARM64:
				if len(kern) < 64 || string(kern[56:60]) != "ARM\x64" || string(kern[4:8]) == "zimg" {
					t.Errorf("kernel is not an unwrapped arm64 Image")
				}
			case vm.ArchAMD64:
				if err := kernel.CheckELF(filepath.Join(dir, out.Kernel), arch); err != nil {
					if len(kern) < 0x206 || string(kern[0x202:0x206]) != "HdrS" {
						t.Errorf("kernel is neither a PVH vmlinux nor a bzImage: %v", err)
					}
				}
			}
			f, err := os.Open(filepath.Join(dir, out.Initrd))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			ents, err := initramfs.ReadArchive(f)
			if err != nil {
				t.Fatal(err)
			}
			var mods []string
			for _, e := range ents {
				if strings.HasSuffix(e.Name, ".ko") {
					mods = append(mods, e.Name)
					if mi, err := elf.NewFile(strings.NewReader(string(e.Data))); err != nil || mi.Machine != machine(arch) {
						t.Errorf("%s is not a %s module: %v", e.Name, arch, err)
					}
				}
			}
			joined := strings.Join(mods, " ")
			for _, want := range []string{"overlay.ko", "virtiofs.ko", "virtio_blk.ko"} {
				if !strings.Contains(joined, want) {
					t.Errorf("initramfs lacks %s (has %d modules)", want, len(mods))
				}
			}
		})
	}
}

func machine(arch vm.Arch) elf.Machine { m, _ := kernel.Machine(arch); return m }
