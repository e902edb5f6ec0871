package image

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/vm"
)

// Cache errors.
var (
	// ErrCorrupt means a cached image does not match its manifest. Ensure
	// rebuilds such an image; Verify reports it.
	ErrCorrupt = errors.New("cached image is corrupt")
	// ErrInputsChanged means a recipe's inputs kept changing while it was
	// being built (for example a guest binary being rebuilt at the same
	// time). Running again once the inputs are settled fixes it.
	ErrInputsChanged = errors.New("image inputs changed during the build")
)

var errNotRegular = errors.New("not a regular file")

// Recipe describes how to make one image. Implementations must be
// deterministic: the same inputs give the same outputs.
type Recipe interface {
	// Name names the image, e.g. "debian-test-amd64": lower case letters,
	// digits and dashes. It starts the cache directory's name.
	Name() string
	// Arch is the guest architecture the image boots.
	Arch() vm.Arch
	// Inputs declares every input the outputs depend on, files by content
	// and parameters by value. Ensure calls it on every use, so it must be
	// cheap when nothing changed (Inputs.File memoizes file hashes).
	Inputs(ctx context.Context, in *Inputs) error
	// Build writes the outputs into dir, an empty private directory, and
	// names them. in is the set of inputs declared by the Inputs call that
	// preceded it, for recipes that keep memos in it.
	Build(ctx context.Context, in *Inputs, dir string) (Outputs, error)
}

// Outputs names the files a recipe built, relative to its build directory.
type Outputs struct {
	Kernel string
	Initrd string
}

// Image is a built, verified image in the cache.
type Image struct {
	// Name is the recipe's name and Arch its architecture.
	Name string
	Arch vm.Arch
	// Digest identifies the inputs (hex SHA-256).
	Digest string
	// Dir is the cache directory <cacheRoot>/<Name>-<Digest[:16]>.
	Dir string
	// Kernel and Initrd are absolute paths of the boot files. They must not
	// be modified; sessions copy the initrd (WriteSessionInitrd).
	Kernel string
	Initrd string
	// InitrdSize is the initrd's size in bytes, as verified.
	InitrdSize int64
}

// manifest is manifest.json in an image directory.
type manifest struct {
	Name    string                  `json:"name"`
	Arch    vm.Arch                 `json:"arch"`
	Digest  string                  `json:"digest"`
	Created time.Time               `json:"created"`
	Files   map[string]manifestFile `json:"files"` // "kernel", "initrd"
	Inputs  []inputRecord           `json:"inputs"`
}

type manifestFile struct {
	Path   string `json:"path"` // relative to the image directory
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

type inputRecord struct {
	Label  string `json:"label"`
	Path   string `json:"path,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	Value  string `json:"value,omitempty"`
}

// Inputs collects what an image is made from. Its digest covers every
// declared file by content and every parameter by value; file paths are
// recorded for the manifest but do not change the digest, so moving the
// assets does not invalidate the cache.
type Inputs struct {
	memo    *memo
	records []inputRecord
}

// File declares the file at path as an input under label and returns its
// SHA-256 (hex). Hashes are memoized by the file's identity (device, inode,
// size, modification and change times), so an unchanged file is not read
// again.
func (in *Inputs) File(label, path string) (string, error) {
	sum, err := in.memo.fileSum(path)
	if err != nil {
		return "", fmt.Errorf("image input %s: %w", label, err)
	}
	in.records = append(in.records, inputRecord{Label: label, Path: path, SHA256: sum})
	return sum, nil
}

// Param declares a parameter (such as the list of wanted modules).
func (in *Inputs) Param(label, value string) {
	in.records = append(in.records, inputRecord{Label: label, Value: value})
}

// digest hashes the declared inputs, in declaration order.
func (in *Inputs) digest(r Recipe) string {
	h := sha256.New()
	fmt.Fprintf(h, "vibedom image v1\nname %q\narch %q\n", r.Name(), r.Arch())
	for _, rec := range in.records {
		if rec.SHA256 != "" {
			fmt.Fprintf(h, "file %q %s\n", rec.Label, rec.SHA256)
		} else {
			fmt.Fprintf(h, "param %q %q\n", rec.Label, rec.Value)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// fileID is a file's identity as statID reports it.
type fileID struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
}

type memoFile struct {
	ID     fileID `json:"id"`
	SHA256 string `json:"sha256"`
	Used   int64  `json:"used"` // unix seconds, for pruning
}

type memoValue struct {
	Value string `json:"value"`
	Used  int64  `json:"used"`
}

// memo is the cache's small persistent memory: file hashes by identity and
// recipe-specific values (such as resolved module lists) by key. It lives in
// <cacheRoot>/memo.json. It only saves work: every entry is checked before
// use, a lost or damaged memo costs a re-hash, and concurrent processes
// may overwrite each other's additions.
type memo struct {
	path string

	mu     sync.Mutex
	Files  map[string]memoFile  `json:"files"`
	Values map[string]memoValue `json:"values"`
	dirty  bool
}

const (
	memoName     = "memo.json"
	memoMaxFiles = 4096
	memoMaxVals  = 256
)

func loadMemo(cacheRoot string) *memo {
	m := &memo{path: filepath.Join(cacheRoot, memoName)}
	if data, err := os.ReadFile(m.path); err == nil {
		// A damaged memo is ignored and rewritten.
		_ = json.Unmarshal(data, m)
	}
	if m.Files == nil {
		m.Files = map[string]memoFile{}
	}
	if m.Values == nil {
		m.Values = map[string]memoValue{}
	}
	return m
}

// fileSum returns the SHA-256 of the file at path, from the memo when the
// file's identity is unchanged.
func (m *memo) fileSum(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	id, err := statID(abs)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	e, ok := m.Files[abs]
	m.mu.Unlock()
	if ok && e.ID == id && e.SHA256 != "" {
		m.touch(abs, e)
		return e.SHA256, nil
	}
	sum, n, err := hashFile(abs)
	if err != nil {
		return "", err
	}
	// Remember the hash only if the file did not change while it was read.
	if id2, err := statID(abs); err == nil && id2 == id && n == id.Size {
		m.remember(abs, id, sum)
	}
	return sum, nil
}

// remember records that the file at abs with identity id has hash sum.
func (m *memo) remember(abs string, id fileID, sum string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Files[abs] = memoFile{ID: id, SHA256: sum, Used: time.Now().Unix()}
	m.dirty = true
}

func (m *memo) touch(abs string, e memoFile) {
	now := time.Now().Unix()
	if now-e.Used < 3600 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e.Used = now
	m.Files[abs] = e
	m.dirty = true
}

// known reports whether the memo holds hash sum for the current identity
// of the file at abs.
func (m *memo) known(abs string, id fileID, sum string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.Files[abs]
	if !ok || e.ID != id || e.SHA256 != sum {
		return false
	}
	// Record the use (for the cache listing), at most hourly.
	if now := time.Now().Unix(); now-e.Used >= 3600 {
		e.Used = now
		m.Files[abs] = e
		m.dirty = true
	}
	return true
}

func (m *memo) value(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.Values[key]
	return v.Value, ok
}

func (m *memo) setValue(key, value string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Values[key] = memoValue{Value: value, Used: time.Now().Unix()}
	m.dirty = true
}

// save writes the memo if it changed, atomically, dropping the least
// recently used entries beyond the size limits. Errors are ignored: the
// memo is an optimisation.
func (m *memo) save() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirty {
		return
	}
	pruneLRU(m.Files, memoMaxFiles, func(e memoFile) int64 { return e.Used })
	pruneLRU(m.Values, memoMaxVals, func(e memoValue) int64 { return e.Used })
	data, err := json.Marshal(m)
	if err != nil {
		return
	}
	if atomicfile.WriteFile(m.path, data, 0o600) != nil {
		return
	}
	m.dirty = false
}

func pruneLRU[V any](m map[string]V, max int, used func(V) int64) {
	if len(m) <= max {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(used(m[b]), used(m[a])) })
	for _, k := range keys[max:] {
		delete(m, k)
	}
}

// hashFile returns the SHA-256 and length of the file at path.
func hashFile(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", n, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

var validName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// digestLen is how much of the digest names a cache directory.
const digestLen = 16

// maxBuildAttempts bounds rebuilds when inputs change during a build.
const maxBuildAttempts = 3

// Ensure returns the image recipe r describes, from the cache under
// cacheRoot when a verified copy is there, else by building it.
//
// The cache directory is <cacheRoot>/<name>-<digest>, where the digest
// covers every input by content. A build goes into a temporary directory
// that is renamed into place once complete, so readers never see a partial
// image; concurrent builders of the same image serialise on a lock file and
// the loser uses the winner's result (where locks do not work, both build
// and the last rename wins, which is still a complete image).
//
// Verification on use: every call checks the manifest, that each output is
// a regular file of the recorded size, and that its identity (device,
// inode, size, modification and change times) is the one recorded when its
// SHA-256 was last computed; if the identity changed (the file was
// rewritten, touched or replaced), the file is hashed in full and compared
// with the manifest. A truncated or modified output is therefore never
// returned: the image is rebuilt. What the warm path cannot see is a change
// that leaves the identity intact (bit rot under the filesystem); Verify
// hashes everything for callers who want that.
func Ensure(ctx context.Context, cacheRoot string, r Recipe) (*Image, error) {
	if !validName.MatchString(r.Name()) {
		return nil, fmt.Errorf("image recipe name %q: use lower case letters, digits and dashes", r.Name())
	}
	if a, err := filepath.Abs(cacheRoot); err == nil {
		cacheRoot = a
	}
	if err := os.MkdirAll(cacheRoot, 0o755); err != nil {
		return nil, fmt.Errorf("create image cache %s: %w", cacheRoot, err)
	}
	m := loadMemo(cacheRoot)
	defer m.save()

	for attempt := 0; attempt < maxBuildAttempts; attempt++ {
		in := &Inputs{memo: m}
		if err := r.Inputs(ctx, in); err != nil {
			return nil, fmt.Errorf("image %s: %w", r.Name(), err)
		}
		digest := in.digest(r)
		dir := filepath.Join(cacheRoot, r.Name()+"-"+digest[:digestLen])
		img, err := openImage(dir, r, digest, m)
		if err == nil {
			return img, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("image %s: %w", r.Name(), err)
		}
		img, err = buildLocked(ctx, cacheRoot, dir, digest, r, in, m)
		if errors.Is(err, ErrInputsChanged) {
			continue
		}
		return img, err
	}
	return nil, fmt.Errorf("image %s: %w %d times; wait until they are settled and try again", r.Name(), ErrInputsChanged, maxBuildAttempts)
}

// buildLocked builds the image into dir while holding the recipe's lock.
func buildLocked(ctx context.Context, cacheRoot, dir, digest string, r Recipe, in *Inputs, m *memo) (*Image, error) {
	lock, err := os.OpenFile(filepath.Join(cacheRoot, "."+r.Name()+".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	defer lock.Close()
	if err := lockFile(lock); err != nil {
		return nil, fmt.Errorf("lock image cache: %w", err)
	}
	defer unlockFile(lock)

	// Another process may have built it while we waited.
	if img, err := openImage(dir, r, digest, m); err == nil {
		return img, nil
	}
	// Holding the lock, no other builder of this recipe is running: build
	// directories left by a crashed one can go.
	if locksWork {
		if stale, err := filepath.Glob(filepath.Join(cacheRoot, ".build-"+r.Name()+".*")); err == nil {
			for _, d := range stale {
				os.RemoveAll(d)
			}
		}
	}

	tmp, err := os.MkdirTemp(cacheRoot, ".build-"+r.Name()+".")
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", r.Name(), err)
	}
	defer os.RemoveAll(tmp)
	out, err := r.Build(ctx, in, tmp)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", r.Name(), err)
	}
	// The outputs must come from the inputs the digest names: declare them
	// again (cheap, memoized) and compare.
	again := &Inputs{memo: m}
	if err := r.Inputs(ctx, again); err != nil {
		return nil, fmt.Errorf("image %s: %w", r.Name(), err)
	}
	if again.digest(r) != digest {
		return nil, ErrInputsChanged
	}

	mf := manifest{
		Name: r.Name(), Arch: r.Arch(), Digest: digest, Created: time.Now().UTC().Truncate(time.Second),
		Files: map[string]manifestFile{}, Inputs: in.records,
	}
	for _, o := range []struct{ key, rel string }{{"kernel", out.Kernel}, {"initrd", out.Initrd}} {
		if o.rel == "" || !filepath.IsLocal(o.rel) {
			return nil, fmt.Errorf("build image %s: bad %s output name %q", r.Name(), o.key, o.rel)
		}
		p := filepath.Join(tmp, o.rel)
		if err := syncFile(p); err != nil {
			return nil, fmt.Errorf("build image %s: %w", r.Name(), err)
		}
		sum, n, err := hashFile(p)
		if err != nil {
			return nil, fmt.Errorf("build image %s: %w", r.Name(), err)
		}
		mf.Files[o.key] = manifestFile{Path: filepath.ToSlash(o.rel), SHA256: sum, Size: n}
	}
	data, err := json.MarshalIndent(&mf, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteNew(filepath.Join(tmp, "manifest.json"), data, 0o644); err != nil {
		return nil, fmt.Errorf("build image %s: %w", r.Name(), err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := syncFile(tmp); err != nil {
		return nil, fmt.Errorf("build image %s: %w", r.Name(), err)
	}
	if err := install(tmp, dir); err != nil {
		return nil, fmt.Errorf("install image %s: %w", r.Name(), err)
	}
	syncFile(cacheRoot)
	img, err := openImage(dir, r, digest, m)
	if err != nil {
		return nil, fmt.Errorf("image %s after building it: %w", r.Name(), err)
	}
	return img, nil
}

// install renames the complete build directory tmp to dir, moving a
// previous (corrupt) dir out of the way first.
func install(tmp, dir string) error {
	err := os.Rename(tmp, dir)
	if err == nil {
		return nil
	}
	if _, serr := os.Lstat(dir); serr != nil {
		return err
	}
	trash := tmp + ".old"
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	defer os.RemoveAll(trash)
	return os.Rename(tmp, dir)
}

// openImage checks the cached image in dir as Ensure documents.
func openImage(dir string, r Recipe, digest string, m *memo) (*Image, error) {
	mf, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	if mf.Name != r.Name() || mf.Arch != r.Arch() || mf.Digest != digest {
		return nil, fmt.Errorf("%w: %s: manifest is for %s/%s %s", ErrCorrupt, dir, mf.Name, mf.Arch, mf.Digest)
	}
	img := &Image{Name: mf.Name, Arch: mf.Arch, Digest: mf.Digest, Dir: dir}
	for _, key := range []string{"kernel", "initrd"} {
		f, ok := mf.Files[key]
		if !ok || !filepath.IsLocal(filepath.FromSlash(f.Path)) {
			return nil, fmt.Errorf("%w: %s: manifest lacks a valid %s entry", ErrCorrupt, dir, key)
		}
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := checkFile(p, f, m); err != nil {
			return nil, err
		}
		switch key {
		case "kernel":
			img.Kernel = p
		case "initrd":
			img.Initrd = p
			img.InitrdSize = f.Size
		}
	}
	return img, nil
}

func readManifest(dir string) (*manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var mf manifest
	if err := json.Unmarshal(data, &mf); err != nil {
		return nil, fmt.Errorf("%w: %s: manifest: %v", ErrCorrupt, dir, err)
	}
	return &mf, nil
}

// checkFile verifies one output: size always, full hash when its identity
// is not the one last verified.
func checkFile(p string, f manifestFile, m *memo) error {
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is missing or not a regular file", ErrCorrupt, p)
	}
	id, err := statID(p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if id.Size != f.Size {
		return fmt.Errorf("%w: %s is %d bytes, manifest says %d", ErrCorrupt, p, id.Size, f.Size)
	}
	if m != nil && m.known(p, id, f.SHA256) {
		return nil
	}
	sum, _, err := hashFile(p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if sum != f.SHA256 {
		return fmt.Errorf("%w: %s has SHA-256 %s, manifest says %s", ErrCorrupt, p, sum, f.SHA256)
	}
	if m != nil {
		if id2, err := statID(p); err == nil && id2 == id {
			m.remember(p, id, sum)
		}
	}
	return nil
}

// Verify hashes every file of img in full and compares it with the
// manifest, whatever the memo says. It returns an error wrapping ErrCorrupt
// on any difference.
func Verify(img *Image) error {
	mf, err := readManifest(img.Dir)
	if err != nil {
		return fmt.Errorf("verify image %s: %w", img.Dir, err)
	}
	if mf.Digest != img.Digest {
		return fmt.Errorf("verify image %s: %w: manifest digest %s, image %s", img.Dir, ErrCorrupt, mf.Digest, img.Digest)
	}
	for _, key := range []string{"kernel", "initrd"} {
		f, ok := mf.Files[key]
		if !ok {
			return fmt.Errorf("verify image %s: %w: no %s", img.Dir, ErrCorrupt, key)
		}
		if err := checkFile(filepath.Join(img.Dir, filepath.FromSlash(f.Path)), f, nil); err != nil {
			return fmt.Errorf("verify image %s: %w", img.Dir, err)
		}
	}
	return nil
}

func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		// Some filesystems refuse fsync on directories; that is not fatal.
		if fi, serr := f.Stat(); serr == nil && fi.IsDir() {
			return nil
		}
		return fmt.Errorf("sync %s: %w", p, err)
	}
	return nil
}

// labelList joins names for a Param value.
func labelList(names []string) string { return strings.Join(names, ",") }

// hexSum returns the hex SHA-256 of s.
func hexSum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
