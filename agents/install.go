package agents

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// ManifestFile is the name of the manifest in an installed agent's
// directory, beside the package directory.
const ManifestFile = "manifest.json"

// Manifest records what an agent directory holds and where it came from.
type Manifest struct {
	Agent     string `json:"agent"`
	Arch      string `json:"arch"`
	Libc      string `json:"libc"`
	Package   string `json:"package"`
	Version   string `json:"version"`
	Integrity string `json:"integrity"` // the tarball's, as pinned
	// Binary is the agent's executable relative to the agent directory,
	// e.g. "package/claude".
	Binary       string    `json:"binary"`
	BinarySHA256 string    `json:"binary_sha256"`
	BinarySize   int64     `json:"binary_size"`
	Registry     string    `json:"registry"`
	Installed    time.Time `json:"installed"`
	// Runtime is "node" for an npm agent the guest's node runs (Binary is
	// then its script), "" for a native binary.
	Runtime string `json:"runtime,omitempty"`
	// LockSHA256 is the SHA-256 of a node agent's lockfile.
	LockSHA256 string `json:"lock_sha256,omitempty"`
}

// Installed is an agent unpacked on the host.
type Installed struct {
	Manifest
	// Dir is the agent's directory, <home>/agents/<agent>-<version>-<arch>-<libc>:
	// read-only, holding ManifestFile and package/. This is what is shared
	// into the guest.
	Dir string `json:"dir"`
}

// BinaryPath is the agent's executable on the host.
func (i *Installed) BinaryPath() string { return filepath.Join(i.Dir, filepath.FromSlash(i.Binary)) }

// VerifyBinary hashes the binary again and compares it with the manifest.
func (i *Installed) VerifyBinary() error {
	f, err := os.Open(i.BinaryPath())
	if err != nil {
		return fmt.Errorf("%w: %s: %v (run vibedom init --agents %s)", ErrNotInstalled, i.Agent, err, i.Agent)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("verify %s: %w", i.BinaryPath(), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != i.BinarySHA256 || n != i.BinarySize {
		return fmt.Errorf("%w: %s's binary %s changed since it was installed (sha256 %s, manifest %s): run vibedom init --agents %s",
			ErrNotInstalled, i.Agent, i.BinaryPath(), got, i.BinarySHA256, i.Agent)
	}
	return nil
}

// Find returns the installed agent of pin p under home, checking that its
// manifest matches the pin and that its binary is a regular executable
// file of the recorded size. It does not hash the binary (VerifyBinary
// does). Anything else is ErrNotInstalled, saying which init to run.
func Find(home string, p Pin) (*Installed, error) {
	dir := filepath.Join(AgentsDir(home), p.Dir())
	notInstalled := func(why string) error {
		return fmt.Errorf("%w: %s %s for %s-%s %s: run vibedom init --agents %s",
			ErrNotInstalled, p.Agent, p.Version, p.Arch, p.Libc, why, p.Agent)
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notInstalled("is not installed")
	}
	if err != nil {
		return nil, notInstalled(err.Error())
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, notInstalled("has a damaged manifest")
	}
	if m.Agent != p.Agent || m.Package != p.Package || m.Version != p.Version || m.Integrity != p.Integrity ||
		m.Arch != p.Arch || m.Libc != p.Libc || m.Binary != pkgDir+"/"+p.Binary {
		return nil, notInstalled("does not match the pinned package")
	}
	i := &Installed{Manifest: m, Dir: dir}
	st, err := os.Lstat(i.BinaryPath())
	if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 || st.Size() != m.BinarySize {
		return nil, notInstalled("has lost its binary")
	}
	return i, nil
}

// FindAgent is Find for the pin of agent on a guest of arch and libc.
func FindAgent(home, agent, arch, libc string) (*Installed, error) {
	p, err := Lookup(agent, arch, libc)
	if err != nil {
		return nil, err
	}
	return Find(home, p)
}

// Result is what Install did for one pin.
type Result struct {
	*Installed
	// Fresh is true when this call unpacked the package (false when a
	// verified install was already there).
	Fresh bool `json:"fresh"`
}

// Install makes sure each pin is installed under o.Home: an install that
// Find accepts and whose binary still hashes to its manifest is kept;
// otherwise the tarball comes from the cache or the registry (see
// Options), verified against the pin, and is unpacked into a temporary
// directory that is made read-only and renamed into place. A failure
// leaves no partial agent directory (a download cut short stays in the
// cache's partial/ to be resumed). Pins are handled in order; the first
// error stops the run and is not reported to o.Progress, which is then
// neither ended nor closed (a caller drawing on a terminal ends the line).
func Install(ctx context.Context, o Options, pins []Pin) ([]Result, error) {
	o, reg, err := o.normalized()
	if err != nil {
		return nil, err
	}
	if len(pins) == 0 {
		return nil, nil
	}
	for _, p := range pins {
		if err := p.validate(); err != nil {
			return nil, err
		}
	}
	unlock, err := lockAgents(o.Home)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var total int64
	for _, p := range pins {
		total += p.Size
	}
	o.Progress.Begin(len(pins), total)
	var out []Result
	for _, p := range pins {
		if i, err := Find(o.Home, p); err == nil && i.VerifyBinary() == nil {
			o.Progress.Advance(p.String(), p.Size)
			o.Progress.End(p.String(), nil)
			out = append(out, Result{Installed: i})
			continue
		}
		i, err := installOne(ctx, o, reg, p)
		if err != nil {
			// The error is the caller's to print; the progress is left
			// unfinished rather than saying it twice.
			return out, err
		}
		o.Progress.End(p.String(), nil)
		out = append(out, Result{Installed: i, Fresh: true})
	}
	o.Progress.Close()
	return out, nil
}

func installOne(ctx context.Context, o Options, reg *url.URL, p Pin) (*Installed, error) {
	tgz, err := fetchTarball(ctx, o, reg, p)
	if err != nil {
		return nil, err
	}
	parent := AgentsDir(o.Home)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", parent, err)
	}
	// Leftovers of an interrupted install of this pin.
	if old, _ := filepath.Glob(filepath.Join(parent, ".tmp-"+p.Dir()+"-*")); len(old) > 0 {
		for _, d := range old {
			removeTree(d)
		}
	}
	tmp, err := os.MkdirTemp(parent, ".tmp-"+p.Dir()+"-")
	if err != nil {
		return nil, fmt.Errorf("install %s: %w", p, err)
	}
	done := false
	defer func() {
		if !done {
			removeTree(tmp)
		}
	}()
	m, err := unpackVerified(tgz, tmp, p, o.MaxUnpacked)
	if err != nil {
		return nil, err
	}
	m.Registry = reg.String()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteNew(filepath.Join(tmp, ManifestFile), append(b, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("install %s: %w", p, err)
	}
	if err := makeReadOnly(tmp); err != nil {
		return nil, fmt.Errorf("install %s: %w", p, err)
	}
	final := filepath.Join(parent, p.Dir())
	if _, err := os.Lstat(final); err == nil {
		if err := removeTree(final); err != nil {
			return nil, fmt.Errorf("replace %s: %w (remove it by hand and run init again)", final, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("install %s: %w", p, err)
	}
	atomicfile.SyncDir(parent)
	done = true
	return Find(o.Home, p)
}

// unpackVerified unpacks the cached tarball into dir while hashing it,
// and fails (leaving dir to be removed) unless the bytes read hash to
// the pin: the cache is checked again at the moment of use.
func unpackVerified(tgz, dir string, p Pin, maxUnpacked int64) (*Manifest, error) {
	want, err := pinnedDigest(p)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(tgz)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	h := sha512.New()
	r := io.TeeReader(io.LimitReader(f, p.Size+1), h)
	u, xerr := extract(r, root, p, maxUnpacked)
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, err
	}
	// A file that is not the pinned one is reported as such, even when
	// unpacking it failed first.
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		os.Remove(tgz)
		return nil, fmt.Errorf("%w: %s: the cached tarball hashes to %s, vibedom pins %s; nothing installed (run init again)", ErrIntegrity, p, sri(got), p.Integrity)
	}
	if xerr != nil {
		return nil, xerr
	}
	return &Manifest{
		Agent: p.Agent, Arch: p.Arch, Libc: p.Libc, Package: p.Package, Version: p.Version,
		Integrity: p.Integrity, Binary: pkgDir + "/" + p.Binary,
		BinarySHA256: u.binarySHA256, BinarySize: u.binarySize, Installed: time.Now().UTC().Truncate(time.Second),
	}, nil
}

// makeReadOnly drops every write bit below dir (files 0444 or 0555,
// directories 0555), deepest first; symlinks are left alone.
func makeReadOnly(dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return err
	}
	for i := len(paths) - 1; i >= 0; i-- {
		st, err := os.Lstat(paths[i])
		if err != nil {
			return err
		}
		if st.Mode()&fs.ModeSymlink != 0 {
			continue
		}
		mode := fs.FileMode(0o444)
		if st.IsDir() || st.Mode()&0o100 != 0 {
			mode = 0o555
		}
		if err := os.Chmod(paths[i], mode); err != nil {
			return err
		}
	}
	return nil
}

// removeTree removes a read-only tree: it gives directories their owner's
// write bit back first.
func removeTree(dir string) error {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o755)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// InstalledNames returns the agents that have some version installed
// under home for a guest of arch and libc (by their manifests), sorted;
// an agent whose installed version is no longer the pin's is included.
func InstalledNames(home, arch, libc string) ([]string, error) {
	ents, err := os.ReadDir(AgentsDir(home))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") { // the lock, unfinished installs
			continue
		}
		b, err := os.ReadFile(filepath.Join(AgentsDir(home), e.Name(), ManifestFile))
		if err != nil {
			continue
		}
		var m Manifest
		if json.Unmarshal(b, &m) != nil || m.Arch != arch || m.Libc != libc || !slices.Contains(Names(), m.Agent) {
			continue
		}
		if !slices.Contains(out, m.Agent) {
			out = append(out, m.Agent)
		}
	}
	slices.Sort(out)
	return out, nil
}

// lockFile excludes two installs under one home at once.
const lockFile = ".lock"

// lockAgents takes <home>/agents/.lock, or says another install holds it.
func lockAgents(home string) (func(), error) {
	dir := AgentsDir(home)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := tryLock(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("another vibedom init is installing agents in %s: wait for it to finish, then run again", dir)
	}
	return func() { f.Close() }, nil
}
