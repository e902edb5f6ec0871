package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/image/rootfs"
	"github.com/vibedom/vibedom/progress"
	"github.com/vibedom/vibedom/vm"
)

// The guest image on disk:
//
//	~/.vibedom/packages.txt           extra packages, one a line (the user's)
//	~/.vibedom/guest/<arch>.json      the guest image manifest: lock, root image, boot packages
//	~/.vibedom/images/root/<sha>.ext4 root images, named by content, shared by sessions
//	~/.vibedom/images/alpine-boot-…   kernel and initramfs (Ensure's cache)
//	~/.vibedom/cache/apk/             verified packages (alpine.Fetch's cache)
//
// The manifest lives outside images/ on purpose: images/ is a cache that
// may be shared (tests share it between homes), the manifest says which
// image this home uses. The names are package home's.
// ErrNoGuestImage means `vibedom init` has not built a guest image for
// this arch in this home.
var ErrNoGuestImage = errors.New("no guest image")

// GuestManifest records what one built guest image is made of.
type GuestManifest struct {
	Arch string `json:"arch"` // Alpine arch
	// Lock is the resolved package set; LockSHA256 its canonical hash.
	Lock       *alpine.Lock `json:"lock"`
	LockSHA256 string       `json:"lock_sha256"`
	Mirror     string       `json:"mirror"`
	// Root is the root image in the cache.
	Root RootFile `json:"root"`
	// Setup lists what was done in place of install scripts.
	Setup []string `json:"setup,omitempty"`
	// Libc is the root image's C library ("musl", or "glibc" for the
	// Debian-sourced test userland): agents are fetched for it.
	Libc  string    `json:"libc,omitempty"`
	Built time.Time `json:"built"`
}

// RootFile is a root image in the cache.
type RootFile struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// GuestOptions says how BuildGuest gets packages.
type GuestOptions struct {
	Arch vm.Arch
	// Mirror is the Alpine mirror; "" means $VIBEDOM_ALPINE_MIRROR, else
	// Alpine's CDN.
	Mirror string
	// Update moves to the newest packages of the pinned branch.
	Update bool
	// Keys verifies indexes and packages; nil means Alpine's release keys.
	// Only tests set it.
	Keys   *alpine.Keyring
	Client *http.Client
	// Progress receives download progress and steps; TTY draws a bar.
	Progress io.Writer
	TTY      bool
}

// GuestResult reports what BuildGuest did.
type GuestResult struct {
	Arch     string   `json:"arch"`
	Manifest string   `json:"manifest"`
	Root     string   `json:"root_image"`
	RootSHA  string   `json:"root_sha256"`
	RootSize int64    `json:"root_size"`
	Packages int      `json:"packages"`
	Extra    []string `json:"extra_packages,omitempty"`
	// Changes lists what moved against the previous lock ("git 2.45.0-r0 -> 2.45.1-r0").
	Changes []string `json:"changes,omitempty"`
	// Fresh: the lock was resolved against the mirror now (else reused).
	Fresh bool `json:"resolved"`
	// Built: a root image was built now (else the cached one was used).
	Built  bool          `json:"built"`
	Libc   string        `json:"libc"`
	Kernel string        `json:"kernel"`
	Initrd string        `json:"initrd"`
	Took   time.Duration `json:"took_ns"`
}

func (o *GuestOptions) say(format string, a ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "vibedom: "+format+"\n", a...)
	}
}

// BuildGuest makes sure this home has a guest image for o.Arch: the
// lock (reused unless the package list changed or Update), the packages
// (downloaded and verified), the root image and the boot files. When
// nothing changed it only checks what is there (well under a second).
func BuildGuest(ctx context.Context, h home.Home, o GuestOptions) (*GuestResult, error) {
	start := time.Now()
	arch, err := alpine.GuestArch(string(o.Arch))
	if err != nil {
		return nil, err
	}
	if o.Mirror == "" {
		o.Mirror = alpine.MirrorFromEnv()
	}
	extra, err := alpine.ReadPackagesFile(h.PackagesFile())
	if err != nil {
		return nil, err
	}
	world := alpine.World(extra)
	res := &GuestResult{Arch: arch, Manifest: h.GuestManifest(arch), Extra: extra}

	prev, err := ReadGuestManifest(h.GuestManifest(arch))
	if err != nil && !errors.Is(err, ErrNoGuestImage) {
		return nil, err
	}
	var prevLock *alpine.Lock
	if prev != nil {
		prevLock = prev.Lock
	}
	lock := prevLock
	if lock == nil || o.Update || !slices.Equal(lock.World, world) || lock.Branch != alpine.Branch {
		if lock != nil && lock.Branch != alpine.Branch && !o.Update {
			return nil, fmt.Errorf("the guest image is Alpine %s, this vibedom uses %s: run `vibedom init --update`", lock.Branch, alpine.Branch)
		}
		o.say("reading the Alpine %s package index (%s)", alpine.Branch, arch)
		idx, err := alpine.FetchIndexes(ctx, o.Client, alpine.Options{Mirror: o.Mirror, Arch: arch, Keys: o.Keys})
		if err != nil {
			return nil, err
		}
		next, err := alpine.Resolve(idx, world, prevLock, o.Update)
		if errors.Is(err, alpine.ErrLockDrift) && !o.Update && onlyAddedOrRemoved(prevLock, next) {
			// The package list changed: new packages join, dropped ones
			// leave, and every package kept stays at its locked version.
			err = nil
		}
		if err != nil {
			return nil, err
		}
		if prevLock != nil {
			for _, c := range alpine.Diff(prevLock, next) {
				res.Changes = append(res.Changes, c.String())
			}
		}
		lock, res.Fresh = next, true
	}
	lockBytes := lock.Marshal()
	lockSum := sha256.Sum256(lockBytes)
	lockSHA := hex.EncodeToString(lockSum[:])
	res.Packages = len(lock.Packages)
	cacheDir := h.APKCache()
	images := h.Images()

	boot, err := bootPackages(lock, cacheDir)
	if err != nil {
		return nil, err
	}
	// Warm path: same lock, root image intact, boot packages cached.
	warm := prev != nil && prev.LockSHA256 == lockSHA && !o.Update &&
		VerifyRootImage(images, prev.Root.Path, prev.Root.SHA256, false) == nil &&
		fileExists(boot[0].Path) && fileExists(boot[1].Path)
	var m *GuestManifest
	if warm {
		m = prev
	} else {
		// A prune in another process must not remove the root image
		// installed here before the manifest names it.
		unlock, err := lockRoot(images)
		if err != nil {
			return nil, err
		}
		defer unlock()
		o.say("fetching %d packages", len(lock.Packages))
		prog := progress.NewText(io.Discard, false)
		if o.Progress != nil {
			prog = progress.NewText(o.Progress, o.TTY)
		}
		files, err := alpine.Fetch(ctx, alpine.FetchOptions{
			Options: alpine.Options{Mirror: o.Mirror, Arch: arch, Keys: o.Keys}, CacheDir: cacheDir,
			Client: o.Client, Progress: prog,
		}, lock)
		prog.Close()
		if err != nil {
			return nil, err
		}
		m = &GuestManifest{Arch: arch, Lock: lock, LockSHA256: lockSHA, Mirror: o.Mirror, Built: time.Now().UTC().Truncate(time.Second)}
		if prev != nil && prev.LockSHA256 == lockSHA && VerifyRootImage(images, prev.Root.Path, prev.Root.SHA256, false) == nil {
			m.Root, m.Setup, m.Libc = prev.Root, prev.Setup, prev.Libc
		} else if known, ok := knownRoot(images, lockSHA); ok {
			// Another home (or an earlier manifest) built this lock's
			// image: builds are reproducible, so it is this one.
			m.Root, m.Setup, m.Libc = known.Root, known.Setup, known.Libc
		} else {
			o.say("building the root image")
			if err := os.MkdirAll(filepath.Join(images, RootDir), 0o755); err != nil {
				return nil, err
			}
			tmp := filepath.Join(images, RootDir, fmt.Sprintf(".build-%d-%s.ext4", os.Getpid(), lockSHA[:12]))
			r, err := rootfs.Build(ctx, rootfs.Options{
				Arch: arch, Lock: lock, Files: files, Keys: o.Keys, Exclude: alpine.BootWorld, Out: tmp,
			})
			if err != nil {
				os.Remove(tmp)
				return nil, fmt.Errorf("build the root image: %w", err)
			}
			p, err := InstallRootImage(images, tmp, r.SHA256)
			if err != nil {
				os.Remove(tmp)
				return nil, err
			}
			m.Root.Path, m.Root.SHA256, m.Root.Size, m.Setup, m.Libc = p, r.SHA256, r.Size, r.Setup, r.Libc
			res.Built = true
			rememberRoot(images, lockSHA, m)
		}
	}
	img, err := ensureAlpineBoot(ctx, h, o.Arch, m, o.Keys)
	if err != nil {
		return nil, err
	}
	if !warm {
		if err := writeGuestManifest(h.GuestManifest(arch), m); err != nil {
			return nil, err
		}
	}
	res.Root, res.RootSHA, res.RootSize, res.Libc = m.Root.Path, m.Root.SHA256, m.Root.Size, m.Libc
	res.Kernel, res.Initrd = img.Kernel, img.Initrd
	res.Took = time.Since(start)
	return res, nil
}

// onlyAddedOrRemoved reports whether next differs from prev only by
// packages added or removed (no package changed version or checksum).
func onlyAddedOrRemoved(prev, next *alpine.Lock) bool {
	if prev == nil || next == nil {
		return false
	}
	for _, c := range alpine.Diff(prev, next) {
		if c.Kind == alpine.Changed {
			return false
		}
	}
	return true
}

// bootPackages finds linux-virt and busybox-static in lock.
func bootPackages(lock *alpine.Lock, cacheDir string) ([]BootPackage, error) {
	var out []BootPackage
	for _, name := range alpine.BootWorld {
		i := slices.IndexFunc(lock.Packages, func(p alpine.LockedPackage) bool { return p.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("the package lock has no %s: run `vibedom init --update`", name)
		}
		out = append(out, BootPackage{Locked: lock.Packages[i], Path: alpine.CachePath(cacheDir, lock.Packages[i])})
	}
	return out, nil
}

func ensureAlpineBoot(ctx context.Context, h home.Home, arch vm.Arch, m *GuestManifest, keys *alpine.Keyring) (*Image, error) {
	boot, err := bootPackages(m.Lock, h.APKCache())
	if err != nil {
		return nil, err
	}
	guest, err := assets.LocateGuest(arch)
	if err != nil {
		return nil, err
	}
	if err := assets.CheckKernelEnv(); err != nil {
		return nil, err
	}
	img, err := Ensure(ctx, h.Images(), &AlpineBoot{
		GuestArch: arch, Linux: boot[0], Busybox: boot[1], GuestBinary: guest, Keys: keys,
		Kernel: assets.LocateGuestKernel(arch),
	})
	if err != nil {
		if !fileExists(boot[0].Path) || !fileExists(boot[1].Path) {
			return nil, fmt.Errorf("%w (the package cache lost the kernel packages: run `vibedom init`)", err)
		}
		return nil, err
	}
	return img, nil
}

// GuestBoot is what a session boots: the boot files and the root image.
type GuestBoot struct {
	Image     *Image
	RootImage string
	Manifest  *GuestManifest
}

// LoadGuest returns this home's guest image for arch, verified
// (cheaply: see VerifyRootImage), or an error wrapping
// ErrNoGuestImage when `vibedom init` has not built one. keys verifies
// the boot packages; nil means Alpine's release keys.
func LoadGuest(ctx context.Context, h home.Home, arch vm.Arch, keys *alpine.Keyring) (*GuestBoot, error) {
	a, err := alpine.GuestArch(string(arch))
	if err != nil {
		return nil, err
	}
	m, err := ReadGuestManifest(h.GuestManifest(a))
	if err != nil {
		return nil, err
	}
	if err := VerifyRootImage(h.Images(), m.Root.Path, m.Root.SHA256, false); err != nil {
		return nil, err
	}
	img, err := ensureAlpineBoot(ctx, h, arch, m, keys)
	if err != nil {
		return nil, err
	}
	return &GuestBoot{Image: img, RootImage: m.Root.Path, Manifest: m}, nil
}

// maxManifest bounds the guest manifest.
const maxManifest = 16 << 20

// ReadGuestManifest reads and checks the guest image manifest at p (see
// home.Home.GuestManifest). A missing one is an error wrapping
// ErrNoGuestImage; a damaged one, an error that says to run `vibedom init`.
func ReadGuestManifest(p string) (*GuestManifest, error) {
	b, err := atomicfile.ReadLimited(p, maxManifest)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w for this architecture: run `vibedom init`", ErrNoGuestImage)
	}
	if err != nil {
		return nil, err
	}
	var m GuestManifest
	if err := json.Unmarshal(b, &m); err != nil || m.Lock == nil {
		return nil, fmt.Errorf("%s is damaged (%v): run `vibedom init` to rebuild it", p, err)
	}
	sum := sha256.Sum256(m.Lock.Marshal())
	if hex.EncodeToString(sum[:]) != m.LockSHA256 {
		return nil, fmt.Errorf("%s: the lock does not match its checksum: run `vibedom init --update`", p)
	}
	if _, err := alpine.ParseLock(m.Lock.Marshal()); err != nil {
		return nil, fmt.Errorf("%s: %w: run `vibedom init --update`", p, err)
	}
	return &m, nil
}

func writeGuestManifest(p string, m *GuestManifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(p, append(b, '\n'), 0o600)
}

// fileExists reports whether p is a regular file (after symlinks).
func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// Choice is what a session boots: this home's guest image, or the Debian
// test image built from Assets.
type Choice struct {
	Alpine bool
	Assets assets.Assets // the Debian test image's, when !Alpine
}

// Choose decides, cheaply and before anything is made, what a session
// boots: this home's guest image when `vibedom init` built one, else the
// Debian test image from the Linux test assets (`make assets`).
func Choose(h home.Home, arch vm.Arch) (Choice, error) {
	a, err := alpine.GuestArch(string(arch))
	if err != nil {
		return Choice{}, err
	}
	if _, err := os.Stat(h.GuestManifest(a)); err == nil {
		return Choice{Alpine: true}, nil
	}
	assets, aerr := assets.Locate(arch)
	if aerr != nil {
		return Choice{}, fmt.Errorf("%w for %s: run `vibedom init` (on Linux, `make assets` also gives the test image: %v)", ErrNoGuestImage, arch, aerr)
	}
	return Choice{Assets: assets}, nil
}

// Prepare makes the chosen image ready: the boot files, and the root
// image path ("" for the Debian test image, which has no root image) and
// its C library. keys verifies the guest image's boot packages (see
// LoadGuest).
func (c Choice) Prepare(ctx context.Context, h home.Home, arch vm.Arch, keys *alpine.Keyring) (img *Image, root, libc string, err error) {
	if !c.Alpine {
		img, err := Ensure(ctx, h.Images(), NewDebianTest(c.Assets, nil))
		return img, "", "", err
	}
	gb, err := LoadGuest(ctx, h, arch, keys)
	if err != nil {
		return nil, "", "", err
	}
	return gb.Image, gb.RootImage, gb.Manifest.Libc, nil
}

// rootIndex is what images/root/lock-<lock sha256>.json records: which
// root image a lock built.
type rootIndex struct {
	Root  RootFile `json:"root"`
	Setup []string `json:"setup,omitempty"`
	Libc  string   `json:"libc,omitempty"`
}

func rootIndexPath(images, lockSHA string) string {
	return filepath.Join(images, RootDir, "lock-"+lockSHA+".json")
}

// knownRoot finds an intact root image built from lockSHA.
func knownRoot(images, lockSHA string) (*rootIndex, bool) {
	b, err := atomicfile.ReadLimited(rootIndexPath(images, lockSHA), 1<<20)
	if err != nil {
		return nil, false
	}
	var x rootIndex
	if json.Unmarshal(b, &x) != nil {
		return nil, false
	}
	// The path is rebuilt from the content name: the index cannot point
	// anywhere else.
	x.Root.Path = RootImagePath(images, x.Root.SHA256)
	if VerifyRootImage(images, x.Root.Path, x.Root.SHA256, false) != nil {
		return nil, false
	}
	return &x, true
}

func rememberRoot(images, lockSHA string, m *GuestManifest) {
	var x rootIndex
	x.Root, x.Setup, x.Libc = m.Root, m.Setup, m.Libc
	if b, err := json.Marshal(&x); err == nil {
		_ = atomicfile.WriteFile(rootIndexPath(images, lockSHA), b, 0o644)
	}
}

// GuestLibc is the C library of this home's guest image for arch ("" when
// there is none): agents are fetched for it.
func GuestLibc(h home.Home, arch vm.Arch) string {
	a, err := alpine.GuestArch(string(arch))
	if err != nil {
		return ""
	}
	m, err := ReadGuestManifest(h.GuestManifest(a))
	if err != nil {
		return ""
	}
	if m.Libc == "" {
		return "musl"
	}
	return m.Libc
}
