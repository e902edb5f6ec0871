package kernel

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vibedom/vibedom/vm"
)

// makeKO returns a minimal ELF relocatable object whose .modinfo section
// holds the given key=value records, as a kernel module's does.
func makeKO(t *testing.T, machine elf.Machine, info ...string) []byte {
	t.Helper()
	modinfo := []byte(strings.Join(info, "\x00") + "\x00")
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize = 64
	modOff := uint64(ehsize)
	strOff := modOff + uint64(len(modinfo))
	shOff := (strOff + uint64(len(shstrtab)) + 7) &^ 7
	var b bytes.Buffer
	writeELFHeader(&b, machine, shOff, 3, 2)
	b.Write(modinfo)
	b.Write(shstrtab)
	b.Write(make([]byte, shOff-uint64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: modOff, Size: uint64(len(modinfo)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstrtab)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, &s)
	}
	return b.Bytes()
}

// writeELFHeader writes the header of a little-endian 64-bit relocatable
// object with shnum 64-byte section headers at shoff.
func writeELFHeader(b *bytes.Buffer, machine elf.Machine, shoff uint64, shnum, shstrndx uint16) {
	h := elf.Header64{
		Type: uint16(elf.ET_REL), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Shoff: shoff, Ehsize: 64, Shentsize: 64, Shnum: shnum, Shstrndx: shstrndx,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	h.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(b, binary.LittleEndian, &h)
}

// fakeModule describes one module of a synthetic module tree.
type fakeModule struct {
	path    string // relative to lib/modules/<release>/
	info    []string
	machine elf.Machine // EM_X86_64 when zero
	release string      // vermagic release; the tree's when empty
}

const fakeRelease = "6.1.0-test-amd64"

// fakeTree writes a module tree and returns lib/modules/<release>.
func fakeTree(t *testing.T, mods []fakeModule, builtin []string, builtinInfo []string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lib", "modules", fakeRelease)
	var order []string
	for _, m := range mods {
		p := filepath.Join(dir, m.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mach := m.machine
		if mach == 0 {
			mach = elf.EM_X86_64
		}
		rel := m.release
		if rel == "" {
			rel = fakeRelease
		}
		info := append(slices.Clone(m.info), "name="+moduleName(m.path), "vermagic="+rel+" SMP preempt mod_unload modversions ")
		ko := makeKO(t, mach, info...)
		if strings.HasSuffix(m.path, ".ko.gz") {
			ko = gz(t, ko)
		}
		if err := os.WriteFile(p, ko, 0o644); err != nil {
			t.Fatal(err)
		}
		order = append(order, m.path)
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("modules.order", strings.Join(order, "\n")+"\n")
	write("modules.builtin", strings.Join(builtin, "\n")+"\n")
	if builtinInfo != nil {
		write("modules.builtin.modinfo", strings.Join(builtinInfo, "\x00")+"\x00")
	}
	return dir
}

func TestResolveModules(t *testing.T) {
	t.Parallel()
	base := []fakeModule{
		{path: "kernel/drivers/virtio/virtio_ring.ko", info: []string{"depends="}},
		{path: "kernel/drivers/virtio/virtio.ko", info: []string{"depends=virtio_ring"}},
		{path: "kernel/drivers/virtio/virtio_pci.ko", info: []string{"depends=virtio_ring,virtio"}},
		{path: "kernel/fs/ext4/ext4.ko", info: []string{"depends=jbd2,crc16", "softdep=pre: crypto-crc32c"}},
		{path: "kernel/fs/jbd2/jbd2.ko", info: []string{"depends=", "softdep=pre: crypto-crc32c"}},
		{path: "kernel/lib/crc16.ko", info: []string{"depends="}},
		{path: "kernel/crypto/crc32c_generic.ko", info: []string{"alias=crypto-crc32c", "alias=crc32c", "depends="}},
		{path: "kernel/arch/x86/crypto/crc32c-intel.ko", info: []string{"alias=crypto-crc32c", "depends="}},
		{path: "kernel/net/9p/9pnet.ko", info: []string{"depends="}},
		{path: "kernel/net/9p/9pnet_virtio.ko", info: []string{"depends=9pnet,virtio_ring,virtio"}},
		{path: "kernel/fs/fuse/fuse.ko", info: []string{"depends=", "softdep=post: cuse"}},
		{path: "kernel/fs/fuse/cuse.ko", info: []string{"depends=fuse"}},
		{path: "kernel/fs/a.ko", info: []string{"depends=", "softdep=pre: b"}},
		{path: "kernel/fs/b.ko", info: []string{"depends=", "softdep=pre: a"}},
		{path: "kernel/fs/wants-ghost.ko", info: []string{"depends=", "softdep=pre: ghost-alias"}},
		{path: "kernel/fs/wants-builtin.ko", info: []string{"depends=", "softdep=pre: crypto-sha256"}},
	}
	builtin := []string{"kernel/net/packet/af_packet.ko", "kernel/crypto/sha256_generic.ko"}
	builtinInfo := []string{"af_packet.alias=net-pf-17", "sha256_generic.alias=crypto-sha256"}
	dir := fakeTree(t, base, builtin, builtinInfo)

	tests := []struct {
		name        string
		want        []string
		order       []string // exact order, relative paths without kernel/ and .ko
		builtin     []string
		unresolved  []string
		wantErrIs   error
		errContains string
	}{
		{
			name:  "depends first",
			want:  []string{"virtio_pci"},
			order: []string{"drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci"},
		},
		{
			name:  "shared dependencies once",
			want:  []string{"virtio_pci", "9pnet_virtio"},
			order: []string{"drivers/virtio/virtio_ring", "drivers/virtio/virtio", "drivers/virtio/virtio_pci", "net/9p/9pnet", "net/9p/9pnet_virtio"},
		},
		{
			name: "softdep by alias pulls every provider",
			want: []string{"ext4"},
			order: []string{"crypto/crc32c_generic", "arch/x86/crypto/crc32c-intel", "fs/jbd2/jbd2", "lib/crc16",
				"fs/ext4/ext4"},
		},
		{
			name:  "softdep post after the module",
			want:  []string{"fuse"},
			order: []string{"fs/fuse/fuse", "fs/fuse/cuse"},
		},
		{
			name:  "softdep cycle is broken",
			want:  []string{"a"},
			order: []string{"fs/b", "fs/a"},
		},
		{
			name:       "unresolvable softdep is noted",
			want:       []string{"wants-ghost"},
			order:      []string{"fs/wants-ghost"},
			unresolved: []string{"ghost-alias"},
		},
		{
			name:  "softdep satisfied by a built-in",
			want:  []string{"wants_builtin"},
			order: []string{"fs/wants-builtin"},
		},
		{
			name:    "built-in skipped",
			want:    []string{"af_packet", "crc16"},
			order:   []string{"lib/crc16"},
			builtin: []string{"af_packet"},
		},
		{
			name:  "dash and underscore are the same name",
			want:  []string{"crc32c-intel"},
			order: []string{"arch/x86/crypto/crc32c-intel"},
		},
		{
			name:        "unknown module",
			want:        []string{"virtio_pci", "nosuchmod"},
			wantErrIs:   ErrUnknownModule,
			errContains: "nosuchmod",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ResolveModules(dir, vm.ArchAMD64, tt.want)
			if tt.wantErrIs != nil {
				if !errors.Is(err, tt.wantErrIs) || !strings.Contains(err.Error(), tt.errContains) {
					t.Fatalf("ResolveModules: got %v, want %v mentioning %q", err, tt.wantErrIs, tt.errContains)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveModules: %v", err)
			}
			var order []string
			for _, p := range m.Order {
				order = append(order, strings.TrimSuffix(strings.TrimPrefix(p, "kernel/"), ".ko"))
			}
			if !slices.Equal(order, tt.order) {
				t.Errorf("order: got %v, want %v", order, tt.order)
			}
			if !slices.Equal(m.Builtin, tt.builtin) {
				t.Errorf("builtin: got %v, want %v", m.Builtin, tt.builtin)
			}
			if !slices.Equal(m.Unresolved, tt.unresolved) {
				t.Errorf("unresolved: got %v, want %v", m.Unresolved, tt.unresolved)
			}
			if m.Release != fakeRelease {
				t.Errorf("release: got %q, want %q", m.Release, fakeRelease)
			}
		})
	}
}

// TestResolveModulesRefuses covers module trees that must not be packed.
func TestResolveModulesRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mods []fakeModule
		want string
		is   error
	}{
		{
			name: "compressed module",
			mods: []fakeModule{
				{path: "kernel/fs/overlayfs/overlay.ko.xz"},
			},
			want: "overlay", is: ErrCompressedModule,
		},
		{
			name: "module for another arch",
			mods: []fakeModule{
				{path: "kernel/fs/overlayfs/overlay.ko", info: []string{"depends="}, machine: elf.EM_AARCH64},
			},
			want: "overlay", is: ErrModuleMismatch,
		},
		{
			name: "module for another kernel",
			mods: []fakeModule{
				{path: "kernel/fs/overlayfs/overlay.ko", info: []string{"depends="}, release: "6.1.0-55-amd64"},
			},
			want: "overlay", is: ErrModuleMismatch,
		},
		{
			name: "dependency for another kernel",
			mods: []fakeModule{
				{path: "kernel/fs/overlayfs/overlay.ko", info: []string{"depends=evil"}},
				{path: "kernel/evil.ko", info: []string{"depends="}, release: "6.9.9"},
			},
			want: "overlay", is: ErrModuleMismatch,
		},
		{
			name: "missing dependency",
			mods: []fakeModule{
				{path: "kernel/fs/overlayfs/overlay.ko", info: []string{"depends=gone"}},
			},
			want: "overlay", is: ErrUnknownModule,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fakeTree(t, tt.mods, nil, nil)
			_, err := ResolveModules(dir, vm.ArchAMD64, []string{tt.want})
			if !errors.Is(err, tt.is) {
				t.Errorf("ResolveModules: got %v, want %v", err, tt.is)
			}
		})
	}
	t.Run("not an ELF file", func(t *testing.T) {
		dir := fakeTree(t, []fakeModule{{path: "kernel/x.ko"}}, nil, nil)
		os.WriteFile(filepath.Join(dir, "kernel/x.ko"), []byte("#!/bin/sh\necho pwned\n"), 0o644)
		if _, err := ResolveModules(dir, vm.ArchAMD64, []string{"x"}); err == nil {
			t.Errorf("ResolveModules accepted a non-ELF module")
		}
	})
	t.Run("no modules.order", func(t *testing.T) {
		dir := fakeTree(t, []fakeModule{{path: "kernel/fs/x-y.ko", info: []string{"depends="}}}, nil, nil)
		os.Remove(filepath.Join(dir, "modules.order"))
		m, err := ResolveModules(dir, vm.ArchAMD64, []string{"x_y"})
		if err != nil || !slices.Equal(m.Order, []string{"kernel/fs/x-y.ko"}) {
			t.Errorf("ResolveModules without modules.order: got %v, %v", m, err)
		}
	})
}

// debianModules returns lib/modules/<release> of the fetched Debian kernel
// for arch, or skips.
func debianModules(t testing.TB, arch vm.Arch) string {
	t.Helper()
	kdir := testKernelDir(arch)
	if kdir == "" {
		t.Skipf("no Debian kernel for %s (run `make assets`)", arch)
	}
	_, rel, err := Find(kdir)
	if err != nil {
		t.Skipf("no Debian kernel for %s: %v", arch, err)
	}
	return filepath.Join(kdir, "lib", "modules", rel)
}

// testKernelDir finds the fetched Debian kernel package for arch the way
// assets.Locate does for tests ($VIBEDOM_ASSETS, else .cache/assets
// in this folder or a parent), or "". This package may not import image.
func testKernelDir(arch vm.Arch) string { return testAssetDir(arch, "kernel") }

// testAssetDir is <assets>/<arch>/<sub> for the assets folder tests use
// ($VIBEDOM_ASSETS, else the first .cache/assets/<arch>/<sub> found in
// this folder or a parent), or "".
func testAssetDir(arch vm.Arch, sub string) string {
	rel := filepath.Join(string(arch), sub)
	if d := os.Getenv("VIBEDOM_ASSETS"); d != "" {
		return filepath.Join(d, rel)
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		k := filepath.Join(dir, ".cache", "assets", rel)
		if fi, err := os.Stat(k); err == nil && fi.IsDir() {
			return k
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// TestResolveModulesDebian resolves the guest's module set on the real
// Debian kernels and checks the order against the modules' own metadata.
func TestResolveModulesDebian(t *testing.T) {
	t.Parallel()
	tests := []struct {
		arch    vm.Arch
		must    []string // must be in the order
		mustNot []string // built in on this arch
		builtin []string
	}{
		{
			arch: vm.ArchAMD64,
			must: []string{"virtio", "virtio_ring", "virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_console",
				"9p", "9pnet", "9pnet_virtio", "virtiofs", "fuse", "overlay", "ext4", "jbd2", "mbcache", "crc16",
				"crc32c_generic", "crc32c_intel", "vsock", "vmw_vsock_virtio_transport", "netfs", "fscache"},
			builtin: []string{"af_packet"},
		},
		{
			arch: vm.ArchARM64,
			must: []string{"virtio_pci", "virtio_mmio", "virtio_blk", "virtio_net", "virtio_console",
				"9p", "9pnet", "9pnet_virtio", "virtiofs", "overlay", "ext4", "jbd2", "crc32c_generic", "vsock",
				"vmw_vsock_virtio_transport"},
			mustNot: []string{"virtio", "virtio_ring"},
			builtin: []string{"af_packet"},
		},
	}
	for _, tt := range tests {
		t.Run(string(tt.arch), func(t *testing.T) {
			dir := debianModules(t, tt.arch)
			m, err := ResolveModules(dir, tt.arch, DefaultModules)
			if err != nil {
				t.Fatalf("ResolveModules: %v", err)
			}
			pos := map[string]int{}
			for i, p := range m.Order {
				n := moduleName(p)
				if _, dup := pos[n]; dup {
					t.Errorf("%s listed twice", n)
				}
				pos[n] = i
			}
			for _, n := range tt.must {
				if _, ok := pos[n]; !ok {
					t.Errorf("%s missing from %v", n, m.Order)
				}
			}
			for _, n := range tt.mustNot {
				if _, ok := pos[n]; ok {
					t.Errorf("%s is built in on %s but listed", n, tt.arch)
				}
			}
			for _, n := range tt.builtin {
				if !slices.Contains(m.Builtin, n) {
					t.Errorf("builtin: %s missing from %v", n, m.Builtin)
				}
			}
			// Every module comes after its hard dependencies, and after its
			// soft pre-dependencies where those are modules.
			for _, p := range m.Order {
				mi, err := readModinfo(os.DirFS(filepath.Dir(filepath.Join(dir, p))), filepath.Base(filepath.Join(dir, p)))
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range mi.depends {
					if pos[d] >= pos[moduleName(p)] {
						t.Errorf("%s is loaded before its dependency %s", moduleName(p), d)
					}
				}
			}
			if pos["crc32c_generic"] >= pos["ext4"] || pos["crc32c_generic"] >= pos["jbd2"] {
				t.Errorf("crc32c_generic must be loaded before jbd2 and ext4 (softdep): %v", m.Order)
			}
			if len(m.Unresolved) != 0 {
				t.Errorf("unresolved soft dependencies: %v", m.Unresolved)
			}
		})
	}
}

// TestResolveModuleListAlpine resolves an Alpine-style tree: gzip-compressed
// modules, an optional module the kernel lacks, a required one it lacks.
func TestResolveModuleListAlpine(t *testing.T) {
	t.Parallel()
	mods := []fakeModule{
		{path: "kernel/drivers/virtio/virtio_ring.ko.gz", info: []string{"depends="}},
		{path: "kernel/drivers/virtio/virtio_pci.ko.gz", info: []string{"depends=virtio_ring"}},
		{path: "kernel/fs/ext4/ext4.ko.gz", info: []string{"depends=", "softdep=pre: crypto-crc32c"}},
		{path: "kernel/crypto/crc32c_generic.ko.gz", info: []string{"alias=crypto-crc32c", "depends="}},
		{path: "kernel/fs/fuse/fuse.ko.gz", info: []string{"depends="}},
		{path: "kernel/fs/fuse/virtiofs.ko.gz", info: []string{"depends=fuse,virtio_ring"}},
		{path: "kernel/drivers/input/evdev.ko.gz", info: []string{"depends="}},
	}
	dir := fakeTree(t, mods, nil, nil)
	got, err := ResolveModuleList(dir, vm.ArchAMD64, ModuleList{
		Required: []string{"virtio_pci", "ext4", "virtiofs"},
		Optional: []string{"gpio_keys", "evdev", "9p"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/virtio/virtio_ring.ko.gz", "kernel/drivers/virtio/virtio_pci.ko.gz",
		"kernel/crypto/crc32c_generic.ko.gz", "kernel/fs/ext4/ext4.ko.gz",
		"kernel/fs/fuse/fuse.ko.gz", "kernel/fs/fuse/virtiofs.ko.gz", "kernel/drivers/input/evdev.ko.gz",
	}
	if !slices.Equal(got.Order, want) {
		t.Errorf("order:\n got %v\nwant %v", got.Order, want)
	}
	if !slices.Equal(got.Missing, []string{"gpio_keys", "9p"}) {
		t.Errorf("missing optional modules: got %v, want [gpio_keys 9p]", got.Missing)
	}
	// The packed name drops .gz and the content is the module itself.
	if n := PackedName(got.Order[0]); n != "kernel/drivers/virtio/virtio_ring.ko" {
		t.Errorf("PackedName: %q", n)
	}
	data, err := ReadModule(filepath.Join(dir, got.Order[0]))
	if err != nil || !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		t.Errorf("ReadModule of a .ko.gz: %v, ELF magic %v", err, bytes.HasPrefix(data, []byte(elf.ELFMAG)))
	}

	t.Run("a required module the kernel lacks is named", func(t *testing.T) {
		_, err := ResolveModuleList(dir, vm.ArchAMD64, ModuleList{Required: []string{"ext4", "overlay"}})
		if !errors.Is(err, ErrUnknownModule) || !strings.Contains(err.Error(), `"overlay"`) {
			t.Errorf("got %v, want ErrUnknownModule naming overlay", err)
		}
	})
	t.Run("a corrupt .ko.gz is an error naming it", func(t *testing.T) {
		bad := fakeTree(t, []fakeModule{{path: "kernel/fs/overlay.ko.gz"}}, nil, nil)
		if err := os.WriteFile(filepath.Join(bad, "kernel/fs/overlay.ko.gz"), []byte("\x1f\x8bnot gzip"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ResolveModuleList(bad, vm.ArchAMD64, ModuleList{Required: []string{"overlay"}}); err == nil || !strings.Contains(err.Error(), "overlay.ko.gz") {
			t.Errorf("got %v, want an error naming overlay.ko.gz", err)
		}
	})
	t.Run("the guest's own lists", func(t *testing.T) {
		if len(DefaultModules) != len(GuestModules.Required)+len(GuestModules.Optional) {
			t.Errorf("DefaultModules is not GuestModules in one list")
		}
		for _, m := range []string{"virtiofs", "overlay", "ext4", "virtio_blk"} {
			if !slices.Contains(GuestModules.Required, m) {
				t.Errorf("%s is not required", m)
			}
		}
	})
}

// TestModulesOrderNamesUncompressed: kbuild's modules.order names .ko
// files even when the modules are installed compressed (Alpine's .ko.gz);
// the order entry finds the compressed file, and a name as written wins.
func TestModulesOrderNamesUncompressed(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"kernel/fs/overlayfs/overlay.ko.gz": {Data: []byte("x")},
		"kernel/fs/ext4/ext4.ko":            {Data: []byte("x")},
		"kernel/fs/ext4/ext4.ko.gz":         {Data: []byte("x")},
	}
	for rel, want := range map[string]string{
		"kernel/fs/overlayfs/overlay.ko": "kernel/fs/overlayfs/overlay.ko.gz",
		"kernel/fs/ext4/ext4.ko":         "kernel/fs/ext4/ext4.ko",
		"kernel/fs/fuse/fuse.ko":         "kernel/fs/fuse/fuse.ko",
		"modules.builtin":                "modules.builtin",
	} {
		if got := installedName(fsys, rel); got != want {
			t.Errorf("installedName(%s) = %s, want %s", rel, got, want)
		}
	}
}

// A kernel with every driver built in (vibedom's guest kernel: an empty
// modules.order) resolves to nothing to pack; a required name it has
// neither built in nor as a module is still refused, naming it, and a tree
// with neither modules nor built-ins is no kernel package.
func TestResolveAllBuiltin(t *testing.T) {
	builtin := []string{
		"kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/block/virtio_blk.ko",
		"kernel/drivers/net/virtio_net.ko", "kernel/drivers/char/virtio_console.ko",
		"kernel/fs/fuse/virtiofs.ko", "kernel/fs/overlayfs/overlay.ko", "kernel/fs/ext4/ext4.ko",
		"kernel/drivers/input/evdev.ko",
	}
	tree := func(lines []string) fstest.MapFS {
		return fstest.MapFS{
			"modules.order":   {Data: nil},
			"modules.builtin": {Data: []byte(strings.Join(lines, "\n") + "\n")},
		}
	}
	m, err := ResolveModuleListFS(tree(builtin), "6.1.192-vibedom", vm.ArchAMD64, GuestModules)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Order) != 0 {
		t.Errorf("packs %v, want nothing", m.Order)
	}
	if !slices.Contains(m.Builtin, "ext4") || !slices.Contains(m.Missing, "gpio_keys") {
		t.Errorf("builtin %v, missing %v", m.Builtin, m.Missing)
	}
	_, err = ResolveModuleListFS(tree(builtin[1:]), "6.1.192-vibedom", vm.ArchAMD64, GuestModules)
	if err == nil || !strings.Contains(err.Error(), "virtio_pci") {
		t.Errorf("a required driver missing: err %v", err)
	}
	_, err = ResolveModuleListFS(tree(nil), "6.1.192-vibedom", vm.ArchAMD64, GuestModules)
	if err == nil || !strings.Contains(err.Error(), "no modules") {
		t.Errorf("neither modules nor built-ins: err %v", err)
	}
}
