// Package assets finds the host files vibedom's images are built from,
// outside the image cache: the Linux test assets (an unpacked Debian kernel
// package and a static busybox per arch, fetched by scripts/fetch-assets.sh
// into .cache/assets or ~/.vibedom/assets) and the vibedom-guest binary
// that every image packs as /init: built into a release binary (the
// vibedom_embedguest build tag, `make release`) or built by `make guest`.
//
// What it does: looks in the places Locate lists, first found wins, and
// says in its errors (ErrNoAssets, ErrNoGuest) which command fetches or
// builds what is missing. A release binary's guest agent is extracted,
// checked against the hash recorded at build time, into a private folder
// of the home (~/.vibedom/cache/guest-agent).
//
// What it does not do: it downloads and builds nothing, and verifies
// nothing beyond "is a folder / a regular file" and the embedded agent's
// hash (the recipes in package image check kernels and ELF machines), and
// logs nothing.
package assets

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/kernel"
	"github.com/vibedom/vibedom/vm"
)

// Environment variables Locate reads.
const (
	// EnvAssets names a directory holding <arch>/kernel/ and <arch>/busybox.
	EnvAssets = "VIBEDOM_ASSETS"
	// EnvGuestBin names the vibedom-guest binary to pack.
	EnvGuestBin = "VIBEDOM_GUEST_BIN"
	// EnvKernel chooses the kernel of the test image: "distro" boots the
	// distribution's (<arch>/kernel/) even when vibedom's own guest kernel
	// (<arch>/guest-kernel/, scripts/build-kernel.sh) is there; "" or
	// "auto" boots vibedom's when it is complete.
	EnvKernel = "VIBEDOM_KERNEL"
	// EnvHome is vibedom's home directory (default ~/.vibedom).
	EnvHome = home.EnvHome
)

// Asset errors.
var (
	// ErrNoAssets means no kernel and busybox were found for an arch.
	ErrNoAssets = errors.New("test image assets not found")
	// ErrNoGuest means no vibedom-guest binary was found for an arch.
	ErrNoGuest = errors.New("vibedom-guest binary not found")
)

// Assets are the host files a test image is built from.
type Assets struct {
	Arch vm.Arch
	// KernelDir is an unpacked Debian kernel package: it holds
	// boot/vmlinuz-<release> and lib/modules/<release>/.
	KernelDir string
	// Busybox is a static busybox binary for Arch.
	Busybox string
	// GuestBinary is the static vibedom-guest binary for Arch.
	GuestBinary string
}

// Locate finds the kernel, busybox and guest binary for arch.
//
// Kernel and busybox, as <dir>/<arch>/kernel/ and <dir>/<arch>/busybox,
// where <dir> is, first found wins: $VIBEDOM_ASSETS (when set it must be
// complete); $VIBEDOM_HOME/assets (default ~/.vibedom/assets); .cache/assets
// in the current directory or one of its parents (not in a release build),
// then in the vibedom executable's directory or one of its parents.
//
// Guest binary: $VIBEDOM_GUEST_BIN (when set it must exist); the agent
// built into this binary (a release build), extracted into
// $VIBEDOM_HOME/cache/guest-agent; vibedom-guest-linux-<arch> next to the
// vibedom executable;
// bin/vibedom-guest-linux-<arch> in the current directory or a parent, then
// in the executable's directory or a parent.
//
// Errors wrap ErrNoAssets or ErrNoGuest and name the command that fetches
// or builds what is missing.
func Locate(arch vm.Arch) (Assets, error) {
	a := Assets{Arch: arch}
	if _, ok := kernel.Machine(arch); !ok {
		return a, fmt.Errorf("locate assets: unknown guest architecture %q", arch)
	}
	kdir, bb, err := LocateKernel(arch)
	if err != nil {
		return a, err
	}
	guest, err := LocateGuest(arch)
	if err != nil {
		return a, err
	}
	a.KernelDir, a.Busybox, a.GuestBinary = kdir, bb, guest
	return a, nil
}

// assetDirComplete reports whether dir/<arch> holds a kernel folder and
// busybox. The kernel folder is vibedom's own guest kernel
// (guest-kernel/, when its build finished: .complete) unless
// $VIBEDOM_KERNEL says "distro", else the distribution's (kernel/).
func assetDirComplete(dir string, arch vm.Arch) (kdir, busybox string, ok bool) {
	busybox = filepath.Join(dir, string(arch), "busybox")
	if fi, err := os.Stat(busybox); err != nil || !fi.Mode().IsRegular() {
		return "", "", false
	}
	if GuestKernelWanted() {
		g := filepath.Join(dir, string(arch), GuestKernelDir)
		if isFile(filepath.Join(g, ".complete")) {
			return g, busybox, true
		}
	}
	kdir = filepath.Join(dir, string(arch), "kernel")
	if fi, err := os.Stat(kdir); err != nil || !fi.IsDir() {
		return "", "", false
	}
	return kdir, busybox, true
}

// LocateGuestKernel finds vibedom's own guest kernel for arch for the
// guest image, which otherwise boots linux-virt's verified kernel: a
// complete <dir>/<arch>/guest-kernel/ holding one kernel, where <dir> is
// $VIBEDOM_ASSETS when set (there only), else $VIBEDOM_HOME/assets, else
// .cache/assets in the vibedom executable's folder or its parent (a
// checkout's bin/vibedom). Never from the current directory: that is the
// project a session runs on, which must not choose the kernel. "" when
// there is none or $VIBEDOM_KERNEL says "distro".
func LocateGuestKernel(arch vm.Arch) string {
	if !GuestKernelWanted() {
		return ""
	}
	var dirs []string
	if d := os.Getenv(EnvAssets); d != "" {
		dirs = []string{d}
	} else {
		if h := homeDir(); h != "" {
			dirs = append(dirs, h.Assets())
		}
		if exe, err := os.Executable(); err == nil {
			if r, err := filepath.EvalSymlinks(exe); err == nil {
				exe = r
			}
			bin := filepath.Dir(exe)
			dirs = append(dirs, filepath.Join(bin, ".cache", "assets"), filepath.Join(filepath.Dir(bin), ".cache", "assets"))
		}
	}
	for _, d := range dirs {
		g := filepath.Join(d, string(arch), GuestKernelDir)
		if !isFile(filepath.Join(g, ".complete")) {
			continue
		}
		if _, _, err := kernel.Find(g); err == nil {
			return abs(g)
		}
	}
	return ""
}

// GuestKernelDir is the folder of vibedom's own guest kernel in an assets
// folder's <arch>/, laid out as an unpacked kernel package (see
// scripts/build-kernel.sh).
const GuestKernelDir = "guest-kernel"

// GuestKernelWanted reports whether $VIBEDOM_KERNEL lets vibedom's own
// guest kernel boot when it is built ("", "auto"; not "distro").
func GuestKernelWanted() bool { return os.Getenv(EnvKernel) != "distro" }

// CheckKernelEnv refuses a $VIBEDOM_KERNEL other than "", "auto" or
// "distro", so that a typo does not boot another kernel than meant.
func CheckKernelEnv() error {
	switch v := os.Getenv(EnvKernel); v {
	case "", "auto", "distro":
		return nil
	default:
		return fmt.Errorf("$%s=%q: use auto (vibedom's guest kernel when it is built) or distro (the distribution's)", EnvKernel, v)
	}
}

// LocateKernel finds the kernel package folder and busybox for arch, as
// Locate does (the guest binary aside).
func LocateKernel(arch vm.Arch) (kdir, busybox string, err error) {
	if err := CheckKernelEnv(); err != nil {
		return "", "", err
	}
	var looked []string
	if d := os.Getenv(EnvAssets); d != "" {
		if k, b, ok := assetDirComplete(d, arch); ok {
			return abs(k), abs(b), nil
		}
		return "", "", fmt.Errorf("%w: $%s=%s has no %s/kernel/ and %s/busybox: run `scripts/fetch-assets.sh %s` or unset %s",
			ErrNoAssets, EnvAssets, d, arch, arch, d, EnvAssets)
	}
	if h := homeDir(); h != "" {
		c := h.Assets()
		if k, b, ok := assetDirComplete(c, arch); ok {
			return abs(k), abs(b), nil
		}
		looked = append(looked, c)
	}
	for _, start := range searchStarts() {
		for _, c := range walkUp(start, filepath.Join(".cache", "assets")) {
			if k, b, ok := assetDirComplete(c, arch); ok {
				return abs(k), abs(b), nil
			}
		}
		looked = append(looked, ".cache/assets in "+start+" and its parents")
	}
	return "", "", fmt.Errorf("%w for %s (looked in %s): run `make assets` in the vibedom repository (it runs scripts/fetch-assets.sh), or set %s",
		ErrNoAssets, arch, strings.Join(dedupe(looked), "; "), EnvAssets)
}

// LocateGuest finds the vibedom-guest binary for arch, as Locate does. A
// release binary's own agent wins over any bin/ folder, so that running it
// inside a checkout (or a workspace holding a bin/vibedom-guest-linux-*)
// never packs another build; a development build (no embedded agent) finds
// the `make guest` output.
func LocateGuest(arch vm.Arch) (string, error) {
	name := guestName(arch)
	if p := os.Getenv(EnvGuestBin); p != "" {
		if isFile(p) {
			return abs(p), nil
		}
		return "", fmt.Errorf("%w: $%s=%s does not exist: run `make guest` or unset %s", ErrNoGuest, EnvGuestBin, p, EnvGuestBin)
	}
	if embeddedGuests != nil {
		h, err := home.Default()
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrEmbeddedGuest, err)
		}
		return extractGuest(embeddedGuests, h.GuestAgentCache(), arch)
	}
	var looked []string
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if isFile(p) {
			return abs(p), nil
		}
		looked = append(looked, filepath.Dir(exe))
	}
	for _, start := range searchStarts() {
		for _, p := range walkUp(start, filepath.Join("bin", name)) {
			if isFile(p) {
				return abs(p), nil
			}
		}
		looked = append(looked, "bin/ in "+start+" and its parents")
	}
	return "", fmt.Errorf("%w: no %s (looked in %s): run `make guest` in the vibedom repository, or set %s",
		ErrNoGuest, name, strings.Join(dedupe(looked), "; "), EnvGuestBin)
}

// homeDir is $VIBEDOM_HOME, else ~/.vibedom, else "".
func homeDir() home.Home {
	h, err := home.Default()
	if err != nil {
		return ""
	}
	return h
}

// searchStarts are the directories the walks up start from: the current
// directory (a development build run in a checkout) and the executable's
// directory. A release build (its agent built in) skips the current
// directory: it is often a project the user does not vouch for, which must
// not choose the kernel that boots.
func searchStarts() []string {
	var out []string
	if wd, err := os.Getwd(); err == nil && embeddedGuests == nil {
		out = append(out, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		out = append(out, filepath.Dir(exe))
	}
	return out
}

// walkUp returns dir/rel, parent/rel, … up to the root.
func walkUp(dir, rel string) []string {
	var out []string
	for {
		out = append(out, filepath.Join(dir, rel))
		parent := filepath.Dir(dir)
		if parent == dir {
			return out
		}
		dir = parent
	}
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
