package alpine

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// Branch is the Alpine release vibedom builds its guest from. Moving to a
// new release is a change of this constant (and of ReleaseKeys if Alpine
// rotated its keys).
const Branch = "v3.24"

// DefaultMirror is Alpine's CDN. Its layout is
// <mirror>/<branch>/<repository>/<arch>/{APKINDEX.tar.gz,<name>-<version>.apk}.
const DefaultMirror = "https://dl-cdn.alpinelinux.org/alpine"

// MirrorEnv names the environment variable that chooses another mirror.
// The mirror is only a transport: everything it serves is verified against
// the embedded keys, so a hostile mirror can withhold packages but not
// change them.
const MirrorEnv = "VIBEDOM_ALPINE_MIRROR"

// Repositories are the repositories vibedom reads, in the order a name
// is looked up when two carry it (the first wins).
var Repositories = []string{"main", "community"}

// Arches are the architectures vibedom builds guests for.
var Arches = []string{"aarch64", "x86_64"}

// Errors reported by this package, checked with errors.Is.
var (
	// ErrSignature: an index or package signature is missing, made with
	// a key not in the keyring, or does not verify.
	ErrSignature = errors.New("signature not valid")
	// ErrChecksum: a package's bytes differ from what the index or its
	// .PKGINFO promise (size, checksum, datahash, arch, name, version).
	ErrChecksum = errors.New("package does not match its index entry")
	// ErrFormat: a file is not a well-formed index or apk v2 package.
	ErrFormat = errors.New("malformed Alpine file")
	// ErrMissing: a requested package or a dependency has no provider.
	ErrMissing = errors.New("no package provides")
	// ErrConflict: two selected packages conflict.
	ErrConflict = errors.New("packages conflict")
	// ErrLockDrift: the index no longer holds what the lock names.
	ErrLockDrift = errors.New("lock no longer matches the index")
	// ErrUnsafePath: a package entry would land outside the root.
	ErrUnsafePath = errors.New("unsafe path in package")
)

// Options says where packages come from. The zero value plus an Arch is
// valid: the default mirror, the pinned branch, the embedded keys.
type Options struct {
	// Mirror is the base URL; empty means DefaultMirror.
	Mirror string
	// Branch is the release; empty means Branch. Only tests change it.
	Branch string
	// Arch is one of Arches.
	Arch string
	// Keys verifies index and package signatures; nil means ReleaseKeys().
	// Production code never sets it from the workspace or environment.
	Keys *Keyring
}

// MirrorFromEnv returns VIBEDOM_ALPINE_MIRROR, or "" when it is unset.
func MirrorFromEnv() string { return strings.TrimSpace(os.Getenv(MirrorEnv)) }

// normalized returns o with defaults filled in, or an error saying what
// to fix.
func (o Options) normalized() (Options, error) {
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	u, err := url.Parse(o.Mirror)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return o, fmt.Errorf("alpine mirror %q: want an http(s) URL such as %s", o.Mirror, DefaultMirror)
	}
	o.Mirror = strings.TrimRight(o.Mirror, "/")
	if o.Branch == "" {
		o.Branch = Branch
	}
	if !validArch(o.Arch) {
		return o, fmt.Errorf("alpine arch %q: want one of %s", o.Arch, strings.Join(Arches, ", "))
	}
	if o.Keys == nil {
		o.Keys = ReleaseKeys()
	}
	return o, nil
}

func validArch(a string) bool {
	for _, x := range Arches {
		if a == x {
			return true
		}
	}
	return false
}

// repoURL is the directory of one repository for o's arch.
func (o Options) repoURL(repo string) string {
	return o.Mirror + "/" + o.Branch + "/" + repo + "/" + o.Arch
}

// GuestArch maps a Go GOARCH to Alpine's name for it.
func GuestArch(goarch string) (string, error) {
	switch goarch {
	case "arm64":
		return "aarch64", nil
	case "amd64":
		return "x86_64", nil
	}
	return "", fmt.Errorf("no Alpine guest for GOARCH %q: vibedom supports arm64 and amd64", goarch)
}
