package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/vm"
)

// The cache's entries, as Ensure and InstallRootImage write them:
//
//	<name>-<digest16>/           a boot image (kind "boot"): manifest.json, kernel, initrd
//	root/<sha256>.ext4           a root image (kind "root")
//	root/lock-<sha256>.json      which root image a package lock built (goes with its root image)
//	root/.build-<pid>-<hex>.ext4 a root image being built (kind "partial"; a crashed build's once its process is gone)
//
// Everything else (memo.json, lock files, .build-* folders of a build in
// progress, names the cache does not write, symlinks) is left alone.

// Entry kinds.
const (
	KindBoot = "boot"
	KindRoot = "root"
	// KindOther is a name the cache could have written that is not what
	// the cache writes there (a symlink, a file where a folder belongs):
	// listed, never removed.
	KindOther = "other"
	// KindPartial is a root image build that did not finish: kept while
	// the process that writes it runs.
	KindPartial = "partial"
)

// rootLockName is the lock file (in the cache) that BuildGuest holds
// while it installs a root image and names it in the guest manifest, and
// PruneCache while it decides and removes.
const rootLockName = ".root.lock"

var (
	bootDirName  = regexp.MustCompile(`^([a-z0-9][a-z0-9-]{0,62})-([0-9a-f]{16})$`)
	rootFileName = regexp.MustCompile(`^([0-9a-f]{64})\.ext4$`)
	rootIdxName  = regexp.MustCompile(`^lock-[0-9a-f]{64}\.json$`)
	// partialRoot is BuildGuest's temporary root image (see BuildGuest).
	partialRoot = regexp.MustCompile(`^\.build-([0-9]{1,9})-[0-9a-f]{12}\.ext4$`)
)

// SessionUse is what one session tells the cache about the images it may
// still need. The caller (who owns sessions) fills it in.
type SessionUse struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	// Arch is the session's guest architecture ("" when unknown).
	Arch vm.Arch `json:"arch,omitempty"`
	// RootImage is the root image path the session recorded ("" for
	// none, or not recorded yet).
	RootImage string `json:"root_image,omitempty"`
	// Running: a process may run (or be about to boot) the session's VM.
	// Sessions do not record their boot files, so every boot image of
	// Arch (every arch when "") is kept while one runs; a running session
	// that recorded no root image yet keeps every root image.
	Running bool `json:"running,omitempty"`
	// Unknown: what the session uses cannot be told (damaged state):
	// everything is kept.
	Unknown bool `json:"unknown,omitempty"`
}

// CacheEntry is one image in the cache.
type CacheEntry struct {
	// Name is the entry's path relative to the cache, slash-separated.
	Name string `json:"name"`
	Path string `json:"path"`
	Kind string `json:"kind"`
	// Recipe and Arch name a boot image's recipe (from its manifest).
	Recipe string  `json:"recipe,omitempty"`
	Arch   vm.Arch `json:"arch,omitempty"`
	// Size is the bytes of the regular files the entry holds.
	Size  int64     `json:"size"`
	Built time.Time `json:"built,omitzero"`
	// LastUsed is when vibedom last verified the entry for use, to about
	// an hour (zero when the cache has no record).
	LastUsed time.Time `json:"last_used,omitzero"`
	// Keep says whether the entry is needed; Why says by what (or, for
	// an entry kept because it cannot be told, why not).
	Keep bool     `json:"keep"`
	Why  []string `json:"why,omitempty"`

	indexes []string // root/lock-*.json files naming this root image
}

// CacheReport is what ListCache and PruneCache found and did.
type CacheReport struct {
	// Dir is the cache folder (symlinks resolved).
	Dir     string       `json:"dir"`
	Entries []CacheEntry `json:"entries"`
	// Unneeded is the bytes of the entries Keep is false for.
	Unneeded int64 `json:"unneeded_bytes"`
	// Removed and Freed: what PruneCache removed (or, dry run, would).
	Removed []CacheEntry `json:"removed,omitempty"`
	Freed   int64        `json:"freed_bytes"`
	DryRun  bool         `json:"dry_run,omitempty"`
}

// PruneOptions says how PruneCache runs.
type PruneOptions struct {
	// Sessions lists the sessions' uses. It is called with the cache
	// locked, so a session that starts meanwhile is seen.
	Sessions func() ([]SessionUse, error)
	// DryRun removes nothing.
	DryRun bool
	// Waiting, when set, is told the lock file it waits for when a build
	// in another process holds it (PruneCache waits for the build).
	Waiting func(lock string)
}

// ListCache lists the image cache of h and says which entries the current
// images and sessions (uses) need. It takes no lock and changes nothing.
func ListCache(ctx context.Context, h home.Home, uses []SessionUse) (*CacheReport, error) {
	dir, ok, err := cacheDir(h)
	if err != nil || !ok {
		return &CacheReport{Dir: dir, Entries: []CacheEntry{}}, err
	}
	return decide(ctx, h, dir, uses, nil)
}

// PruneCache removes every entry of h's image cache that neither the
// current images (this home's guest image and the boot images its recipes
// make now) nor a session of o.Sessions needs. It holds the cache's build
// locks (the root images' and every recipe's) while it decides and
// removes, waiting for a build in another process to finish. It never
// follows a symlink and removes only entries the cache writes, directly in
// the cache folder or its root/ folder.
func PruneCache(ctx context.Context, h home.Home, o PruneOptions) (*CacheReport, error) {
	dir, ok, err := cacheDir(h)
	if err != nil || !ok {
		return &CacheReport{Dir: dir, Entries: []CacheEntry{}, DryRun: o.DryRun}, err
	}
	unlock, locked, err := lockCache(dir, o.Waiting)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var uses []SessionUse
	if o.Sessions != nil {
		if uses, err = o.Sessions(); err != nil {
			return nil, err
		}
	}
	rep, err := decide(ctx, h, dir, uses, locked)
	if err != nil {
		return nil, err
	}
	rep.DryRun = o.DryRun
	var errs []error
	for _, e := range rep.Entries {
		if e.Keep {
			continue
		}
		if !o.DryRun {
			if err := removeEntry(dir, e); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		rep.Removed = append(rep.Removed, e)
		rep.Freed += e.Size
	}
	return rep, errors.Join(errs...)
}

// cacheDir resolves h's image cache folder (it may be a symlink, as the
// tests' shared cache is). ok is false when there is none.
func cacheDir(h home.Home) (string, bool, error) {
	d, err := filepath.Abs(h.Images())
	if err != nil {
		return "", false, err
	}
	real, err := filepath.EvalSymlinks(d)
	if errors.Is(err, fs.ErrNotExist) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("image cache %s: %w", d, err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return d, false, fmt.Errorf("image cache %s is not a folder: move it away and run `vibedom init`", d)
	}
	return real, true, nil
}

// lockCache takes the root images' lock, then every recipe's lock in name
// order (BuildGuest takes the root lock before a recipe's: the same order).
// locked holds the names of the recipes whose lock it took.
func lockCache(dir string, waiting func(string)) (unlock func(), locked map[string]bool, err error) {
	names := []string{rootLockName}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read image cache: %w", err)
	}
	locked = map[string]bool{}
	for _, e := range ents {
		if m := bootDirName.FindStringSubmatch(e.Name()); m != nil && validName.MatchString(m[1]) {
			locked[m[1]] = true
		}
	}
	for _, a := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		locked[(&AlpineBoot{GuestArch: a}).Name()] = true
		locked[(&DebianTest{Assets: assets.Assets{Arch: a}}).Name()] = true
	}
	for _, r := range slices.Sorted(maps.Keys(locked)) {
		names = append(names, "."+r+".lock")
	}
	var held []*os.File
	unlock = func() {
		for _, f := range slices.Backward(held) {
			unlockFile(f)
			f.Close()
		}
	}
	for _, n := range names {
		f, err := openNoFollow(filepath.Join(dir, n))
		if err != nil {
			unlock()
			return nil, nil, fmt.Errorf("lock image cache: %w", err)
		}
		got, err := tryLockFile(f)
		if err == nil && !got {
			if waiting != nil {
				waiting(n)
			}
			err = lockFile(f)
		}
		if err != nil {
			f.Close()
			unlock()
			return nil, nil, fmt.Errorf("lock image cache %s: %w", n, err)
		}
		held = append(held, f)
	}
	return unlock, locked, nil
}

// lockRoot takes the root images' lock of the cache images.
func lockRoot(images string) (func(), error) {
	if err := os.MkdirAll(images, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache %s: %w", images, err)
	}
	f, err := openNoFollow(filepath.Join(images, rootLockName))
	if err != nil {
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	return func() { unlockFile(f); f.Close() }, nil
}

// needs is what keeps entries: boot folder names, boot recipes whose
// current folder cannot be told, and root images by SHA-256, each with why.
type needs struct {
	boot       map[string][]string
	bootRecipe map[string][]string // recipe name: keep all of it
	bootArch   map[string][]string
	bootAll    []string
	root       map[string][]string
	rootAll    []string
}

func (n *needs) add(m map[string][]string, k, why string) { m[k] = append(m[k], why) }

// current adds the images this home uses now: the guest image of each arch
// `vibedom init` built (root image and boot image), and the Debian test
// image where its assets are.
func (n *needs) current(ctx context.Context, h home.Home, m *memo) {
	for _, a := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		aa, err := alpine.GuestArch(string(a))
		if err != nil {
			continue
		}
		boot := &AlpineBoot{GuestArch: a}
		gm, err := ReadGuestManifest(h.GuestManifest(aa))
		switch {
		case errors.Is(err, ErrNoGuestImage):
		case err != nil:
			why := "the guest manifest of " + string(a) + " is damaged, so what it uses cannot be told (run `vibedom init`)"
			n.rootAll = append(n.rootAll, why)
			n.add(n.bootRecipe, boot.Name(), why)
		default:
			n.add(n.root, gm.Root.SHA256, "the current guest image ("+string(a)+")")
			if pk, err := bootPackages(gm.Lock, h.APKCache()); err == nil {
				boot.Linux, boot.Busybox = pk[0], pk[1]
				boot.Kernel = assets.LocateGuestKernel(a)
				boot.GuestBinary, err = assets.LocateGuest(a)
				if err == nil {
					var d string
					if d, err = recipeDir(ctx, m, boot); err == nil {
						n.add(n.boot, d, "the current guest image's boot files ("+string(a)+")")
						break
					}
				}
				n.add(n.bootRecipe, boot.Name(), "the current one cannot be told ("+err.Error()+")")
			} else {
				n.add(n.bootRecipe, boot.Name(), "the current one cannot be told ("+err.Error()+")")
			}
		}
		if as, err := assets.Locate(a); err == nil {
			if d, err := recipeDir(ctx, m, NewDebianTest(as, nil)); err == nil {
				n.add(n.boot, d, "the current Linux test image ("+string(a)+")")
			}
		}
	}
}

// recipeDir is the cache folder name r's current inputs give.
func recipeDir(ctx context.Context, m *memo, r Recipe) (string, error) {
	in := &Inputs{memo: m}
	if err := r.Inputs(ctx, in); err != nil {
		return "", err
	}
	return r.Name() + "-" + in.digest(r)[:digestLen], nil
}

// sessions adds what sessions may still use.
func (n *needs) sessions(uses []SessionUse) {
	for _, u := range uses {
		who := fmt.Sprintf("session %s (%s)", u.Name, u.Status)
		if u.Unknown {
			why := who + ": its state cannot be read, so what it uses cannot be told"
			n.bootAll = append(n.bootAll, why)
			n.rootAll = append(n.rootAll, why)
			continue
		}
		if m := rootFileName.FindStringSubmatch(filepath.Base(u.RootImage)); m != nil {
			n.add(n.root, m[1], who)
		} else if u.Running && u.RootImage == "" {
			n.rootAll = append(n.rootAll, who+" has not recorded its root image yet")
		}
		if u.Running {
			why := who + " may boot from it (sessions do not record their boot files)"
			if u.Arch == "" {
				n.bootAll = append(n.bootAll, why)
			} else {
				n.add(n.bootArch, string(u.Arch), why)
			}
		}
	}
}

// decide scans the cache folder dir and marks what is needed.
// When locked is not nil, a boot folder of a recipe not in it appeared
// after the locks were taken (a build may be writing it): it is kept.
func decide(ctx context.Context, h home.Home, dir string, uses []SessionUse, locked map[string]bool) (*CacheReport, error) {
	m := loadMemo(dir)
	defer m.save()
	n := &needs{boot: map[string][]string{}, bootRecipe: map[string][]string{}, bootArch: map[string][]string{},
		root: map[string][]string{}}
	n.current(ctx, h, m)
	n.sessions(uses)
	// The memo keys files by the cache path as Ensure was given it.
	memoDir, _ := filepath.Abs(h.Images())

	rep := &CacheReport{Dir: dir, Entries: []CacheEntry{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read image cache: %w", err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		name := e.Name()
		if name == RootDir {
			if e.Type()&fs.ModeSymlink != 0 || !e.IsDir() {
				rep.Entries = append(rep.Entries, other(dir, name))
				continue
			}
			roots, err := scanRoots(dir, memoDir, m, n)
			if err != nil {
				return nil, err
			}
			rep.Entries = append(rep.Entries, roots...)
			continue
		}
		mm := bootDirName.FindStringSubmatch(name)
		if mm == nil {
			continue
		}
		if !e.IsDir() || e.Type()&fs.ModeSymlink != 0 {
			rep.Entries = append(rep.Entries, other(dir, name))
			continue
		}
		ce := CacheEntry{Name: name, Path: filepath.Join(dir, name), Kind: KindBoot, Recipe: mm[1]}
		if mf, err := readManifestNoFollow(ce.Path); err == nil {
			ce.Arch, ce.Built = mf.Arch, mf.Created
		}
		if ce.Arch == "" {
			for _, a := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
				if strings.HasSuffix(ce.Recipe, "-"+string(a)) {
					ce.Arch = a
				}
			}
		}
		ce.Size, ce.LastUsed = treeSize(ce.Path, filepath.Join(memoDir, name), m)
		ce.Why = append(ce.Why, n.boot[name]...)
		ce.Why = append(ce.Why, n.bootRecipe[ce.Recipe]...)
		if ce.Arch != "" {
			ce.Why = append(ce.Why, n.bootArch[string(ce.Arch)]...)
		} else if len(n.bootArch) > 0 {
			ce.Why = append(ce.Why, "its architecture cannot be told and a session runs")
		}
		ce.Why = append(ce.Why, n.bootAll...)
		if locked != nil && !locked[ce.Recipe] {
			ce.Why = append(ce.Why, "it appeared while the prune ran (a build of its recipe may be running)")
		}
		rep.Entries = append(rep.Entries, ce)
	}
	for i := range rep.Entries {
		e := &rep.Entries[i]
		e.Why = slices.Compact(e.Why)
		e.Keep = len(e.Why) > 0
		if !e.Keep {
			rep.Unneeded += e.Size
		}
	}
	slices.SortFunc(rep.Entries, func(a, b CacheEntry) int { return strings.Compare(a.Name, b.Name) })
	return rep, nil
}

func other(dir, name string) CacheEntry {
	return CacheEntry{Name: name, Path: filepath.Join(dir, name), Kind: KindOther,
		Why: []string{"not what the image cache writes here (a symlink or another kind of file): left alone"}}
}

// scanRoots lists root/.
func scanRoots(dir, memoDir string, m *memo, n *needs) ([]CacheEntry, error) {
	rdir := filepath.Join(dir, RootDir)
	ents, err := os.ReadDir(rdir)
	if err != nil {
		return nil, fmt.Errorf("read image cache: %w", err)
	}
	var out []CacheEntry
	bySHA := map[string]int{}
	var idx []string
	for _, e := range ents {
		name := e.Name()
		if rootIdxName.MatchString(name) && e.Type().IsRegular() {
			idx = append(idx, name)
			continue
		}
		if pm := partialRoot.FindStringSubmatch(name); pm != nil && e.Type().IsRegular() {
			// BuildGuest writes it holding the root lock, which the
			// caller of a prune holds: its process crashed, unless an
			// older vibedom (without the lock) builds now.
			fi, err := e.Info()
			if err != nil {
				continue
			}
			ce := CacheEntry{Name: RootDir + "/" + name, Path: filepath.Join(rdir, name), Kind: KindPartial, Size: fi.Size(), Built: fi.ModTime().UTC()}
			if pid, _ := strconv.Atoi(pm[1]); processAlive(pid) {
				ce.Why = append(ce.Why, "process "+pm[1]+" may still be building it")
			}
			out = append(out, ce)
			continue
		}
		mm := rootFileName.FindStringSubmatch(name)
		if mm == nil {
			continue
		}
		rel := RootDir + "/" + name
		if !e.Type().IsRegular() {
			out = append(out, other(dir, rel))
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		ce := CacheEntry{Name: rel, Path: filepath.Join(rdir, name), Kind: KindRoot, Size: fi.Size(), Built: fi.ModTime().UTC()}
		if mf, ok := m.Files[filepath.Join(memoDir, RootDir, name)]; ok && mf.Used > 0 {
			ce.LastUsed = time.Unix(mf.Used, 0).UTC()
		}
		ce.Why = append(slices.Clone(n.root[mm[1]]), n.rootAll...)
		bySHA[mm[1]] = len(out)
		out = append(out, ce)
	}
	// An index goes with the root image it names.
	for _, name := range idx {
		b, err := atomicfile.ReadLimited(filepath.Join(rdir, name), 1<<20)
		if err != nil {
			continue
		}
		var x rootIndex
		if json.Unmarshal(b, &x) != nil {
			continue
		}
		if i, ok := bySHA[x.Root.SHA256]; ok {
			out[i].indexes = append(out[i].indexes, name)
		}
	}
	return out, nil
}

// readManifestNoFollow reads a boot image's manifest, refusing a symlink.
func readManifestNoFollow(dir string) (*manifest, error) {
	p := filepath.Join(dir, "manifest.json")
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", p)
	}
	b, err := atomicfile.ReadLimited(p, 1<<20)
	if err != nil {
		return nil, err
	}
	var mf manifest
	if err := json.Unmarshal(b, &mf); err != nil {
		return nil, err
	}
	return &mf, nil
}

// treeSize sums the regular files under dir (never following a symlink)
// and finds the latest use the memo records for them (under memoDir).
func treeSize(dir, memoDir string, m *memo) (int64, time.Time) {
	var size int64
	var used time.Time
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			size += fi.Size()
		}
		if rel, err := filepath.Rel(dir, p); err == nil {
			if mf, ok := m.Files[filepath.Join(memoDir, rel)]; ok && mf.Used > 0 {
				if t := time.Unix(mf.Used, 0).UTC(); t.After(used) {
					used = t
				}
			}
		}
		return nil
	})
	return size, used
}

// removeEntry removes one entry, checking again that it is what the cache
// writes: a real folder or a regular file directly where the cache puts it.
func removeEntry(dir string, e CacheEntry) error {
	if e.Kind != KindBoot && e.Kind != KindRoot && e.Kind != KindPartial {
		return nil
	}
	p := filepath.Join(dir, filepath.FromSlash(e.Name))
	if p != e.Path || !strings.HasPrefix(p, dir+string(filepath.Separator)) {
		return fmt.Errorf("remove image %s: not in the cache", e.Name)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("remove image %s: %w", e.Name, err)
	}
	switch {
	case e.Kind == KindBoot && fi.IsDir():
		// RemoveAll removes a symlink inside, never what it points to.
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("remove image %s: %w", e.Name, err)
		}
	case e.Kind == KindPartial && fi.Mode().IsRegular():
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove image %s: %w", e.Name, err)
		}
	case e.Kind == KindRoot && fi.Mode().IsRegular():
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove image %s: %w", e.Name, err)
		}
		for _, x := range e.indexes {
			os.Remove(filepath.Join(dir, RootDir, x))
		}
	default:
		return fmt.Errorf("remove image %s: it changed while it was pruned: left alone", e.Name)
	}
	return nil
}
