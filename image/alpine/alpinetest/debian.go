package alpinetest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/vibedom/vibedom/image/alpine"
)

// StandInDescription is the description (.PKGINFO pkgdesc, index T:) of
// every empty stand-in package of a Debian-sourced repository.
const StandInDescription = "vibedom test mirror: empty stand-in"

// debianRepoVersion changes whenever BuildDebianRepo's packages change for
// the same inputs, so old cache entries are not reused.
const debianRepoVersion = "debian-repo/2"

// DebianOptions says what BuildDebianRepo builds from and where.
type DebianOptions struct {
	// Arch is the Alpine arch: "x86_64" or "aarch64".
	Arch string
	// Assets is the directory scripts/fetch-assets.sh fills for that
	// arch (.cache/assets/amd64 or .cache/assets/arm64): kernel/,
	// busybox, .complete, debs/. FindAssets finds it.
	Assets string
	// Root is the mirror's root directory (created; may be shared by
	// both arches).
	Root string
	// Key signs every package and index. A key made by the test run.
	Key *Key
	// CacheDir keeps the unsigned packages between runs, keyed by the
	// SHA-256 of every input file; "" builds everything anew.
	CacheDir string
	// Branch is the mirror's branch; "" is alpine.Branch.
	Branch string
	// World is the package names the repository must answer, each by a
	// repacked Debian package or an empty stand-in; nil is
	// alpine.World(nil) (DefaultWorld and BootWorld).
	World []string
	// Node, when set, makes nodejs a real package instead of a stand-in:
	// the official Node.js build (NodePin) with libstdc++ and libgcc from
	// Debian, each checked against its pin. Its cache entries live in
	// CacheDir/node, keyed by the pins too, so the plain repository's
	// entries are neither reused nor evicted.
	Node *NodeFiles
}

// DebianRepo is a built, signed, Debian-sourced Alpine repository.
type DebianRepo struct {
	*Mirror
	Arch string
	// Packages are the index records, "main" and "community" both
	// (Repo says which), sorted by name.
	Packages []*alpine.Package
	// StandIns are the names of the empty stand-ins, sorted. Everything
	// else in Packages holds real files.
	StandIns []string
	// Dropped lists what was left out of repacked packages, as
	// "<package>: <path>": programs needing a library the test userland
	// does not carry (git's HTTP helpers), and what links to them.
	Dropped []string
	// KernelRelease is linux-virt's module directory name
	// (usr/lib/modules/<KernelRelease>), Debian's release.
	KernelRelease string
	// Cached says the unsigned packages came from CacheDir.
	Cached bool
}

// Clone returns a copy of r rooted at root that a test may change (add a
// package, write new indexes) without changing r: see Mirror.Clone. Many
// tests can then share one built and signed repository and copy it only
// where they change it.
func (r *DebianRepo) Clone(root string) (*DebianRepo, error) {
	m, err := r.Mirror.Clone(root)
	if err != nil {
		return nil, err
	}
	seen := map[*alpine.Package]*alpine.Package{}
	m.pkgs = r.Mirror.records(seen)
	c := *r
	c.Mirror = m
	c.Packages = make([]*alpine.Package, len(r.Packages))
	for i, p := range r.Packages {
		if c.Packages[i] = seen[p]; c.Packages[i] == nil {
			q := *p
			c.Packages[i] = &q
		}
	}
	c.StandIns = append([]string(nil), r.StandIns...)
	c.Dropped = append([]string(nil), r.Dropped...)
	return &c, nil
}

// StandInNames returns the names of world (nil: alpine.World(nil)) that a
// Debian-sourced repository answers with an empty stand-in.
func StandInNames(world []string) []string {
	if world == nil {
		world = alpine.World(nil)
	}
	var out []string
	for _, n := range world {
		n, _, _ = strings.Cut(n, ">") // "git>=2" names git
		n, _, _ = strings.Cut(n, "<")
		n, _, _ = strings.Cut(n, "=")
		n, _, _ = strings.Cut(n, "~")
		if !realPackages[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// realPackages are the names a Debian-sourced repository fills with real
// files (the Debian-derived ones come from debs/test-userland.txt on top).
var realPackages = map[string]bool{
	"linux-virt": true, "busybox": true, "busybox-static": true, "alpine-baselayout": true,
	"alpine-release": true, "ca-certificates-bundle": true,
	// From scripts/test-userland.txt:
	"musl": true, "ncurses-libs": true, "bash": true, "zlib": true, "pcre2": true, "git": true,
}

// communityPackages go to the community repository, as in Alpine.
var communityPackages = map[string]bool{"npm": true, "ripgrep": true}

// DebianArch maps an Alpine arch to Debian's (the assets' directory name).
func DebianArch(alpineArch string) (string, error) {
	switch alpineArch {
	case "x86_64":
		return "amd64", nil
	case "aarch64":
		return "arm64", nil
	}
	return "", fmt.Errorf("alpinetest: arch %q: want x86_64 or aarch64", alpineArch)
}

// FindAssets returns the fetched assets directory for an Alpine arch:
// $VIBEDOM_ASSETS/<debian arch>, else .cache/assets/<debian arch> in the
// current directory or a parent, holding debs/.complete. The error says
// what is missing and which command fetches it.
func FindAssets(alpineArch string) (string, error) {
	da, err := DebianArch(alpineArch)
	if err != nil {
		return "", err
	}
	ok := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, "debs", ".complete"))
		return err == nil
	}
	if env := os.Getenv("VIBEDOM_ASSETS"); env != "" {
		d := filepath.Join(env, da)
		if ok(d) {
			return d, nil
		}
		return "", fmt.Errorf("%s has no debs/.complete: run scripts/fetch-assets.sh %s", d, env)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		d := filepath.Join(dir, ".cache", "assets", da)
		if ok(d) {
			return d, nil
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	return "", fmt.Errorf("no .cache/assets/%s/debs/.complete above %s: run `make assets` (scripts/fetch-assets.sh)", da, wd)
}

// BuildDebianRepo builds an Alpine-shaped repository for o.Arch from what
// scripts/fetch-assets.sh fetched, signs it with o.Key and writes it under
// o.Root (main and community). The packages:
//
//   - linux-virt: Debian's kernel in linux-virt's layout, boot/vmlinuz-virt
//     (on aarch64 wrapped as an EFI zboot image with a gzip payload, as
//     Alpine's is) and usr/lib/modules/<release>/ with every module as
//     .ko.gz, modules.order (kbuild's, naming .ko), modules.builtin,
//     modules.builtin.modinfo;
//   - busybox (bin/busybox, etc/busybox-paths.d/busybox), busybox-static
//     (bin/busybox.static): Debian's static busybox;
//   - alpine-baselayout, alpine-release, ca-certificates-bundle;
//   - every package of debs/test-userland.txt (musl is Debian's glibc),
//     Debian paths kept, D: so:… from each program's DT_NEEDED, p: so:…
//     from each library's SONAME and cmd:… for each program;
//   - an empty stand-in, described StandInDescription, for every other
//     name of o.World.
func BuildDebianRepo(o DebianOptions) (*DebianRepo, error) {
	da, err := DebianArch(o.Arch)
	if err != nil {
		return nil, err
	}
	if o.Key == nil || o.Root == "" || o.Assets == "" {
		return nil, errors.New("alpinetest: DebianOptions needs Key, Root and Assets")
	}
	world := o.World
	if world == nil {
		world = alpine.World(nil)
	}
	extraKey, cacheDir := "", o.CacheDir
	if o.Node != nil {
		var err error
		if extraKey, err = nodeKey(o.Arch); err != nil {
			return nil, err
		}
		if cacheDir != "" {
			cacheDir = filepath.Join(cacheDir, "node")
		}
	}
	key, err := inputsKey(o.Assets, o.Arch, world, extraKey)
	if err != nil {
		return nil, err
	}
	var set *builtSet
	cached := false
	if cacheDir != "" {
		set, err = loadSet(filepath.Join(cacheDir, o.Arch+"-"+key))
		cached = err == nil
	}
	if set == nil {
		b := &repoBuilder{arch: o.Arch, debArch: da, assets: o.Assets, world: world}
		if o.Node != nil {
			node, debs, err := nodeInputs(o.Arch, o.Node)
			if err != nil {
				return nil, err
			}
			b.extra, b.extraDebs = nodeEntries(da, node, debs)
		}
		if set, err = b.build(); err != nil {
			return nil, err
		}
		if cacheDir != "" {
			if err := saveSet(cacheDir, o.Arch, key, set); err != nil {
				return nil, err
			}
		}
	}
	m, err := NewMirror(o.Root)
	if err != nil {
		return nil, err
	}
	m.Branch = o.Branch
	r := &DebianRepo{Mirror: m, Arch: o.Arch, StandIns: set.StandIns, Dropped: set.Dropped, KernelRelease: set.KernelRelease, Cached: cached}
	for _, bp := range set.Packages {
		apk, p, err := bp.u.sign(o.Key)
		if err != nil {
			return nil, err
		}
		p.Repo = bp.Repo
		if err := m.Add(bp.Repo, o.Arch, apk, p); err != nil {
			return nil, err
		}
		r.Packages = append(r.Packages, p)
	}
	sort.Slice(r.Packages, func(i, j int) bool { return r.Packages[i].Name < r.Packages[j].Name })
	if err := m.WriteIndexes(o.Arch, o.Key, "vibedom test mirror (Debian-sourced) "+o.Arch); err != nil {
		return nil, err
	}
	return r, nil
}

// builtSet is what the cache keeps: unsigned packages and the report.
type builtSet struct {
	Packages      []*builtPackage
	StandIns      []string
	Dropped       []string
	KernelRelease string
}

type builtPackage struct {
	Repo   string
	Record alpine.Package
	// ControlLen is the length of the control member at the start of
	// the cached body.
	ControlLen int
	u          *unsigned
}

// inputsKey is the SHA-256 of the builder's version, the arch, the world,
// extra (when not empty) and every file under assets (names, modes,
// contents). It is computed once per set of arguments for the life of the
// process: the assets hold the kernel packages (hundreds of MB), they do
// not change while tests run, and every test that builds a mirror would
// otherwise hash all of them again.
func inputsKey(assets, arch string, world []string, extra string) (string, error) {
	v, _ := inputsKeys.LoadOrStore(strings.Join([]string{assets, arch, strings.Join(world, ","), extra}, "\x00"), &inputsKeyOnce{})
	k := v.(*inputsKeyOnce)
	k.once.Do(func() { k.key, k.err = hashInputs(assets, arch, world, extra) })
	return k.key, k.err
}

var inputsKeys sync.Map // assets, arch, world, extra -> *inputsKeyOnce

type inputsKeyOnce struct {
	once sync.Once
	key  string
	err  error
}

func hashInputs(assets, arch string, world []string, extra string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", debianRepoVersion, arch, strings.Join(world, ","))
	if extra != "" {
		fmt.Fprintf(h, "extra\x00%s\x00", extra)
	}
	err := filepath.WalkDir(assets, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(assets, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%o\x00", filepath.ToSlash(rel), fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			io.WriteString(h, t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read the assets: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

func loadSet(dir string) (*builtSet, error) {
	b, err := os.ReadFile(filepath.Join(dir, "set.json"))
	if err != nil {
		return nil, err
	}
	var s builtSet
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	for i, p := range s.Packages {
		body, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%03d.body", i)))
		if err != nil {
			return nil, err
		}
		if p.ControlLen <= 0 || p.ControlLen >= len(body) {
			return nil, fmt.Errorf("cached %s: control member length %d", p.Record.Name, p.ControlLen)
		}
		// The body is not verified here: package alpine verifies every
		// package it is served, against the index this run signs.
		p.u = &unsigned{Control: body[:p.ControlLen], Data: body[p.ControlLen:], Record: p.Record}
	}
	return &s, nil
}

// saveSet writes s into cacheDir/<arch>-<key> (through a temporary
// directory, so a crash leaves no half entry) and removes the arch's
// older entries.
func saveSet(cacheDir, arch, key string, s *builtSet) error {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-"+arch+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for i, p := range s.Packages {
		p.Record = p.u.Record
		p.ControlLen = len(p.u.Control)
		body := append(append([]byte(nil), p.u.Control...), p.u.Data...)
		if err := os.WriteFile(filepath.Join(tmp, fmt.Sprintf("%03d.body", i)), body, 0o644); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "set.json"), b, 0o644); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(cacheDir, arch+"-*"))
	final := filepath.Join(cacheDir, arch+"-"+key)
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "set.json")); serr == nil {
			return nil // another run saved it first
		}
		return err
	}
	for _, o := range old {
		if o != final {
			os.RemoveAll(o)
		}
	}
	return nil
}

// repoBuilder assembles the packages of one arch.
type repoBuilder struct {
	arch, debArch, assets string
	world                 []string
	// extra are userland entries beyond debs/test-userland.txt, read
	// already: extraDebs[i] is extra[i]'s package (DebianOptions.Node).
	extra     []userlandEntry
	extraDebs []*deb
	set       builtSet
}

func (b *repoBuilder) add(repo string, s Spec, data []byte, installed int64) error {
	u, err := buildUnsigned(s, data, installed)
	if err != nil {
		return err
	}
	b.set.Packages = append(b.set.Packages, &builtPackage{Repo: repo, Record: u.Record, u: u})
	return nil
}

// stamp reads "<what> <package> <version>" lines of the assets' .complete.
func (b *repoBuilder) stamp(what string) (pkg, version string, err error) {
	data, err := os.ReadFile(filepath.Join(b.assets, ".complete"))
	if err != nil {
		return "", "", fmt.Errorf("%w: run `make assets` (scripts/fetch-assets.sh)", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == what {
			return f[1], f[2], nil
		}
	}
	return "", "", fmt.Errorf("%s/.complete names no %s: run scripts/fetch-assets.sh again", b.assets, what)
}

func (b *repoBuilder) build() (*builtSet, error) {
	steps := []func() error{b.kernel, b.busybox, b.baselayout, b.debs}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	have := map[string]bool{}
	for _, p := range b.set.Packages {
		have[p.Record.Name] = true
	}
	for n := range realPackages {
		if !have[n] {
			return nil, fmt.Errorf("alpinetest: the Debian-sourced repository has no %s: is debs/test-userland.txt the current list?", n)
		}
	}
	b.set.StandIns = slices.DeleteFunc(StandInNames(b.world), func(n string) bool { return have[n] })
	for _, n := range b.set.StandIns {
		repo := "main"
		if communityPackages[n] {
			repo = "community"
		}
		if err := b.add(repo, Spec{Name: n, Version: "0-r0", Arch: b.arch, Description: StandInDescription, Files: []File{}}, nil, 0); err != nil {
			return nil, err
		}
	}
	return &b.set, nil
}

// ---- linux-virt ----

// kernel repacks Debian's kernel as linux-virt.
func (b *repoBuilder) kernel() error {
	_, debVer, err := b.stamp("kernel")
	if err != nil {
		return err
	}
	ver, err := alpineVersion(debVer)
	if err != nil {
		return err
	}
	kdir := filepath.Join(b.assets, "kernel")
	vmlinuz, _ := filepath.Glob(filepath.Join(kdir, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return fmt.Errorf("%s: want one boot/vmlinuz-*, found %d: run scripts/fetch-assets.sh", kdir, len(vmlinuz))
	}
	release := strings.TrimPrefix(filepath.Base(vmlinuz[0]), "vmlinuz-")
	b.set.KernelRelease = release
	kernel, err := os.ReadFile(vmlinuz[0])
	if err != nil {
		return err
	}
	if b.arch == "aarch64" {
		if kernel, err = ZbootWrap(kernel); err != nil {
			return fmt.Errorf("%s: %w", vmlinuz[0], err)
		}
	}
	files := []File{{Name: "boot/", Type: tar.TypeDir}, {Name: "boot/vmlinuz-virt", Body: kernel}}
	if cfg, err := os.ReadFile(filepath.Join(kdir, "boot", "config-"+release)); err == nil {
		files = append(files, File{Name: "boot/config-virt", Body: cfg})
	}
	moddir := filepath.Join(kdir, "lib", "modules", release)
	var mods []string
	err = filepath.WalkDir(moddir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(moddir, p)
			mods = append(mods, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("list modules: %w", err)
	}
	sort.Strings(mods)
	bodies := make([][]byte, len(mods))
	names := make([]string, len(mods))
	errs := make([]error, len(mods))
	var wg sync.WaitGroup
	next := make(chan int)
	for range max(1, min(4, runtime.GOMAXPROCS(0))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				names[i], bodies[i], errs[i] = repackModule(filepath.Join(moddir, filepath.FromSlash(mods[i])), mods[i])
			}
		}()
	}
	for i := range mods {
		next <- i
	}
	close(next)
	wg.Wait()
	var entries []File
	for i := range mods {
		if errs[i] != nil {
			return errs[i]
		}
		entries = append(entries, File{Name: "usr/lib/modules/" + release + "/" + names[i], Body: bodies[i]})
	}
	files = append(files, withParents(entries, "usr/lib/modules/"+release)...)
	var installed int64
	for _, f := range files {
		installed += int64(len(f.Body))
	}
	data, err := GzipTar(files, true)
	if err != nil {
		return err
	}
	return b.add("main", Spec{Name: "linux-virt", Version: ver, Arch: b.arch,
		Description: fmt.Sprintf("Linux kernel %s from Debian (%s), repacked in linux-virt's layout by vibedom's test mirror", release, debVer)}, data, installed)
}

// repackModule returns a module file as linux-virt holds it: .ko, .ko.xz
// and .ko.zst become .ko.gz; other files (modules.order, …) are kept.
func repackModule(file, rel string) (string, []byte, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", nil, err
	}
	var ko []byte
	switch {
	case strings.HasSuffix(rel, ".ko.gz"):
		return rel, raw, nil
	case strings.HasSuffix(rel, ".ko"):
		ko = raw
	case strings.HasSuffix(rel, ".ko.xz"):
		r, err := xz.NewReader(bytes.NewReader(raw))
		if err != nil {
			return "", nil, fmt.Errorf("%s: %w", file, err)
		}
		if ko, err = io.ReadAll(r); err != nil {
			return "", nil, fmt.Errorf("%s: %w", file, err)
		}
		rel = strings.TrimSuffix(rel, ".xz")
	case strings.HasSuffix(rel, ".ko.zst"):
		r, err := zstd.NewReader(bytes.NewReader(raw))
		if err != nil {
			return "", nil, fmt.Errorf("%s: %w", file, err)
		}
		defer r.Close()
		if ko, err = io.ReadAll(r); err != nil {
			return "", nil, fmt.Errorf("%s: %w", file, err)
		}
		rel = strings.TrimSuffix(rel, ".zst")
	default:
		return rel, raw, nil
	}
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.DefaultCompression)
	if _, err := zw.Write(ko); err != nil {
		return "", nil, err
	}
	if err := zw.Close(); err != nil {
		return "", nil, err
	}
	return rel + ".gz", out.Bytes(), nil
}

// Zboot header fields (as image/kernel.go reads them): "MZ" at 0, "zimg"
// at 4, payload offset (u32 LE) at 8, size at 12, compression name at 24.
const zbootPayloadOffset = 4096

// ZbootWrap wraps an arm64 kernel as an EFI zboot image whose payload is
// the gzip-compressed Image, as Alpine's aarch64 vmlinuz-virt is. kernel
// is a raw Image ("ARM\x64" at 56) or a gzip of one. Only the header
// fields vibedom reads are real; there is no EFI stub to run.
func ZbootWrap(kernel []byte) ([]byte, error) {
	var payload []byte
	switch {
	case len(kernel) > 2 && kernel[0] == 0x1f && kernel[1] == 0x8b:
		payload = kernel
	case len(kernel) >= 64 && string(kernel[56:60]) == "ARM\x64":
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(kernel)
		if err := zw.Close(); err != nil {
			return nil, err
		}
		payload = buf.Bytes()
	default:
		return nil, errors.New("not an arm64 Image nor a gzip-compressed one")
	}
	out := make([]byte, zbootPayloadOffset, zbootPayloadOffset+len(payload)+512)
	copy(out[0:], "MZ")
	copy(out[4:], "zimg")
	binary.LittleEndian.PutUint32(out[8:], zbootPayloadOffset)
	binary.LittleEndian.PutUint32(out[12:], uint32(len(payload)))
	copy(out[24:], "gzip\x00")
	out = append(out, payload...)
	// Real zboot images end with the EFI stub's sections; a few padding
	// bytes stand for them, so the payload does not run to the file's end.
	return append(out, make([]byte, 512)...), nil
}

// withParents returns files preceded by directory entries for every
// parent under (and including) top, parents first, sorted.
func withParents(files []File, top string) []File {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Name); d != "." && d != "/"; d = path.Dir(d) {
			dirs[d] = true
			if d == top {
				break
			}
		}
	}
	for d := top; d != "." && d != "/"; d = path.Dir(d) {
		dirs[d] = true
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	out := make([]File, 0, len(names)+len(files))
	for _, d := range names {
		out = append(out, File{Name: d + "/", Type: tar.TypeDir})
	}
	return append(out, files...)
}

// ---- busybox, baselayout, release, certificates ----

func (b *repoBuilder) busybox() error {
	_, debVer, err := b.stamp("busybox")
	if err != nil {
		return err
	}
	ver, err := alpineVersion(debVer)
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(filepath.Join(b.assets, "busybox"))
	if err != nil {
		return err
	}
	list, err := os.ReadFile(filepath.Join(b.assets, "debs", "busybox.paths"))
	if err != nil {
		return fmt.Errorf("%w: run scripts/fetch-assets.sh", err)
	}
	var paths []string
	provides := []string{"cmd:busybox=" + ver}
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		if !strings.HasPrefix(p, "/") || strings.Contains(p, "..") || strings.ContainsAny(p, " \t") {
			return fmt.Errorf("busybox.paths: %q is not an absolute applet path", p)
		}
		paths = append(paths, p)
		if base := path.Base(p); base != "busybox" {
			provides = append(provides, "cmd:"+base+"="+ver)
		}
	}
	if len(paths) < 50 {
		return fmt.Errorf("busybox.paths lists %d applets; run scripts/fetch-assets.sh again", len(paths))
	}
	sort.Strings(provides[1:])
	provides = slices.Compact(provides)
	desc := "Debian's static busybox " + debVer + ", repacked by vibedom's test mirror"
	if err := b.add("main", Spec{Name: "busybox", Version: ver, Arch: b.arch, Description: desc, Provides: provides,
		Files: []File{
			{Name: "bin/", Type: tar.TypeDir},
			{Name: "bin/busybox", Mode: 0o755, Body: bin},
			{Name: "etc/", Type: tar.TypeDir},
			{Name: "etc/busybox-paths.d/", Type: tar.TypeDir},
			{Name: "etc/busybox-paths.d/busybox", Body: []byte(strings.Join(paths, "\n") + "\n")},
		}}, nil, 0); err != nil {
		return err
	}
	return b.add("main", Spec{Name: "busybox-static", Version: ver, Arch: b.arch, Description: desc,
		Files: []File{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/busybox.static", Mode: 0o755, Body: bin}}}, nil, 0)
}

// baselayout adds alpine-baselayout and alpine-release. The Debian
// packages keep their paths (bin/bash, lib/<triplet>/libc.so.6,
// lib64/ld-linux-x86-64.so.2), so bin, sbin, lib and lib64 are links into
// usr, as on a usr-merged system.
func (b *repoBuilder) baselayout() error {
	dir := func(n string, mode int64) File { return File{Name: n + "/", Type: tar.TypeDir, Mode: mode} }
	link := func(n, to string) File { return File{Name: n, Type: tar.TypeSymlink, Link: to} }
	file := func(n, body string) File { return File{Name: n, Body: []byte(body)} }
	files := []File{
		dir("dev", 0o755), dir("etc", 0o755), dir("home", 0o755), dir("media", 0o755), dir("mnt", 0o755),
		dir("opt", 0o755), dir("proc", 0o555), dir("root", 0o700), dir("run", 0o755), dir("srv", 0o755),
		dir("sys", 0o555), {Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		dir("usr", 0o755), dir("usr/bin", 0o755), dir("usr/sbin", 0o755), dir("usr/lib", 0o755),
		dir("usr/lib64", 0o755), dir("usr/local", 0o755), dir("usr/local/bin", 0o755), dir("usr/share", 0o755),
		link("bin", "usr/bin"), link("sbin", "usr/sbin"), link("lib", "usr/lib"), link("lib64", "usr/lib64"),
		dir("var", 0o755), dir("var/cache", 0o755), dir("var/empty", 0o555), dir("var/lib", 0o755),
		dir("var/log", 0o755), dir("var/mail", 0o755), dir("var/opt", 0o755), dir("var/spool", 0o755),
		{Name: "var/tmp/", Type: tar.TypeDir, Mode: 0o1777}, link("var/run", "../run"),
		file("etc/hosts", "127.0.0.1\tlocalhost localhost.localdomain\n::1\t\tlocalhost localhost.localdomain\n"),
		file("etc/shells", "/bin/sh\n/bin/ash\n/bin/bash\n"),
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n"),
		file("etc/group", "root:x:0:root\nnogroup:x:65534:\n"),
		file("etc/profile", "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"),
	}
	if err := b.add("main", Spec{Name: "alpine-baselayout", Version: "3.7.0-r0", Arch: b.arch,
		Description: "vibedom test mirror: base directories (bin, sbin, lib, lib64 link into usr, as the Debian-sourced packages need)", Files: files}, nil, 0); err != nil {
		return err
	}
	rel := strings.TrimPrefix(alpine.Branch, "v") + ".0"
	osRelease := fmt.Sprintf("NAME=\"vibedom test mirror (Debian-sourced)\"\nID=vibedom-test-mirror\nVERSION_ID=%s\nPRETTY_NAME=\"vibedom test mirror (Debian-sourced), standing in for Alpine %s\"\n", rel, alpine.Branch)
	if err := b.add("main", Spec{Name: "alpine-release", Version: rel + "-r0", Arch: b.arch,
		Description: "vibedom test mirror (Debian-sourced): release files", Files: []File{
			dir("etc", 0o755), file("etc/alpine-release", rel+"\n"), file("etc/os-release", osRelease),
		}}, nil, 0); err != nil {
		return err
	}
	return nil
}

// ---- Debian packages ----

// userlandEntry is a line of debs/test-userland.txt.
type userlandEntry struct{ deb, apk string }

func readUserland(file string) ([]userlandEntry, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: run scripts/fetch-assets.sh", err)
	}
	var out []userlandEntry
	for n, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"<debian package> <alpine name>\"", file, n+1)
		}
		out = append(out, userlandEntry{f[0], f[1]})
	}
	return out, nil
}

// skipDebPath drops documentation, as Alpine's -doc subpackages split it.
func skipDebPath(p string) bool {
	for _, pre := range []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/bug/"} {
		if strings.HasPrefix(p+"/", pre) {
			return true
		}
	}
	return false
}

type elfInfo struct {
	soname string
	needed []string
}

func readELF(body []byte) (*elfInfo, bool) {
	if !bytes.HasPrefix(body, []byte("\x7fELF")) {
		return nil, false
	}
	f, err := elf.NewFile(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	info := &elfInfo{}
	info.needed, _ = f.ImportedLibraries()
	if s, err := f.DynString(elf.DT_SONAME); err == nil && len(s) > 0 {
		info.soname = s[0]
	}
	return info, true
}

func (b *repoBuilder) debs() error {
	dir := filepath.Join(b.assets, "debs")
	list, err := readUserland(filepath.Join(dir, "test-userland.txt"))
	if err != nil {
		return err
	}
	type pkg struct {
		e       userlandEntry
		d       *deb
		ver     string
		elfs    map[string]*elfInfo
		soProv  map[string]bool
		dropped map[string]bool
	}
	var pkgs []*pkg
	provided := map[string]bool{} // sonames any package provides
	read := map[int]*deb{}
	for i, d := range b.extraDebs {
		read[len(list)+i] = d
	}
	list = append(list, b.extra...)
	for i, e := range list {
		d := read[i]
		if d == nil {
			m, _ := filepath.Glob(filepath.Join(dir, e.deb+"_*.deb"))
			if len(m) != 1 {
				return fmt.Errorf("%s: want one %s_*.deb, found %d: run scripts/fetch-assets.sh", dir, e.deb, len(m))
			}
			if d, err = readDeb(m[0]); err != nil {
				return err
			}
		}
		if a := d.control["Architecture"]; a != b.debArch && a != "all" {
			return fmt.Errorf("%s is for %s, not %s", d.file, a, b.debArch)
		}
		ver, err := alpineVersion(d.control["Version"])
		if err != nil {
			return err
		}
		p := &pkg{e: e, d: d, ver: ver, elfs: map[string]*elfInfo{}, soProv: map[string]bool{}, dropped: map[string]bool{}}
		for _, f := range d.files {
			if f.Type != tar.TypeReg || skipDebPath(f.Name) {
				continue
			}
			if info, ok := readELF(f.Body); ok {
				p.elfs[f.Name] = info
				if info.soname != "" {
					p.soProv[info.soname] = true
					provided[info.soname] = true
				}
			}
		}
		pkgs = append(pkgs, p)
	}
	for _, p := range pkgs {
		// Programs that need a library no package carries are left out,
		// with what links to them.
		for name, info := range p.elfs {
			for _, n := range info.needed {
				if !provided[n] {
					p.dropped[name] = true
				}
			}
		}
		for changed := true; changed; {
			changed = false
			for _, f := range p.d.files {
				if p.dropped[f.Name] {
					continue
				}
				var target string
				switch f.Type {
				case tar.TypeLink:
					target = f.Link
				case tar.TypeSymlink:
					target = f.Link
					if !strings.HasPrefix(target, "/") {
						target = path.Join(path.Dir(f.Name), target)
					}
					target = strings.TrimPrefix(target, "/")
				default:
					continue
				}
				if p.dropped[target] {
					p.dropped[f.Name] = true
					changed = true
				}
			}
		}
		var files []File
		needs := map[string]bool{}
		cmds := map[string]bool{}
		var installed int64
		for _, f := range p.d.files {
			if skipDebPath(f.Name) {
				continue
			}
			if p.dropped[f.Name] {
				b.set.Dropped = append(b.set.Dropped, p.e.apk+": "+f.Name)
				continue
			}
			if info := p.elfs[f.Name]; info != nil {
				for _, n := range info.needed {
					if !p.soProv[n] {
						needs[n] = true
					}
				}
			}
			if f.Type != tar.TypeDir {
				switch path.Dir(f.Name) {
				case "bin", "sbin", "usr/bin", "usr/sbin":
					if f.Type != tar.TypeReg || f.Mode&0o111 != 0 {
						cmds[path.Base(f.Name)] = true
					}
				}
			}
			if f.Type == tar.TypeDir {
				f.Name = strings.TrimSuffix(f.Name, "/") + "/"
			}
			installed += int64(len(f.Body))
			files = append(files, f)
		}
		var deps, provides []string
		for n := range needs {
			deps = append(deps, "so:"+n)
		}
		for n := range p.soProv {
			provides = append(provides, "so:"+n+"="+p.ver)
		}
		for c := range cmds {
			provides = append(provides, "cmd:"+c+"="+p.ver)
		}
		sort.Strings(deps)
		sort.Strings(provides)
		var data []byte
		var err error
		if p.e.apk == "ca-certificates-bundle" {
			data, installed, err = caBundle(p.d)
		} else {
			data, err = GzipTar(files, true)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p.d.file, err)
		}
		desc := fmt.Sprintf("Debian's %s %s, repacked by vibedom's test mirror", p.d.control["Package"], p.d.control["Version"])
		if p.e.apk == "nodejs" {
			desc = fmt.Sprintf("Node.js %s, the official build (npm's node-linux-*), repacked by vibedom's test mirror", p.d.control["Version"])
		}
		if p.e.apk == "musl" {
			desc = fmt.Sprintf("glibc, not musl: Debian's libc6 %s, repacked by vibedom's test mirror", p.d.control["Version"])
		}
		if err := b.add("main", Spec{Name: p.e.apk, Version: p.ver, Arch: b.arch, Description: desc, Depends: deps, Provides: provides}, data, installed); err != nil {
			return err
		}
	}
	sort.Strings(b.set.Dropped)
	return nil
}

// caBundle makes ca-certificates-bundle's data: the Debian package's
// certificates concatenated into etc/ssl/certs/ca-certificates.crt.
func caBundle(d *deb) ([]byte, int64, error) {
	var certs []File
	for _, f := range d.files {
		if f.Type == tar.TypeReg && strings.HasPrefix(f.Name, "usr/share/ca-certificates/") && strings.HasSuffix(f.Name, ".crt") {
			certs = append(certs, f)
		}
	}
	if len(certs) < 10 {
		return nil, 0, fmt.Errorf("only %d certificates under usr/share/ca-certificates", len(certs))
	}
	sort.Slice(certs, func(i, j int) bool { return certs[i].Name < certs[j].Name })
	var bundle bytes.Buffer
	for _, c := range certs {
		bundle.Write(bytes.TrimRight(c.Body, "\n"))
		bundle.WriteString("\n")
	}
	data, err := GzipTar([]File{
		{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/ssl/", Type: tar.TypeDir}, {Name: "etc/ssl/certs/", Type: tar.TypeDir},
		{Name: "etc/ssl/certs/ca-certificates.crt", Body: bundle.Bytes()},
	}, true)
	return data, int64(bundle.Len()), err
}

// CacheDirFor is where tests keep BuildDebianRepo's cache for assets
// found by FindAssets: .cache/testmirror beside .cache/assets.
func CacheDirFor(assets string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(assets)), "testmirror")
}
