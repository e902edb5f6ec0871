package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing/fstest"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/image/initramfs"
	"github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// alpineBootVersion changes whenever AlpineBoot's output changes for the
// same inputs, so old cache entries are not reused.
const alpineBootVersion = "alpine-boot/4"

// BootPackage is one verified package of the boot set: its lock entry and
// its file in the download cache.
type BootPackage struct {
	Locked alpine.LockedPackage
	Path   string
}

// AlpineBoot is the recipe of the guest's boot files on every host:
//
//   - the kernel: vibedom's own guest kernel when Kernel names one (every
//     driver built in), else boot/vmlinuz-virt of Alpine's linux-virt,
//     unwrapped from its EFI zboot container on aarch64 (vz's loader takes
//     a raw Image);
//   - the initramfs, vibedom's own: vibedom-guest as /init, busybox from
//     busybox-static, and the modules of kernel.GuestModules (with their
//     dependencies) from linux-virt, unpacked from .ko.gz (none with
//     vibedom's kernel).
//
// The userland is not here: it is the root image (package rootfs), which
// the guest mounts read-only under its root overlay.
//
// Packages are read in memory and verified again by alpine.Extract; nothing
// from them is written to the host but the kernel, and nothing from them
// runs on the host.
type AlpineBoot struct {
	GuestArch   vm.Arch
	Linux       BootPackage // linux-virt
	Busybox     BootPackage // busybox-static
	GuestBinary string
	// Kernel is vibedom's own guest kernel, a folder laid out as an
	// unpacked kernel package (scripts/build-kernel.sh,
	// assets.LocateGuestKernel); "" boots linux-virt's. Linux is then not
	// read.
	Kernel string
	// Keys verifies the packages; nil means alpine.ReleaseKeys(). Only
	// tests set it.
	Keys *alpine.Keyring
	// Modules is the module list; zero means kernel.GuestModules.
	Modules kernel.ModuleList
}

// Name is "alpine-boot-<arch>".
func (a *AlpineBoot) Name() string { return "alpine-boot-" + string(a.GuestArch) }

// Arch is the guest architecture.
func (a *AlpineBoot) Arch() vm.Arch { return a.GuestArch }

func (a *AlpineBoot) modules() kernel.ModuleList {
	if len(a.Modules.Required)+len(a.Modules.Optional) == 0 {
		return kernel.GuestModules
	}
	return a.Modules
}

// Inputs declares the two packages (by content, and by the lock entries
// they were verified against), the guest binary and the module list.
func (a *AlpineBoot) Inputs(ctx context.Context, in *Inputs) error {
	if _, ok := kernel.Machine(a.GuestArch); !ok {
		return fmt.Errorf("unknown guest architecture %q", a.GuestArch)
	}
	if !fileExists(a.GuestBinary) {
		return fmt.Errorf("%w: %q is not a file: run `make guest`", assets.ErrNoGuest, a.GuestBinary)
	}
	l := a.modules()
	in.Param("recipe", alpineBootVersion)
	in.Param("modules", labelList(l.Required)+";"+labelList(l.Optional))
	boot := []struct {
		label string
		bp    BootPackage
	}{{"linux-virt", a.Linux}, {"busybox-static", a.Busybox}}
	if a.Kernel != "" {
		if err := guestKernelInputs(in, a.Kernel); err != nil {
			return err
		}
		boot = boot[1:]
	}
	for _, p := range boot {
		if p.bp.Locked.Name != p.label {
			return fmt.Errorf("boot image: %s package expected, got %q", p.label, p.bp.Locked.Name)
		}
		in.Param(p.label+" lock", p.bp.Locked.String()+" "+p.bp.Locked.Checksum)
		if _, err := in.File(p.label, p.bp.Path); err != nil {
			return err
		}
	}
	// Keys only decide whether a build may start; the outputs do not
	// depend on them, so they are not an input.
	_, err := in.File("guest", a.GuestBinary)
	return err
}

// kernelArch is the Alpine arch of a guest arch.
func alpineArch(a vm.Arch) (string, error) { return alpine.GuestArch(string(a)) }

// bootFiles collects what the boot image needs from linux-virt: the kernel
// file and the module tree, in memory.
type bootFiles struct {
	kernel  []byte
	modules fstest.MapFS // paths relative to lib/modules/<release>
	release string
	size    int64
}

// maxBootFiles bounds what is kept in memory from linux-virt.
const maxBootFiles = 1 << 30

func (b *bootFiles) WriteEntry(e alpine.Entry, r io.Reader) error {
	p := e.Path
	if strings.HasPrefix(p, "usr/") {
		p = strings.TrimPrefix(p, "usr/")
	}
	switch {
	case e.Type == alpine.TypeFile && p == "boot/vmlinuz-virt":
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		b.kernel = data
		b.size += int64(len(data))
	case strings.HasPrefix(p, "lib/modules/") && e.Type == alpine.TypeFile:
		rest := strings.TrimPrefix(p, "lib/modules/")
		rel, file, ok := strings.Cut(rest, "/")
		if !ok {
			return nil
		}
		if b.release == "" {
			b.release = rel
		} else if b.release != rel {
			return fmt.Errorf("linux-virt holds modules of two kernels (%s and %s)", b.release, rel)
		}
		b.size += e.Size
		if b.size > maxBootFiles {
			return fmt.Errorf("linux-virt is larger than %d MiB", maxBootFiles>>20)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		b.modules[file] = &fstest.MapFile{Data: data, Mode: 0o644}
	}
	return nil
}

// Build writes the kernel and the initramfs into dir.
func (a *AlpineBoot) Build(ctx context.Context, in *Inputs, dir string) (Outputs, error) {
	arch, err := alpineArch(a.GuestArch)
	if err != nil {
		return Outputs{}, err
	}
	if err := kernel.CheckELF(a.GuestBinary, a.GuestArch); err != nil {
		return Outputs{}, fmt.Errorf("guest binary: %w: run `make guest`", err)
	}
	if a.Kernel != "" {
		release, mods, err := writeGuestKernel(dir, a.Kernel, a.GuestArch, a.modules())
		if err != nil {
			return Outputs{}, err
		}
		return a.initramfs(ctx, dir, arch, release, mods)
	}
	bf := &bootFiles{modules: fstest.MapFS{}}
	if err := alpine.Extract(a.Linux.Path, arch, a.Linux.Locked, a.Keys, bf); err != nil {
		return Outputs{}, err
	}
	if bf.kernel == nil {
		return Outputs{}, fmt.Errorf("%s has no boot/vmlinuz-virt", a.Linux.Locked)
	}
	if bf.release == "" {
		return Outputs{}, fmt.Errorf("%s has no modules under usr/lib/modules/", a.Linux.Locked)
	}
	if err := ctx.Err(); err != nil {
		return Outputs{}, err
	}
	mods, err := kernel.ResolveModuleListFS(bf.modules, bf.release, a.GuestArch, a.modules())
	if err != nil {
		return Outputs{}, fmt.Errorf("%s: %w", a.Linux.Locked, err)
	}
	raw := filepath.Join(dir, "vmlinuz-virt")
	if err := os.WriteFile(raw, bf.kernel, 0o600); err != nil {
		return Outputs{}, err
	}
	if err := kernel.Write(filepath.Join(dir, KernelFile), raw, a.GuestArch); err != nil {
		return Outputs{}, fmt.Errorf("%s: %w", a.Linux.Locked, err)
	}
	if err := os.Remove(raw); err != nil {
		return Outputs{}, err
	}
	return a.initramfs(ctx, dir, arch, bf.release, mods)
}

// initramfs writes the initramfs: busybox from busybox-static, the guest
// binary and mods of the kernel release.
func (a *AlpineBoot) initramfs(ctx context.Context, dir, arch, release string, mods *kernel.Modules) (Outputs, error) {
	if err := ctx.Err(); err != nil {
		return Outputs{}, err
	}
	bb := &oneFile{want: "bin/busybox.static"}
	if err := alpine.Extract(a.Busybox.Path, arch, a.Busybox.Locked, a.Keys, bb); err != nil {
		return Outputs{}, err
	}
	if bb.data == nil {
		return Outputs{}, fmt.Errorf("%s has no %s", a.Busybox.Locked, bb.want)
	}
	bbPath := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bbPath, bb.data, 0o600); err != nil {
		return Outputs{}, err
	}
	defer os.Remove(bbPath)
	if err := kernel.CheckELF(bbPath, a.GuestArch); err != nil {
		return Outputs{}, fmt.Errorf("%s: %w", a.Busybox.Locked, err)
	}

	var ar initramfs.Archive
	// The applet links are vibedom's list, not the binary's own: nothing
	// from a package runs on the host.
	for _, name := range fallbackApplets {
		if err := ar.Symlink("bin/"+name, "/bin/busybox"); err != nil {
			return Outputs{}, fmt.Errorf("busybox applet: %w", err)
		}
	}
	return writeInitramfs(&ar, dir, bbPath, a.GuestBinary, release, mods)
}

// guestKernelInputs declares vibedom's guest kernel in kdir: its kernel
// file and module lists, by content.
func guestKernelInputs(in *Inputs, kdir string) error {
	vmlinuz, release, err := kernel.Find(kdir)
	if err != nil {
		return err
	}
	in.Param("guest kernel", release)
	return kernelInputs(in, vmlinuz, filepath.Join(kdir, "lib", "modules", release))
}

// writeGuestKernel writes the guest kernel of kdir into dir as KernelFile
// and resolves l against its modules (built in, for vibedom's kernel: the
// list then packs nothing).
func writeGuestKernel(dir, kdir string, arch vm.Arch, l kernel.ModuleList) (string, *kernel.Modules, error) {
	vmlinuz, release, err := kernel.Find(kdir)
	if err != nil {
		return "", nil, err
	}
	mods, err := kernel.ResolveModuleList(filepath.Join(kdir, "lib", "modules", release), arch, l)
	if err != nil {
		return "", nil, fmt.Errorf("guest kernel %s: %w", kdir, err)
	}
	// vibedom's kernel has every driver built in and cannot load modules;
	// a folder offering module files is not one (and its modules would
	// not be in the recipe's inputs).
	if len(mods.Order) > 0 {
		return "", nil, fmt.Errorf("guest kernel %s: has loadable modules (%s); vibedom's guest kernel has none: run `make kernel`", kdir, strings.Join(mods.Order, ", "))
	}
	if err := kernel.Write(filepath.Join(dir, KernelFile), vmlinuz, arch); err != nil {
		return "", nil, fmt.Errorf("guest kernel %s: %w", kdir, err)
	}
	return release, mods, nil
}

// oneFile keeps the content of one regular file of a package.
type oneFile struct {
	want string
	data []byte
}

func (o *oneFile) WriteEntry(e alpine.Entry, r io.Reader) error {
	if e.Type == alpine.TypeFile && e.Path == o.want {
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, io.LimitReader(r, 64<<20)); err != nil {
			return err
		}
		o.data = buf.Bytes()
	}
	return nil
}
