// Package rootfs turns a resolved, downloaded Alpine package set into the
// guest's root file system image: one read-only ext4 file, the same bytes
// for the same lock, that every session mounts as the lower layer of its
// root.
//
// Packages are verified again and extracted (image/alpine) into a tree held
// in memory, their file contents spooled to one unlinked temporary file;
// paths are resolved inside the tree, never on the host. What Alpine's
// install scripts would have done that matters is done here instead (see
// Result.Setup and docs/image.md); no package code runs on the host.
package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/ext4"
)

// DefaultLabel is the volume label the guest finds its root image by.
const DefaultLabel = "vibedom-root"

// Agent is the unprivileged user commands run as in the guest.
const (
	AgentUser = "agent"
	AgentUID  = 1000
	AgentHome = "/home/agent"
)

// Options says what to build.
type Options struct {
	Arch  string // alpine arch: "x86_64" | "aarch64"
	Lock  *alpine.Lock
	Files []string // verified cached .apk paths, in Lock.Packages order
	// Keys verifies the packages again; nil means Alpine's release keys.
	Keys *alpine.Keyring
	// Exclude names packages left out of the root (the boot set).
	Exclude []string
	// Out is the image to create; it must not exist.
	Out   string
	Label string // "" means DefaultLabel
	// Progress, when set, is called after each package.
	Progress func(done, total int)
}

// Result describes a built image.
type Result struct {
	SHA256 string
	Size   int64
	Stats  ext4.Stats
	// Setup lists what was done in place of install scripts.
	Setup []string
	// Libc is the image's C library: "musl" (Alpine) or "glibc" (the
	// Debian-sourced test userland), from its dynamic loader; agents are
	// fetched for it.
	Libc string
}

// ErrConflict means two packages disagree about a path.
var ErrConflict = errors.New("packages conflict")

// ErrUnsafe means a package entry would leave the image or loops.
var ErrUnsafe = errors.New("unsafe path in package")

// Build builds the root image described by o.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Lock == nil || len(o.Files) != len(o.Lock.Packages) {
		return nil, fmt.Errorf("rootfs: the lock and the package files do not match")
	}
	if o.Label == "" {
		o.Label = DefaultLabel
	}
	if _, err := os.Lstat(o.Out); err == nil {
		return nil, fmt.Errorf("rootfs: %s already exists", o.Out)
	}
	dir := filepath.Dir(o.Out)
	spool, err := os.CreateTemp(dir, ".rootfs-spool-*")
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	defer spool.Close()
	// Unlinked at once: nothing is left behind whatever happens.
	os.Remove(spool.Name())

	t := newTree(spool)
	order := packageOrder(o.Lock, o.Exclude)
	for i, idx := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p := o.Lock.Packages[idx]
		pw := &pkgWriter{t: t, pkg: p}
		if err := alpine.Extract(o.Files[idx], o.Arch, p, o.Keys, pw); err != nil {
			return nil, err
		}
		t.installed = append(t.installed, pw.record())
		if o.Progress != nil {
			o.Progress(i+1, len(order))
		}
	}
	if err := t.setup(o.Lock, o.Exclude); err != nil {
		return nil, err
	}

	sum := sha256.Sum256(append(o.Lock.Marshal(), []byte(strings.Join(o.Exclude, ","))...))
	var uuid [16]byte
	copy(uuid[:], sum[:16])
	uuid[6] = uuid[6]&0x0f | 0x40 // a well-formed (version 4) UUID
	uuid[8] = uuid[8]&0x3f | 0x80

	tmp, err := atomicfile.New(o.Out, 0o444)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	defer tmp.Abort()
	st, err := ext4.Write(tmp.File, t.root, ext4.Options{Label: o.Label, UUID: uuid, Time: t.newest})
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	h := sha256.New()
	if _, err := io.Copy(h, tmp); err != nil {
		return nil, fmt.Errorf("rootfs: hash the image: %w", err)
	}
	if err := tmp.Commit(); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	return &Result{SHA256: hex.EncodeToString(h.Sum(nil)), Size: st.Size, Stats: st, Setup: t.done, Libc: t.libc()}, nil
}

// libc names the C library whose dynamic loader the image holds.
func (t *tree) libc() string {
	for _, dir := range []string{"lib", "lib64", "usr/lib", "usr/lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"} {
		d, err := t.resolveDir(dir, false, ext4.Meta{})
		if err != nil {
			continue
		}
		for _, e := range d.Entries {
			switch {
			case strings.HasPrefix(e.Name, "ld-musl-"):
				return "musl"
			case strings.HasPrefix(e.Name, "ld-linux"):
				return "glibc"
			}
		}
	}
	return ""
}

// packageOrder is the extraction order: the base layout first (it makes
// the top-level directories and links others install through), then the
// rest by name; excluded packages are left out.
func packageOrder(l *alpine.Lock, exclude []string) []int {
	var first, rest []int
	for i, p := range l.Packages {
		if slices.Contains(exclude, p.Name) {
			continue
		}
		if strings.HasPrefix(p.Name, "alpine-baselayout") {
			first = append(first, i)
		} else {
			rest = append(rest, i)
		}
	}
	byName := func(s []int) {
		sort.SliceStable(s, func(a, b int) bool { return l.Packages[s[a]].Name < l.Packages[s[b]].Name })
	}
	byName(first)
	byName(rest)
	return append(first, rest...)
}

// tree is the image being assembled.
type tree struct {
	root   *ext4.Node
	spool  *os.File
	off    int64
	owner  map[*ext4.Node]string // which package made a node
	sums   map[*ext4.Node][32]byte
	newest time.Time
	done   []string
	// installed is apk's database, one record per package.
	installed []string
}

func newTree(spool *os.File) *tree {
	return &tree{
		root:  &ext4.Node{Type: ext4.TypeDir, Meta: ext4.Meta{Mode: 0o755}},
		spool: spool, owner: map[*ext4.Node]string{}, sums: map[*ext4.Node][32]byte{},
	}
}

// maxHops bounds symlink resolution, as the kernel does.
const maxHops = 40

// child returns the entry name of dir, or nil.
func child(dir *ext4.Node, name string) *ext4.Node {
	for _, e := range dir.Entries {
		if e.Name == name {
			return e.Node
		}
	}
	return nil
}

func setChild(dir *ext4.Node, name string, n *ext4.Node) {
	for i, e := range dir.Entries {
		if e.Name == name {
			dir.Entries[i].Node = n
			return
		}
	}
	dir.Entries = append(dir.Entries, ext4.Dirent{Name: name, Node: n})
}

// resolveDir walks p (a clean relative path) from the root, following
// every symlink inside the image (absolute targets start at the image
// root; ".." stops at the root, as in the guest) and, with create, making
// missing directories. It returns the directory p names.
func (t *tree) resolveDir(p string, create bool, meta ext4.Meta) (*ext4.Node, error) {
	comps := splitPath(p)
	stack := []*ext4.Node{t.root}
	hops := 0
	for len(comps) > 0 {
		c := comps[0]
		comps = comps[1:]
		cur := stack[len(stack)-1]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
			continue
		}
		n := child(cur, c)
		if n == nil {
			if !create {
				return nil, fs.ErrNotExist
			}
			n = &ext4.Node{Type: ext4.TypeDir, Meta: meta}
			setChild(cur, c, n)
		}
		switch n.Type {
		case ext4.TypeDir:
			stack = append(stack, n)
		case ext4.TypeSymlink:
			hops++
			if hops > maxHops {
				return nil, fmt.Errorf("%w: %s: more than %d symbolic links", ErrUnsafe, p, maxHops)
			}
			tc := splitPath(n.Target)
			if strings.HasPrefix(n.Target, "/") {
				stack = stack[:1]
			}
			comps = append(tc, comps...)
		default:
			return nil, fmt.Errorf("%w: %s: a path component is not a directory", ErrConflict, p)
		}
	}
	return stack[len(stack)-1], nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// lookup resolves p, following symlinks in every component including the
// last; nil when it does not exist.
func (t *tree) lookup(p string) *ext4.Node {
	dir, base := path.Split(path.Clean("/" + p))
	for hops := 0; hops <= maxHops; hops++ {
		d, err := t.resolveDir(strings.TrimPrefix(dir, "/"), false, ext4.Meta{})
		if err != nil || base == "" {
			if err == nil {
				return d
			}
			return nil
		}
		n := child(d, base)
		if n == nil || n.Type != ext4.TypeSymlink {
			return n
		}
		target := n.Target
		if !strings.HasPrefix(target, "/") {
			target = path.Join(dir, target)
		}
		dir, base = path.Split(path.Clean("/" + target))
	}
	return nil
}

// addFile spools content and returns a file node for it.
func (t *tree) addFile(meta ext4.Meta, size int64, r io.Reader) (*ext4.Node, error) {
	h := sha256.New()
	off := t.off
	n, err := io.Copy(io.MultiWriter(io.NewOffsetWriter(t.spool, off), h), r)
	if err != nil {
		return nil, fmt.Errorf("rootfs: spool: %w", err)
	}
	if n != size {
		return nil, fmt.Errorf("rootfs: %d bytes of content, size %d", n, size)
	}
	t.off += n
	spool := t.spool
	node := &ext4.Node{Type: ext4.TypeFile, Meta: meta, Size: size, Open: func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(spool, off, size)), nil
	}}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	t.sums[node] = s
	return node, nil
}

// content reads a file node's content back (small files only).
func (t *tree) content(n *ext4.Node, max int64) ([]byte, error) {
	if n == nil || n.Type != ext4.TypeFile {
		return nil, fs.ErrNotExist
	}
	if n.Size > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	rc, err := n.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// pkgWriter extracts one package into the tree.
type pkgWriter struct {
	t     *tree
	pkg   alpine.LockedPackage
	files []string // for apk's database: "F:dir" and "R:file" lines
}

func (w *pkgWriter) WriteEntry(e alpine.Entry, r io.Reader) error {
	t := w.t
	if e.ModTime.After(t.newest) {
		t.newest = e.ModTime.UTC().Truncate(time.Second)
	}
	meta := ext4.Meta{Mode: e.Mode, UID: uint32(e.UID), GID: uint32(e.GID), ModTime: e.ModTime, Xattrs: e.Xattrs}
	dirMeta := ext4.Meta{Mode: 0o755, ModTime: e.ModTime}
	parentPath, name := path.Split(e.Path)
	parent, err := t.resolveDir(parentPath, true, dirMeta)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", w.pkg, e.Path, err)
	}
	if name == "" {
		return nil
	}
	old := child(parent, name)
	conflict := func(what string) error {
		return fmt.Errorf("%w: %s and %s both install %s (%s)", ErrConflict, t.owner[old], w.pkg, e.Path, what)
	}
	switch e.Type {
	case alpine.TypeDir:
		w.files = append(w.files, "F:"+e.Path)
		if old == nil {
			n := &ext4.Node{Type: ext4.TypeDir, Meta: meta}
			t.owner[n] = w.pkg.String()
			setChild(parent, name, n)
			return nil
		}
		if old.Type == ext4.TypeDir {
			return nil // the first package's metadata stays
		}
		if old.Type == ext4.TypeSymlink {
			if d, err := t.resolveDir(e.Path, false, dirMeta); err == nil && d != nil {
				return nil // a directory installed through a link to one
			}
		}
		return conflict("a directory over something else")
	case alpine.TypeFile:
		w.files = append(w.files, "R:"+e.Path)
		n, err := t.addFile(meta, e.Size, r)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", w.pkg, e.Path, err)
		}
		if old != nil {
			if old.Type == ext4.TypeFile && t.sums[old] == t.sums[n] && old.Size == n.Size {
				return nil // identical content: fine, as apk allows
			}
			return conflict("different content")
		}
		t.owner[n] = w.pkg.String()
		setChild(parent, name, n)
	case alpine.TypeSymlink:
		w.files = append(w.files, "R:"+e.Path)
		if old != nil {
			if old.Type == ext4.TypeSymlink && old.Target == e.Linkname {
				return nil
			}
			return conflict("a symbolic link over something else")
		}
		n := &ext4.Node{Type: ext4.TypeSymlink, Target: e.Linkname, Meta: ext4.Meta{Mode: 0o777, UID: uint32(e.UID), GID: uint32(e.GID), ModTime: e.ModTime}}
		t.owner[n] = w.pkg.String()
		setChild(parent, name, n)
	case alpine.TypeHardlink:
		w.files = append(w.files, "R:"+e.Path)
		tp, tn := path.Split(e.Linkname)
		td, err := t.resolveDir(tp, false, dirMeta)
		if err != nil {
			return fmt.Errorf("%s: %s: hard link to %s: %w", w.pkg, e.Path, e.Linkname, err)
		}
		target := child(td, tn)
		if target == nil || target.Type != ext4.TypeFile {
			return fmt.Errorf("%w: %s: %s: hard link to %s, which is not a file", ErrUnsafe, w.pkg, e.Path, e.Linkname)
		}
		if old != nil {
			if old == target {
				return nil
			}
			return conflict("a hard link over something else")
		}
		setChild(parent, name, target)
	default:
		return fmt.Errorf("%w: %s: %s: unsupported entry type", ErrUnsafe, w.pkg, e.Path)
	}
	return nil
}

// record is the package's entry in apk's installed database.
func (w *pkgWriter) record() string {
	var b strings.Builder
	fmt.Fprintf(&b, "C:%s\nP:%s\nV:%s\nA:%s\nS:%d\n", w.pkg.Checksum, w.pkg.Name, w.pkg.Version, w.pkg.Arch, w.pkg.Size)
	// apk lists each directory once, followed by its files by base name.
	var curDir string
	for _, f := range w.files {
		kind, p := f[:2], f[2:]
		if kind == "F:" {
			curDir = p
			b.WriteString("F:" + p + "\n")
			continue
		}
		d, base := path.Split(p)
		d = strings.TrimSuffix(d, "/")
		if d != curDir {
			curDir = d
			b.WriteString("F:" + d + "\n")
		}
		b.WriteString("R:" + base + "\n")
	}
	b.WriteString("\n")
	return b.String()
}
