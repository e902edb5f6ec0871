package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// Release is the mitmproxy standalone release `vibedom init
// --with-mitmproxy` installs (the official tarballs from
// downloads.mitmproxy.org, verified against mitmproxyBuilds).
const Release = "12.2.1"

// DefaultMirror is where the release tarballs are fetched from:
// <mirror>/<version>/mitmproxy-<version>-<platform>.tar.gz.
const DefaultMirror = "https://downloads.mitmproxy.org"

// MirrorEnv names the environment variable that replaces
// DefaultMirror when no mirror is given (`vibedom init
// --mitmproxy-mirror`). The tarball is checked against the pinned SHA-256
// whichever mirror serves it.
const MirrorEnv = "VIBEDOM_MITMPROXY_MIRROR"

// DirName is the folder of the vibedom home the releases are
// installed in, one subfolder per version.
const DirName = "mitmproxy"

// installedFile marks a complete install; it is written last.
const installedFile = "vibedom-installed.json"

// mitmproxyBuild is one platform's standalone tarball.
type mitmproxyBuild struct {
	goos, goarch string
	platform     string // in the tarball's name
	// sha256 is the tarball's published SHA-256 ("" when this vibedom
	// pins none yet: the install is refused).
	sha256 string
	// bin is the folder holding mitmdump and mitmweb inside the tarball.
	bin string
}

// mitmproxyBuilds is the one place the pinned tarballs are described. The
// darwin-arm64 digest is the one Homebrew's mitmproxy cask publishes for
// 12.2.1. No published digest of the linux-x86_64 tarball could be found
// when this was written (mitmproxy's download site lists none): fill it in
// here, from a download verified out of band, to enable the install on
// Linux.
var mitmproxyBuilds = []mitmproxyBuild{
	{goos: "darwin", goarch: "arm64", platform: "macos-arm64",
		sha256: "34d2719d91ff1b85ffa64acf20d3a56d6e3a98d308eb45a827ab4266bf68e179", bin: "mitmproxy.app/Contents/MacOS"},
	{goos: "linux", goarch: "amd64", platform: "linux-x86_64", sha256: "", bin: "."},
}

// Limits on what an install downloads and unpacks.
const (
	maxMitmproxyTarball = 512 << 20
	maxMitmproxyTree    = 2 << 30
	maxMitmproxyEntries = 100_000
)

// InstallOptions says where and how to install the pinned release.
type InstallOptions struct {
	// Root is the folder releases go in (<vibedom home>/DirName).
	Root string
	// Mirror replaces DefaultMirror ("" means $VIBEDOM_MITMPROXY_MIRROR,
	// else the default). Whatever it serves is checked against the pinned
	// SHA-256.
	Mirror string
	// Client fetches the tarball; nil means a client with a 10 minute
	// timeout.
	Client *http.Client
	// GOOS and GOARCH pick the build; "" means this machine's.
	GOOS, GOARCH string

	// For this package's tests: a SHA-256 to expect instead of the pinned
	// one, and a lower limit on the unpacked tree.
	sha256  string
	maxTree int64
}

// Installed is a release installed by Install.
type Installed struct {
	Version  string `json:"version"`
	Platform string `json:"platform"`
	SHA256   string `json:"sha256"`
	Dir      string `json:"dir"`
	Mitmdump string `json:"mitmdump"`
	Mitmweb  string `json:"mitmweb"`
	// Fresh is true when this call downloaded it.
	Fresh bool `json:"fresh"`
}

// installedMeta is installedFile's content (paths relative to the
// install, slash-separated).
type installedMeta struct {
	Version  string `json:"version"`
	Platform string `json:"platform"`
	SHA256   string `json:"sha256"`
	Mitmdump string `json:"mitmdump"`
	Mitmweb  string `json:"mitmweb"`
}

// ErrInstall marks every refused or failed install.
var ErrInstall = errors.New("mitmproxy install")

func (o InstallOptions) build() (mitmproxyBuild, string, error) {
	goos, goarch := o.GOOS, o.GOARCH
	if goos == "" {
		goos = runtime.GOOS
	}
	if goarch == "" {
		goarch = runtime.GOARCH
	}
	for _, b := range mitmproxyBuilds {
		if b.goos != goos || b.goarch != goarch {
			continue
		}
		sum := b.sha256
		if o.sha256 != "" {
			sum = o.sha256
		} else if t := testMitmproxySHA256(); t != "" {
			sum = t
		}
		if sum == "" {
			return b, "", fmt.Errorf("%w: this vibedom pins no checksum for the mitmproxy %s %s tarball yet, so it installs none: install mitmproxy %d.%d or later yourself (e.g. apt-get install mitmproxy) and put mitmdump on PATH",
				ErrInstall, Release, b.platform, MinMitmdumpMajor, MinMitmdumpMinor)
		}
		return b, strings.ToLower(sum), nil
	}
	return mitmproxyBuild{}, "", fmt.Errorf("%w: no mitmproxy standalone build is pinned for %s-%s: install mitmproxy %d.%d or later yourself and put mitmdump on PATH",
		ErrInstall, goos, goarch, MinMitmdumpMajor, MinMitmdumpMinor)
}

// Lookup returns the pinned release installed under root, if a
// complete install is there.
func Lookup(root string) (Installed, bool) {
	dir := filepath.Join(root, Release)
	b, err := os.ReadFile(filepath.Join(dir, installedFile))
	if err != nil {
		return Installed{}, false
	}
	var m installedMeta
	if json.Unmarshal(b, &m) != nil || m.Version != Release ||
		!filepath.IsLocal(filepath.FromSlash(m.Mitmdump)) || !filepath.IsLocal(filepath.FromSlash(m.Mitmweb)) {
		return Installed{}, false
	}
	in := Installed{Version: m.Version, Platform: m.Platform, SHA256: m.SHA256, Dir: dir,
		Mitmdump: filepath.Join(dir, filepath.FromSlash(m.Mitmdump)), Mitmweb: filepath.Join(dir, filepath.FromSlash(m.Mitmweb))}
	for _, p := range []string{in.Mitmdump, in.Mitmweb} {
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			return Installed{}, false
		}
	}
	return in, true
}

// PreferredMitmdump is the mitmdump the mitmproxy engine runs: the pinned
// release installed under root when there is one, else "" (mitmdump on
// PATH).
func PreferredMitmdump(root string) string {
	if in, ok := Lookup(root); ok {
		return in.Mitmdump
	}
	return ""
}

// Install fetches the pinned standalone release for this platform,
// checks its SHA-256 against the pinned one and unpacks it into
// Root/<version>, refusing entries that would land outside it (absolute
// paths, "..", symlinks out of the tree or through other symlinks, hard
// links, devices) and trees over the size limits. Nothing is left in Root
// when it fails. An install already there is returned as it is.
func Install(ctx context.Context, o InstallOptions) (Installed, error) {
	b, sum, err := o.build()
	if err != nil {
		return Installed{}, err
	}
	if in, ok := Lookup(o.Root); ok && in.SHA256 == sum {
		return in, nil
	}
	mirror := o.Mirror
	if mirror == "" {
		mirror = os.Getenv(MirrorEnv)
	}
	if mirror == "" {
		mirror = DefaultMirror
	}
	mu, err := url.Parse(mirror)
	if err != nil || (mu.Scheme != "https" && mu.Scheme != "http") || mu.Host == "" {
		return Installed{}, fmt.Errorf("%w: the mirror must be an http(s) URL, got %q", ErrInstall, mirror)
	}
	name := fmt.Sprintf("mitmproxy-%s-%s.tar.gz", Release, b.platform)
	src := strings.TrimSuffix(mirror, "/") + "/" + Release + "/" + name
	if err := os.MkdirAll(o.Root, 0o700); err != nil {
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	tmp, err := os.CreateTemp(o.Root, ".download-*")
	if err != nil {
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := download(ctx, o.Client, src, tmp, sum); err != nil {
		return Installed{}, fmt.Errorf("%w: %s: %v", ErrInstall, name, err)
	}
	staging, err := os.MkdirTemp(o.Root, ".unpack-*")
	if err != nil {
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	defer os.RemoveAll(staging)
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return Installed{}, err
	}
	maxTree := o.maxTree
	if maxTree == 0 {
		maxTree = maxMitmproxyTree
	}
	if err := untar(tmp, staging, maxTree); err != nil {
		return Installed{}, fmt.Errorf("%w: %s: %v; nothing was installed", ErrInstall, name, err)
	}
	in := installedMeta{Version: Release, Platform: b.platform, SHA256: sum,
		Mitmdump: path.Join(b.bin, "mitmdump"), Mitmweb: path.Join(b.bin, "mitmweb")}
	for _, p := range []string{in.Mitmdump, in.Mitmweb} {
		fi, err := os.Lstat(filepath.Join(staging, filepath.FromSlash(p)))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o100 == 0 {
			return Installed{}, fmt.Errorf("%w: %s has no executable %s; nothing was installed", ErrInstall, name, p)
		}
	}
	meta, _ := json.MarshalIndent(in, "", "  ")
	if err := atomicfile.WriteNew(filepath.Join(staging, installedFile), meta, 0o644); err != nil {
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	dest := filepath.Join(o.Root, Release)
	if err := os.RemoveAll(dest); err != nil { // an incomplete or other install
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	if err := os.Rename(staging, dest); err != nil {
		return Installed{}, fmt.Errorf("%w: %v", ErrInstall, err)
	}
	out, ok := Lookup(o.Root)
	if !ok {
		return Installed{}, fmt.Errorf("%w: the install in %s is incomplete", ErrInstall, dest)
	}
	out.Fresh = true
	return out, nil
}

// download writes src to w, refusing more than maxMitmproxyTarball bytes
// or a SHA-256 other than want.
func download(ctx context.Context, c *http.Client, src string, w io.Writer, want string) error {
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Minute}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("download: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("download from %s: %s", src, resp.Status)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(resp.Body, maxMitmproxyTarball+1))
	if err != nil {
		return fmt.Errorf("download: %v", err)
	}
	if n > maxMitmproxyTarball {
		return fmt.Errorf("refused: over %d MiB", maxMitmproxyTarball>>20)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("refused: its SHA-256 is %s, the pinned one is %s (a corrupt or tampered download); nothing was installed", got, want)
	}
	return nil
}

// untar unpacks a gzipped tar into dir (see Install for what is
// refused). Every write goes through an os.Root on dir.
func untar(r io.Reader, dir string, maxTree int64) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(zr)
	links := map[string]bool{} // symlinks made so far
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the tarball: %v", err)
		}
		if n >= maxMitmproxyEntries {
			return fmt.Errorf("more than %d entries", maxMitmproxyEntries)
		}
		name := strings.TrimPrefix(h.Name, "./")
		name = strings.TrimSuffix(name, "/")
		if name == "" || name == "." {
			continue
		}
		if strings.Contains(name, `\`) || !filepath.IsLocal(filepath.FromSlash(name)) || path.Clean(name) != name {
			return fmt.Errorf("entry %q would land outside the install folder", egress.Shorten(h.Name))
		}
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if links[p] {
				return fmt.Errorf("entry %q goes through the symlink %q", egress.Shorten(name), egress.Shorten(p))
			}
		}
		fname := filepath.FromSlash(name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(fname, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			total += h.Size
			if h.Size < 0 || total > maxTree {
				return fmt.Errorf("unpacks to more than %d MiB", maxTree>>20)
			}
			if d := filepath.Dir(fname); d != "." {
				if err := root.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			mode := fs.FileMode(0o644)
			if h.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := root.OpenFile(fname, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			t := h.Linkname
			if t == "" || strings.Contains(t, `\`) || path.IsAbs(t) ||
				!filepath.IsLocal(filepath.FromSlash(path.Join(path.Dir(name), t))) {
				return fmt.Errorf("symlink %q -> %q points outside the install folder", egress.Shorten(name), egress.Shorten(t))
			}
			if d := filepath.Dir(fname); d != "." {
				if err := root.MkdirAll(d, 0o755); err != nil {
					return err
				}
			}
			if err := root.Symlink(t, fname); err != nil {
				return err
			}
			links[name] = true
		default:
			return fmt.Errorf("entry %q is a %s, which an install never holds", egress.Shorten(name), typeName(h.Typeflag))
		}
	}
}

func typeName(t byte) string {
	switch t {
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "fifo"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}
