package image

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/image/initramfs"
	"github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// debianTestVersion changes whenever DebianTest's output changes for the
// same inputs, so old cache entries are not reused.
const debianTestVersion = "debian-test/4"

// File names of DebianTest's outputs inside the image directory.
const (
	KernelFile = "kernel"
	InitrdFile = "initramfs.cpio"
)

// DebianTest is the recipe of the test image used with QEMU (and on any
// host with a Debian kernel): the kernel from an unpacked Debian kernel
// package, and an uncompressed initramfs holding
//
//   - /init, a symlink to proto.GuestBinaryPath (the vibedom-guest binary);
//   - /bin/busybox with a symlink for each of its applets;
//   - the kernel modules Modules needs under /lib/modules/<release>/, and
//     their load order in proto.ModuleListPath;
//   - /etc/passwd, /etc/group, /etc/hosts, /etc/nsswitch.conf and the empty
//     mount points and directories the guest uses.
//
// Device nodes are not included: the guest mounts devtmpfs.
type DebianTest struct {
	// Assets are the kernel, busybox and guest binary to pack.
	Assets assets.Assets
	// Modules are the modules to include with their dependencies, every
	// one required; when empty, kernel.DefaultModules, all required, for a
	// Debian kernel, and kernel.GuestModules for vibedom's guest kernel.
	// Built-in ones are skipped.
	Modules []string
}

var _ Recipe = (*DebianTest)(nil)

// NewDebianTest returns the test image recipe for the given assets and
// modules (see DebianTest.Modules for an empty list).
func NewDebianTest(a assets.Assets, modules []string) *DebianTest {
	return &DebianTest{Assets: a, Modules: slices.Clone(modules)}
}

// Name is "debian-test-<arch>".
func (d *DebianTest) Name() string { return "debian-test-" + string(d.Assets.Arch) }

// Arch is the assets' architecture.
func (d *DebianTest) Arch() vm.Arch { return d.Assets.Arch }

func (d *DebianTest) modules() kernel.ModuleList {
	switch {
	case len(d.Modules) > 0:
		return kernel.ModuleList{Required: d.Modules}
	case filepath.Base(d.Assets.KernelDir) == assets.GuestKernelDir:
		// vibedom's guest kernel: built in what the guest uses, and not
		// what one arch has no use for (gpio_keys on x86).
		return kernel.GuestModules
	default:
		// A Debian kernel has every module of the list: hold it to all.
		return kernel.ModuleList{Required: kernel.DefaultModules}
	}
}

// modulesLabel names the module list in the recipe's inputs and memo keys.
func (d *DebianTest) modulesLabel() string {
	l := d.modules()
	return labelList(l.Required) + ";" + labelList(l.Optional)
}

// kernelInputs declares a kernel file and its module lists (modules.order,
// modules.builtin, modules.builtin.modinfo in modDir) by content, a list
// that is not there as absent.
func kernelInputs(in *Inputs, vmlinuz, modDir string) error {
	if _, err := in.File("kernel", vmlinuz); err != nil {
		return err
	}
	for _, n := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		p := filepath.Join(modDir, n)
		if !exists(p) {
			in.Param(n, "absent")
			continue
		}
		if _, err := in.File(n, p); err != nil {
			return err
		}
	}
	return nil
}

// resolved is a module resolution as kept in the memo.
type resolved struct {
	Order   []string          `json:"order"`
	Builtin []string          `json:"builtin"`
	Sums    map[string]string `json:"sums"` // module file -> SHA-256
}

// Inputs declares the guest binary, busybox, the kernel, the kernel's
// module lists, the wanted modules and every module file packed.
func (d *DebianTest) Inputs(ctx context.Context, in *Inputs) error {
	a := d.Assets
	if _, ok := kernel.Machine(a.Arch); !ok {
		return fmt.Errorf("unknown guest architecture %q", a.Arch)
	}
	if !fileExists(a.GuestBinary) {
		return fmt.Errorf("%w: %q is not a file: run `make guest`", assets.ErrNoGuest, a.GuestBinary)
	}
	if !fileExists(a.Busybox) {
		return fmt.Errorf("%w: busybox %q is not a file: run `make assets`", assets.ErrNoAssets, a.Busybox)
	}
	vmlinuz, release, err := kernel.Find(a.KernelDir)
	if err != nil {
		return err
	}
	modDir := filepath.Join(a.KernelDir, "lib", "modules", release)
	in.Param("recipe", debianTestVersion)
	in.Param("release", release)
	in.Param("modules", d.modulesLabel())
	for _, f := range []struct{ label, path string }{
		{"guest", a.GuestBinary},
		{"busybox", a.Busybox},
	} {
		if _, err := in.File(f.label, f.path); err != nil {
			return err
		}
	}
	if err := kernelInputs(in, vmlinuz, modDir); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key, err := d.resolutionKey(in.memo, vmlinuz, modDir, release)
	if err != nil {
		return err
	}
	res, err := d.resolution(in.memo, modDir, key)
	if err != nil {
		return err
	}
	in.Param("builtin", labelList(res.Builtin))
	for _, rel := range res.Order {
		if _, err := in.File("module "+rel, filepath.Join(modDir, filepath.FromSlash(rel))); err != nil {
			return err
		}
	}
	return nil
}

// resolution returns the module resolution for the kernel and module list
// named by key: from the memo when every module file it packs is unchanged,
// else resolved afresh (which reads every module's metadata once). The key
// covers the kernel and its module lists by content, and the memo entry the
// packed modules; a module outside the packed set whose aliases alone were
// edited in place is the one change not noticed until the kernel or the
// lists change too (a new kernel package changes both).
func (d *DebianTest) resolution(m *memo, modDir, key string) (*resolved, error) {
	if v, ok := m.value(key); ok {
		var res resolved
		if json.Unmarshal([]byte(v), &res) == nil && len(res.Sums) == len(res.Order) {
			fresh := true
			for _, rel := range res.Order {
				sum, err := m.fileSum(filepath.Join(modDir, filepath.FromSlash(rel)))
				if err != nil || sum != res.Sums[rel] {
					fresh = false
					break
				}
			}
			if fresh {
				return &res, nil
			}
		}
	}
	mods, err := kernel.ResolveModuleList(modDir, d.Assets.Arch, d.modules())
	if err != nil {
		return nil, err
	}
	return remember(m, key, mods)
}

// resolutionKey names a module resolution in the memo: the recipe
// version, arch, release, wanted modules, and the content of the kernel
// and its module lists.
func (d *DebianTest) resolutionKey(m *memo, vmlinuz, modDir, release string) (string, error) {
	key := []string{debianTestVersion, string(d.Assets.Arch), release, d.modulesLabel()}
	for _, p := range []string{
		vmlinuz,
		filepath.Join(modDir, "modules.order"),
		filepath.Join(modDir, "modules.builtin"),
		filepath.Join(modDir, "modules.builtin.modinfo"),
	} {
		if p != vmlinuz && !exists(p) {
			key = append(key, filepath.Base(p)+"=absent")
			continue
		}
		sum, err := m.fileSum(p)
		if err != nil {
			return "", err
		}
		key = append(key, sum)
	}
	return "debian-modules:" + hexSum(strings.Join(key, "\n")), nil
}

// remember stores a fresh resolution in the memo under key, with the hash
// of every module file it packs.
func remember(m *memo, key string, mods *kernel.Modules) (*resolved, error) {
	res := &resolved{Order: mods.Order, Builtin: mods.Builtin, Sums: map[string]string{}}
	for _, rel := range mods.Order {
		sum, err := m.fileSum(filepath.Join(mods.Dir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		res.Sums[rel] = sum
	}
	data, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	m.setValue(key, string(data))
	return res, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Build writes KernelFile and InitrdFile into dir.
func (d *DebianTest) Build(ctx context.Context, in *Inputs, dir string) (Outputs, error) {
	a := d.Assets
	if err := kernel.CheckELF(a.GuestBinary, a.Arch); err != nil {
		return Outputs{}, fmt.Errorf("guest binary: %w: run `make guest`", err)
	}
	if err := kernel.CheckELF(a.Busybox, a.Arch); err != nil {
		return Outputs{}, fmt.Errorf("busybox: %w: run `make assets`", err)
	}
	vmlinuz, release, err := kernel.Find(a.KernelDir)
	if err != nil {
		return Outputs{}, err
	}
	modDir := filepath.Join(a.KernelDir, "lib", "modules", release)
	mods, err := kernel.ResolveModuleList(modDir, a.Arch, d.modules())
	if err != nil {
		return Outputs{}, err
	}
	if err := ctx.Err(); err != nil {
		return Outputs{}, err
	}
	// Let the next Inputs call see exactly this resolution (Ensure compares
	// digests before and after the build).
	key, err := d.resolutionKey(in.memo, vmlinuz, modDir, release)
	if err != nil {
		return Outputs{}, err
	}
	if _, err := remember(in.memo, key, mods); err != nil {
		return Outputs{}, err
	}
	if err := kernel.Write(filepath.Join(dir, KernelFile), vmlinuz, a.Arch); err != nil {
		return Outputs{}, err
	}

	var ar initramfs.Archive
	applets, err := busyboxApplets(ctx, a.Busybox, a.Arch)
	if err != nil {
		return Outputs{}, err
	}
	for _, p := range applets {
		if err := ar.Symlink(p, "/bin/busybox"); err != nil {
			return Outputs{}, fmt.Errorf("busybox applet: %w", err)
		}
	}
	return writeInitramfs(&ar, dir, a.Busybox, a.GuestBinary, release, mods)
}

// writeInitramfs adds the base (addBase) to ar, whose applet links are in,
// and writes it as dir/InitrdFile.
func writeInitramfs(ar *initramfs.Archive, dir, busybox, guestBinary, release string, mods *kernel.Modules) (Outputs, error) {
	if err := addBase(ar, busybox, guestBinary, release, mods); err != nil {
		return Outputs{}, err
	}
	f, err := os.OpenFile(filepath.Join(dir, InitrdFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Outputs{}, err
	}
	_, err = ar.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Outputs{}, fmt.Errorf("write initramfs: %w", err)
	}
	return Outputs{Kernel: KernelFile, Initrd: InitrdFile}, nil
}

// addBase adds everything but the busybox applet links: the directories,
// busybox, the guest binary as /init, the modules and their load order, and
// the few /etc files the guest needs. Modules come from mods.Dir when set,
// else from mods.FS.
func addBase(ar *initramfs.Archive, busybox, guestBinary, release string, mods *kernel.Modules) error {
	dirs := []struct {
		name string
		perm fs.FileMode
	}{
		{"bin", 0o755}, {"sbin", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
		{"etc", 0o755}, {"etc/ssl/certs", 0o755}, {"etc/vibedom", 0o755},
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755},
		{"tmp", 0o777 | fs.ModeSticky}, {"var/tmp", 0o777 | fs.ModeSticky},
		{strings.TrimPrefix(proto.WorkspaceMount, "/"), 0o755},
		{strings.TrimPrefix(proto.ScratchMount, "/"), 0o755},
		{strings.TrimPrefix(proto.WorkDir, "/"), 0o755},
		{"root", 0o700},
		{"lib/modules/" + release, 0o755},
	}
	for _, dd := range dirs {
		if err := ar.Dir(dd.name, dd.perm); err != nil {
			return err
		}
	}
	add := func(e initramfs.Entry) error {
		if err := ar.Add(e); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		return nil
	}
	if err := add(initramfs.Entry{Name: "bin/busybox", Mode: 0o755, Source: busybox}); err != nil {
		return err
	}
	if err := add(initramfs.Entry{Name: proto.GuestBinaryPath, Mode: 0o755, Source: guestBinary}); err != nil {
		return err
	}
	if err := ar.Symlink("init", proto.GuestBinaryPath); err != nil {
		return err
	}
	var list bytes.Buffer
	for _, rel := range mods.Order {
		e := initramfs.Entry{Name: path.Join("lib/modules", release, kernel.PackedName(rel)), Mode: 0o644}
		var data []byte
		var err error
		if mods.Dir == "" {
			data, err = kernel.ReadModuleFS(mods.FS, rel)
		} else {
			data, err = kernel.ReadModule(filepath.Join(mods.Dir, filepath.FromSlash(rel)))
		}
		if err != nil {
			return err
		}
		// Without what the guest kernel would check on every boot and
		// never use: the signature and the BPF type information.
		e.Data = kernel.HideBTF(kernel.StripSignature(data))
		if err := add(e); err != nil {
			return err
		}
		list.WriteString(kernel.PackedName(rel))
		for _, d := range mods.Needs[rel] {
			list.WriteByte(' ')
			list.WriteString(kernel.PackedName(d))
		}
		list.WriteByte('\n')
	}
	files := []struct {
		name string
		data string
	}{
		{proto.ModuleListPath, list.String()},
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"},
		{"etc/group", "root:x:0:\n"},
		{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
		{"etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"},
	}
	for _, f := range files {
		if err := ar.File(f.name, 0o644, []byte(f.data)); err != nil {
			return err
		}
	}
	return nil
}

// fallbackApplets is used when busybox cannot run on this host (another
// architecture, or not Linux). They all go to /bin.
var fallbackApplets = strings.Fields(`sh ash ls cat mount umount mkdir rm rmdir mv cp chmod chown ln
echo uname id sleep kill ps mke2fs mkfs.ext2 udhcpc ip ifconfig route nc wget ssl_client sync
poweroff reboot stat sha256sum md5sum find grep sed awk head tail wc dd touch env true false test [
printf date tr cut sort uniq xargs hostname dmesg insmod modprobe vi less du df readlink realpath
stty tty reset clear timeout seq yes hexdump od base64 tee which basename dirname mktemp nslookup
ping traceroute getty login su more cmp diff patch tar gzip gunzip xz unxz`)

// busyboxApplets lists the paths (relative to /) at which busybox applets
// are installed: what `busybox --list-full` says when the binary runs on
// this host, else fallbackApplets under bin/.
func busyboxApplets(ctx context.Context, busybox string, arch vm.Arch) ([]string, error) {
	if runtime.GOOS == "linux" && string(arch) == runtime.GOARCH {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, busybox, "--list-full")
		cmd.Env = []string{"PATH=/nonexistent"}
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("list busybox applets (%s --list-full): %w", busybox, err)
		}
		var list []string
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			p := strings.TrimSpace(sc.Text())
			if p == "" {
				continue
			}
			n, err := initramfs.CleanName(p)
			if err != nil || n == "bin/busybox" || n == "init" {
				continue
			}
			list = append(list, n)
		}
		if len(list) == 0 {
			return nil, fmt.Errorf("list busybox applets: %s --list-full printed nothing", busybox)
		}
		return list, nil
	}
	list := make([]string, 0, len(fallbackApplets))
	for _, a := range fallbackApplets {
		list = append(list, "bin/"+a)
	}
	return list, nil
}
