package kernel

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vibedom/vibedom/vm"
)

// ModuleList names the kernel modules a guest image needs. Required ones
// must be a module or built into the kernel: a kernel without one is
// refused, naming it. Optional ones are packed when the kernel has them and
// listed in Modules.Missing when it has not (Alpine's linux-virt has no
// gpio_keys, for one). Names built into the kernel are skipped either way,
// so one list serves every arch.
type ModuleList struct {
	Required []string
	Optional []string
}

// GuestModules are the modules of vibedom's guest: virtio transports and
// devices, the workspace share (virtiofs; 9p, QEMU's fallback), OverlayFS,
// ext4 for the scratch disk, vsock for vz's control channel, the power
// button with the event device the guest agent watches it through, and the
// memory balloon through which an idle guest hands freed pages back to the
// host (free page reporting; the driver does it on its own once loaded).
var GuestModules = ModuleList{
	Required: []string{
		"virtio_pci", "virtio_blk", "virtio_net", "virtio_console",
		"virtiofs", "overlay", "ext4",
	},
	Optional: []string{
		"virtio_mmio", "9p", "9pnet_virtio",
		"vsock", "vmw_vsock_virtio_transport", "af_packet",
		"button", "gpio_keys", "evdev",
		"virtio_balloon",
	},
}

// DefaultModules is GuestModules as one list, every name required: what
// the Debian test kernels, which have them all, are held to.
var DefaultModules = append(slices.Clone(GuestModules.Required), GuestModules.Optional...)

// Module resolution errors.
var (
	// ErrUnknownModule means a requested module is neither a loadable
	// module nor built into the kernel.
	ErrUnknownModule = errors.New("no such kernel module")
	// ErrCompressedModule means a needed module is compressed in a form
	// vibedom does not unpack (.ko.xz, .ko.zst). Modules compressed with gzip
	// (.ko.gz, Alpine's) are unpacked into the initramfs.
	ErrCompressedModule = errors.New("compressed kernel module")
	// ErrModuleMismatch means a module was built for another kernel
	// release or CPU architecture than the one being packed.
	ErrModuleMismatch = errors.New("kernel module does not match the kernel")
)

// Modules is the resolved set of kernel modules for one kernel.
type Modules struct {
	// Release is the kernel release ("6.1.0-56-amd64").
	Release string
	// Dir is the host directory lib/modules/<Release>, or "" when the
	// modules were read from FS only (a package held in memory).
	Dir string
	// FS holds lib/modules/<Release> (os.DirFS(Dir) for a host directory);
	// Order's paths are relative to it.
	FS fs.FS
	// Order lists module files relative to FS, every module after the
	// modules it depends on: the content of proto.ModuleListPath.
	Order []string
	// Needs maps a file of Order to the files of Order it needs loaded
	// first (its depends= and pre: soft dependencies; a post: soft
	// dependency needs the module that names it), so the guest can load a
	// subset, and independent modules side by side.
	Needs map[string][]string
	// Builtin lists requested or depended-on names that are built into the
	// kernel and so need no file.
	Builtin []string
	// Unresolved lists soft dependencies that matched no module and no
	// built-in (soft dependencies are optional by nature).
	Unresolved []string
	// Missing lists optional modules the kernel has neither as a module
	// nor built in.
	Missing []string
}

// PackedName is the name a module file gets in the initramfs: rel with a
// ".gz" compression suffix removed (such modules are unpacked, since the
// guest loads modules with a plain finit_module).
func PackedName(rel string) string { return strings.TrimSuffix(rel, ".gz") }

// Machine returns the ELF machine of a guest architecture, and whether
// vibedom knows the architecture at all.
func Machine(arch vm.Arch) (elf.Machine, bool) {
	m, ok := elfMachine[arch]
	return m, ok
}

// maxModuleSize bounds an unpacked module.
const maxModuleSize = 64 << 20

// ReadModule returns the content of the module file at path, unpacking a
// .ko.gz.
func ReadModule(path string) ([]byte, error) {
	return readModuleFS(os.DirFS(filepath.Dir(path)), filepath.Base(path))
}

// ReadModuleFS is ReadModule for the module at rel in fsys.
func ReadModuleFS(fsys fs.FS, rel string) ([]byte, error) { return readModuleFS(fsys, rel) }

func readModuleFS(fsys fs.FS, path string) ([]byte, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".ko.gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("unpack module %s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	data, err := io.ReadAll(io.LimitReader(r, maxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	if len(data) > maxModuleSize {
		return nil, fmt.Errorf("read module %s: larger than %d MiB unpacked", path, maxModuleSize>>20)
	}
	return data, nil
}

// moduleName turns a file name or a name as written in depends= into the
// canonical module name: no directory, no .ko suffix, '-' as '_'.
func moduleName(s string) string {
	s = filepath.Base(s)
	for _, suf := range []string{".ko.xz", ".ko.zst", ".ko.gz", ".ko"} {
		if strings.HasSuffix(s, suf) {
			s = strings.TrimSuffix(s, suf)
			break
		}
	}
	return strings.ReplaceAll(s, "-", "_")
}

// modinfo is what the resolver reads from a module's .modinfo section.
type modinfo struct {
	depends  []string
	pre      []string // softdep pre:
	post     []string // softdep post:
	aliases  []string
	vermagic string
	machine  elf.Machine
}

// readModinfo reads the .modinfo section of the module file at path. An
// uncompressed module is read in place (the ELF headers and .modinfo, a few
// KiB, not the whole file); a .ko.gz is unpacked, or its metadata taken
// from gzModinfo when the same bytes were read before.
func readModinfo(fsys fs.FS, path string) (*modinfo, error) {
	if compressed(path) && !strings.HasSuffix(path, ".ko.gz") {
		return nil, fmt.Errorf("%w: %s: vibedom unpacks .ko.gz modules only; unpack the others first", ErrCompressedModule, path)
	}
	if strings.HasSuffix(path, ".ko.gz") {
		return readModinfoGz(fsys, path)
	}
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ra, ok := f.(io.ReaderAt)
	if !ok {
		raw, err := readModuleFS(fsys, path)
		if err != nil {
			return nil, err
		}
		return parseModinfo(bytes.NewReader(raw), path)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	if fi.Size() > maxModuleSize {
		return nil, fmt.Errorf("read module %s: larger than %d MiB unpacked", path, maxModuleSize>>20)
	}
	return parseModinfo(io.NewSectionReader(ra, 0, fi.Size()), path)
}

// gzModinfo memoizes the metadata of .ko.gz modules by the SHA-256 of
// their compressed bytes, for the life of the process: hashing a module is
// some twenty times cheaper than unpacking it, and every image build of
// one kernel package reads the same modules again (byAlias reads them
// all). The key is computed here from the bytes being read, so an entry
// can only ever describe exactly those bytes; nothing is kept on disk.
var gzModinfo struct {
	sync.Mutex
	m map[[sha256.Size]byte]*modinfo
}

// maxGzModinfo bounds gzModinfo: a few kernels' worth of modules.
const maxGzModinfo = 4 * 8192

func readModinfoGz(fsys fs.FS, path string) (*modinfo, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	packed, err := io.ReadAll(io.LimitReader(f, maxModuleSize+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	if len(packed) > maxModuleSize {
		return nil, fmt.Errorf("read module %s: larger than %d MiB", path, maxModuleSize>>20)
	}
	key := sha256.Sum256(packed)
	gzModinfo.Lock()
	mi, ok := gzModinfo.m[key]
	gzModinfo.Unlock()
	if ok {
		return mi.clone(), nil
	}
	gz, err := gzip.NewReader(bytes.NewReader(packed))
	if err != nil {
		return nil, fmt.Errorf("unpack module %s: %w", path, err)
	}
	raw, err := io.ReadAll(io.LimitReader(gz, maxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	if len(raw) > maxModuleSize {
		return nil, fmt.Errorf("read module %s: larger than %d MiB unpacked", path, maxModuleSize>>20)
	}
	mi, err = parseModinfo(bytes.NewReader(raw), path)
	if err != nil {
		return nil, err
	}
	gzModinfo.Lock()
	if gzModinfo.m == nil || len(gzModinfo.m) >= maxGzModinfo {
		gzModinfo.m = map[[sha256.Size]byte]*modinfo{}
	}
	gzModinfo.m[key] = mi.clone()
	gzModinfo.Unlock()
	return mi, nil
}

// clone copies mi, so that a caller cannot change a memoized entry.
func (mi *modinfo) clone() *modinfo {
	c := *mi
	c.depends = slices.Clone(mi.depends)
	c.pre = slices.Clone(mi.pre)
	c.post = slices.Clone(mi.post)
	c.aliases = slices.Clone(mi.aliases)
	return &c
}

// parseModinfo reads the .modinfo section of the module ELF image r.
func parseModinfo(r io.ReaderAt, path string) (*modinfo, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("read module %s: no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("read module %s: .modinfo: %w", path, err)
	}
	mi := &modinfo{machine: f.Machine}
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.depends = append(mi.depends, moduleName(d))
				}
			}
		case "softdep":
			pre, post := parseSoftdep(v)
			mi.pre = append(mi.pre, pre...)
			mi.post = append(mi.post, post...)
		case "alias":
			mi.aliases = append(mi.aliases, v)
		case "vermagic":
			mi.vermagic = v
		}
	}
	return mi, nil
}

// parseSoftdep parses "pre: a b post: c".
func parseSoftdep(v string) (pre, post []string) {
	var cur *[]string
	for _, tok := range strings.Fields(v) {
		switch tok {
		case "pre:":
			cur = &pre
		case "post:":
			cur = &post
		default:
			if cur != nil {
				*cur = append(*cur, tok)
			}
		}
	}
	return pre, post
}

func compressed(path string) bool {
	return strings.HasSuffix(path, ".ko.xz") || strings.HasSuffix(path, ".ko.zst") || strings.HasSuffix(path, ".ko.gz")
}

// elfMachine is the ELF machine of each guest architecture (see Machine).
var elfMachine = map[vm.Arch]elf.Machine{
	vm.ArchAMD64: elf.EM_X86_64,
	vm.ArchARM64: elf.EM_AARCH64,
}

// moduleTree indexes the modules of one kernel.
type moduleTree struct {
	fsys    fs.FS
	dir     string // host directory, "" for an in-memory tree
	release string
	arch    vm.Arch
	files   map[string]string // module name -> path relative to dir
	builtin map[string]bool   // built-in module names
	// builtinAlias maps aliases of built-in modules (from
	// modules.builtin.modinfo) to true.
	builtinAlias map[string]bool
	info         map[string]*modinfo
	aliases      map[string][]string // alias -> module names, built lazily
}

// openModuleTree indexes lib/modules/<release> under dir. The module list
// comes from modules.order (falling back to walking kernel/), built-ins from
// modules.builtin and modules.builtin.modinfo.
func openModuleTree(dir, release string, arch vm.Arch) (*moduleTree, error) {
	t, err := openModuleFS(os.DirFS(dir), release, arch)
	if err != nil {
		return nil, err
	}
	t.dir = dir
	return t, nil
}

// openModuleFS indexes the modules of fsys, which holds lib/modules/<release>.
func openModuleFS(fsys fs.FS, release string, arch vm.Arch) (*moduleTree, error) {
	dir := "lib/modules/" + release
	t := &moduleTree{
		fsys: fsys, release: release, arch: arch,
		files: map[string]string{}, builtin: map[string]bool{}, builtinAlias: map[string]bool{},
		info: map[string]*modinfo{},
	}
	order, err := readLines(fsys, "modules.order")
	switch {
	case err == nil:
		for _, rel := range order {
			t.files[moduleName(rel)] = installedName(fsys, filepath.ToSlash(rel))
		}
	case errors.Is(err, fs.ErrNotExist):
		err := fs.WalkDir(fsys, "kernel", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".ko") || compressed(p)) {
				t.files[moduleName(p)] = p
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list kernel modules in %s: %w", dir, err)
		}
	default:
		return nil, fmt.Errorf("list kernel modules: %w", err)
	}
	builtin, err := readLines(fsys, "modules.builtin")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list built-in kernel modules: %w", err)
	}
	for _, rel := range builtin {
		t.builtin[moduleName(rel)] = true
	}
	if data, err := fs.ReadFile(fsys, "modules.builtin.modinfo"); err == nil {
		// Records are "module.key=value", NUL-separated.
		for _, rec := range bytes.Split(data, []byte{0}) {
			k, v, ok := strings.Cut(string(rec), "=")
			if !ok {
				continue
			}
			if mod, key, ok := strings.Cut(k, "."); ok && key == "alias" {
				t.builtinAlias[v] = true
				t.builtin[moduleName(mod)] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read built-in module info: %w", err)
	}
	// A kernel with every driver built in (vibedom's guest kernel) has no
	// module files; one with neither modules nor built-ins is no kernel
	// package.
	if len(t.files) == 0 && len(t.builtin) == 0 {
		return nil, fmt.Errorf("list kernel modules: no modules in %s", dir)
	}
	return t, nil
}

// installedName is the file of a module modules.order names. kbuild
// writes the order with .ko names whatever the modules' compression, so
// a kernel built with CONFIG_MODULE_COMPRESS_GZIP (Alpine's linux-virt)
// lists kernel/fs/overlayfs/overlay.ko for overlay.ko.gz. The name as
// written wins when that file exists.
func installedName(fsys fs.FS, rel string) string {
	if !strings.HasSuffix(rel, ".ko") {
		return rel
	}
	if _, err := fs.Stat(fsys, rel); err == nil {
		return rel
	}
	for _, ext := range []string{".gz", ".xz", ".zst"} {
		if _, err := fs.Stat(fsys, rel+ext); err == nil {
			return rel + ext
		}
	}
	return rel
}

func readLines(fsys fs.FS, path string) ([]string, error) {
	f, err := fsys.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// modinfo returns (and checks) the metadata of module name.
func (t *moduleTree) modinfo(name string) (*modinfo, error) {
	if mi, ok := t.info[name]; ok {
		return mi, nil
	}
	rel := t.files[name]
	mi, err := readModinfo(t.fsys, rel)
	if err != nil {
		return nil, err
	}
	if want, ok := elfMachine[t.arch]; ok && mi.machine != want {
		return nil, fmt.Errorf("%w: %s is built for %v, not %s", ErrModuleMismatch, rel, mi.machine, t.arch)
	}
	if v, _, _ := strings.Cut(mi.vermagic, " "); v != t.release {
		return nil, fmt.Errorf("%w: %s is built for kernel %q, not %q", ErrModuleMismatch, rel, v, t.release)
	}
	t.info[name] = mi
	return mi, nil
}

// byAlias returns the modules that declare alias a. The first call reads
// every module's metadata once: the .modinfo of an uncompressed module in
// place, a .ko.gz unpacked or, when its bytes were read before in this
// process, from gzModinfo. It is only needed for soft dependencies that
// name an alias, on a cache miss. The modules are read by one worker per
// CPU (unpacking is most of a cold build's module work); the index, and
// the error when one fails, are what reading them in name order gives.
func (t *moduleTree) byAlias(a string) ([]string, error) {
	if t.aliases == nil {
		names := make([]string, 0, len(t.files))
		for n, rel := range t.files {
			if compressed(rel) && !strings.HasSuffix(rel, ".ko.gz") {
				continue
			}
			names = append(names, n)
		}
		slices.Sort(names)
		infos := make([]*modinfo, len(names))
		errs := make([]error, len(names))
		var next atomic.Int64
		var failed atomic.Bool
		var wg sync.WaitGroup
		for range min(runtime.GOMAXPROCS(0), len(names)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Indexes are handed out in order, so when one fails every
				// lower one has been taken: stopping there still finds the
				// first failure in name order.
				for !failed.Load() {
					i := int(next.Add(1) - 1)
					if i >= len(names) {
						return
					}
					if infos[i], errs[i] = readModinfo(t.fsys, t.files[names[i]]); errs[i] != nil {
						failed.Store(true)
					}
				}
			}()
		}
		wg.Wait()
		aliases := map[string][]string{}
		for i, n := range names {
			if errs[i] != nil {
				return nil, errs[i]
			}
			if infos[i] == nil {
				break // not read: a later module than the failure
			}
			for _, al := range infos[i].aliases {
				aliases[al] = append(aliases[al], n)
			}
		}
		t.aliases = aliases
	}
	return t.aliases[a], nil
}

// resolve orders want and everything it needs, dependencies first.
// A name in optional that the kernel lacks is listed in Missing.
func (t *moduleTree) resolve(want, optional []string) (*Modules, error) {
	m := &Modules{Release: t.release, Dir: t.dir, FS: t.fsys, Needs: map[string][]string{}}
	// need records that the module file rel needs the module name loaded
	// first (nothing when name is built in).
	need := func(rel, name string) {
		if dep, ok := t.files[name]; ok && dep != rel && !slices.Contains(m.Needs[rel], dep) {
			m.Needs[rel] = append(m.Needs[rel], dep)
		}
	}
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	builtinSeen := map[string]bool{}
	unresolvedSeen := map[string]bool{}

	var visit func(name string, chain []string) error
	// softdep resolves a soft dependency by module name, then by alias,
	// and returns the modules it named.
	softdep := func(target string, chain []string) ([]string, error) {
		n := moduleName(target)
		if _, ok := t.files[n]; ok {
			return []string{n}, visit(n, chain)
		}
		if t.builtin[n] || t.builtinAlias[target] {
			return nil, nil
		}
		mods, err := t.byAlias(target)
		if err != nil {
			return nil, err
		}
		if len(mods) == 0 {
			if !unresolvedSeen[target] {
				unresolvedSeen[target] = true
				m.Unresolved = append(m.Unresolved, target)
			}
			return nil, nil
		}
		for _, mod := range mods {
			if err := visit(mod, chain); err != nil {
				return nil, err
			}
		}
		return mods, nil
	}
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			// A soft dependency loop (hard ones cannot exist: the kernel
			// refuses to load them) is broken where it closes.
			return nil
		}
		rel, ok := t.files[name]
		if !ok {
			if t.builtin[name] {
				if !builtinSeen[name] {
					builtinSeen[name] = true
					m.Builtin = append(m.Builtin, name)
				}
				state[name] = done
				return nil
			}
			via := "requested"
			if len(chain) > 0 {
				via = "needed by " + strings.Join(chain, " -> ")
			}
			return fmt.Errorf("%w: %q (%s) is neither a module nor built into kernel %s",
				ErrUnknownModule, name, via, t.release)
		}
		state[name] = visiting
		chain = append(slices.Clip(chain), name)
		mi, err := t.modinfo(name)
		if err != nil {
			return err
		}
		for _, d := range mi.depends {
			if err := visit(d, chain); err != nil {
				return err
			}
			need(rel, d)
		}
		for _, s := range mi.pre {
			mods, err := softdep(s, chain)
			if err != nil {
				return err
			}
			for _, d := range mods {
				need(rel, d)
			}
		}
		state[name] = done
		m.Order = append(m.Order, rel)
		for _, s := range mi.post {
			mods, err := softdep(s, chain)
			if err != nil {
				return err
			}
			for _, d := range mods {
				if dep, ok := t.files[d]; ok {
					need(dep, name)
				}
			}
		}
		return nil
	}
	for _, w := range want {
		if err := visit(moduleName(w), nil); err != nil {
			return nil, fmt.Errorf("resolve kernel modules: %w", err)
		}
	}
	for _, o := range optional {
		n := moduleName(o)
		if _, ok := t.files[n]; !ok && !t.builtin[n] {
			m.Missing = append(m.Missing, n)
			continue
		}
		if err := visit(n, nil); err != nil {
			return nil, fmt.Errorf("resolve kernel modules: %w", err)
		}
	}
	return m, nil
}

// ResolveModules resolves the modules named in want (file-style names with
// '-' are accepted) for the kernel whose modules are in dir
// (lib/modules/<release>), for a guest of the given arch. Dependencies come
// from each module's depends= and softdep= metadata; soft dependencies may
// name an alias, as ext4's "pre: crypto-crc32c" does, and then every module
// declaring that alias is included (the crypto API picks the fastest one
// that loads). Built-in names are skipped.
func ResolveModules(dir string, arch vm.Arch, want []string) (*Modules, error) {
	release := filepath.Base(dir)
	t, err := openModuleTree(dir, release, arch)
	if err != nil {
		return nil, err
	}
	return t.resolve(want, nil)
}

// ResolveModuleList resolves a required and optional module list the way
// ResolveModules resolves one list: a required module the kernel lacks is an
// error naming it and the chain that needs it; an optional one is listed in
// Modules.Missing.
func ResolveModuleList(dir string, arch vm.Arch, l ModuleList) (*Modules, error) {
	release := filepath.Base(dir)
	t, err := openModuleTree(dir, release, arch)
	if err != nil {
		return nil, err
	}
	return t.resolve(l.Required, l.Optional)
}

// ResolveModuleListFS is ResolveModuleList for modules held in fsys (the
// content of lib/modules/<release>), such as a kernel package read into
// memory: on a case-insensitive host file system (macOS) modules whose
// names differ only in case (xt_DSCP and xt_dscp) cannot be unpacked side
// by side. fsys is read from several goroutines at once (os.DirFS and
// fstest.MapFS allow it).
func ResolveModuleListFS(fsys fs.FS, release string, arch vm.Arch, l ModuleList) (*Modules, error) {
	t, err := openModuleFS(fsys, release, arch)
	if err != nil {
		return nil, err
	}
	return t.resolve(l.Required, l.Optional)
}
