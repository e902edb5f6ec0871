//go:build unix

package overlay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// BaselineMode is how a baseline recorded the workspace.
type BaselineMode string

// Baseline modes. See docs/overlay.md for what each can recover.
const (
	// BaselineClone is a copy-on-write clone of the whole workspace
	// (clonefile on APFS, FICLONE per file on Linux): every old content is
	// recoverable.
	BaselineClone BaselineMode = "clone"
	// BaselineManifest records size, times, inode and mode of every entry,
	// symlink targets, and the git blob id of every tracked file that was
	// clean: an old content is recoverable when the file is unchanged on the
	// host or was clean in git.
	BaselineManifest BaselineMode = "manifest"
)

// ErrNoBaseline means a session folder has no usable baseline.
var ErrNoBaseline = errors.New("no baseline")

// BaselineOptions tunes TakeBaseline.
type BaselineOptions struct {
	// Mode forces a mode; "" tries a clone and falls back to a manifest.
	Mode BaselineMode
	// Logger gets progress lines; nil is silent.
	Logger *slog.Logger
}

type baselineMeta struct {
	Version   int          `json:"version"`
	Workspace string       `json:"workspace"`
	Mode      BaselineMode `json:"mode"`
	Created   time.Time    `json:"created"`
	Git       bool         `json:"git,omitempty"`
	Files     int          `json:"files"`
	// Head is the commit the workspace's repository had checked out
	// (apply --branch builds on it); Repo says there was a repository.
	Head string `json:"head,omitempty"`
	Repo bool   `json:"repo,omitempty"`
}

type manifestEntry struct {
	Path   string   `json:"p"`
	Type   FileType `json:"t"`
	Mode   uint32   `json:"m"`
	Size   int64    `json:"s,omitempty"`
	Mtime  int64    `json:"mt,omitempty"`
	Ctime  int64    `json:"ct,omitempty"`
	Ino    uint64   `json:"i,omitempty"`
	Target string   `json:"l,omitempty"`
	Blob   string   `json:"b,omitempty"` // git blob id, tracked and clean files
}

// Baseline is the workspace as it was when the session started: what the
// agent's read-only lower layer showed. It implements OldTree.
type Baseline struct {
	dir  string
	meta baselineMeta

	once     sync.Once
	loadErr  error
	manifest map[string]*manifestEntry

	mu       sync.Mutex
	wsRoot   *hostRoot // opened on first use
	treeRoot *hostRoot
}

// root opens (once) the workspace or, with tree, the clone.
func (b *Baseline) root(tree bool) (*hostRoot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	slot, path := &b.wsRoot, b.meta.Workspace
	if tree {
		slot, path = &b.treeRoot, filepath.Join(b.dir, "tree")
	}
	if *slot == nil {
		r, err := openHostRoot(path)
		if err != nil {
			if tree {
				return nil, fmt.Errorf("%w: %v", ErrNoBaseline, err)
			}
			return nil, err
		}
		*slot = r
	}
	return *slot, nil
}

// Close releases the directories the baseline holds open.
func (b *Baseline) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	for _, r := range []**hostRoot{&b.wsRoot, &b.treeRoot} {
		if *r != nil {
			errs = append(errs, (*r).Close())
			*r = nil
		}
	}
	return errors.Join(errs...)
}

// Mode says how the baseline was recorded.
func (b *Baseline) Mode() BaselineMode { return b.meta.Mode }

// Workspace is the absolute path the baseline was taken of.
func (b *Baseline) Workspace() string { return b.meta.Workspace }

// skipDir reports directories a baseline does not descend into: git's own
// store (protected from apply anyway).
func skipDir(name string) bool { return name == ".git" }

// TakeBaseline records workspace (an absolute path) into dir, which must not
// exist yet. It tries a copy-on-write clone and falls back to a manifest when
// the file system (or the pair of file systems) cannot clone.
func TakeBaseline(ctx context.Context, workspace, dir string, opts BaselineOptions) (*Baseline, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ws, err := filepath.Abs(workspace)
	if err != nil {
		return nil, fmt.Errorf("baseline of %s: %w", workspace, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("baseline of %s: %w", ws, err)
	}
	start := time.Now()
	meta := baselineMeta{Version: 1, Workspace: ws, Created: start.UTC()}
	meta.Repo, meta.Head = headCommit(ctx, ws)
	if opts.Mode != BaselineManifest {
		n, err := cloneTree(ctx, ws, filepath.Join(dir, "tree"))
		switch {
		case err == nil:
			meta.Mode, meta.Files = BaselineClone, n
		case errors.Is(err, errCloneUnsupported) && opts.Mode == "":
			log.Debug("copy-on-write clone unavailable, using a manifest", "err", err)
			if err := os.RemoveAll(filepath.Join(dir, "tree")); err != nil {
				return nil, fmt.Errorf("baseline of %s: %w", ws, err)
			}
		default:
			return nil, fmt.Errorf("baseline of %s: clone: %w", ws, err)
		}
	}
	if meta.Mode == "" {
		meta.Mode = BaselineManifest
		n, git, err := writeManifest(ctx, ws, filepath.Join(dir, "manifest.jsonl"))
		if err != nil {
			return nil, fmt.Errorf("baseline of %s: %w", ws, err)
		}
		meta.Files, meta.Git = n, git
	}
	data, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), append(data, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("baseline of %s: %w", ws, err)
	}
	log.Info("baseline taken", "mode", meta.Mode, "files", meta.Files, "git", meta.Git, "took", time.Since(start).Round(time.Millisecond))
	return &Baseline{dir: dir, meta: meta}, nil
}

// OpenBaseline opens a baseline TakeBaseline wrote.
func OpenBaseline(dir string) (*Baseline, error) {
	data, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, fmt.Errorf("%w in %s: %v", ErrNoBaseline, dir, err)
	}
	var meta baselineMeta
	if err := json.Unmarshal(data, &meta); err != nil || meta.Version != 1 {
		return nil, fmt.Errorf("%w in %s: unreadable meta.json", ErrNoBaseline, dir)
	}
	if meta.Mode != BaselineClone && meta.Mode != BaselineManifest {
		return nil, fmt.Errorf("%w in %s: unknown mode %q", ErrNoBaseline, dir, meta.Mode)
	}
	return &Baseline{dir: dir, meta: meta}, nil
}

// walkHost lists every entry under the workspace (skipping .git stores)
// without following symlinks, calling fn with the slash path and entry.
func walkHost(ctx context.Context, root *hostRoot, fn func(rel string, e hostEntry) error) error {
	var walk func(rel string, dfd int) error
	walk = func(rel string, dfd int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		f := os.NewFile(uintptr(dfd), rel)
		defer f.Close()
		names, err := f.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("list %s: %w", DisplayPath(rel), err)
		}
		for _, name := range names {
			p := join(rel, name)
			e, err := fstatatEntry(dfd, name, p)
			if err != nil {
				return err
			}
			if e.Type == "" {
				continue // vanished
			}
			if err := fn(p, e); err != nil {
				return err
			}
			if e.Type == TypeDir && !skipDir(name) {
				cfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					return fmt.Errorf("open %s: %w", DisplayPath(p), err)
				}
				if err := walk(p, cfd); err != nil {
					return err
				}
			}
		}
		return nil
	}
	fd, err := unix.Dup(root.fd)
	if err != nil {
		return err
	}
	return walk("", fd)
}

// writeManifest records every entry of ws, with git blob ids of tracked
// clean files, into path (JSON lines). It returns the number of entries and
// whether git data was used.
func writeManifest(ctx context.Context, ws, path string) (int, bool, error) {
	blobs := gitCleanBlobs(ctx, ws)
	root, err := openHostRoot(ws)
	if err != nil {
		return 0, false, err
	}
	defer root.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, false, fmt.Errorf("write manifest: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w)
	n := 0
	err = walkHost(ctx, root, func(rel string, e hostEntry) error {
		m := manifestEntry{Path: rel, Type: e.Type, Mode: e.Mode, Target: e.Target}
		if e.Type == TypeFile {
			m.Size, m.Mtime, m.Ctime, m.Ino = e.Size, e.Mtime, e.Ctime, e.Ino
			m.Blob = blobs[rel]
		}
		n++
		return enc.Encode(&m)
	})
	if err != nil {
		return 0, false, err
	}
	if err := w.Flush(); err != nil {
		return 0, false, fmt.Errorf("write manifest: %w", err)
	}
	return n, blobs != nil, f.Close()
}

// gitCmd runs git on ws's repository: its index, objects and work tree,
// none of its config (hostgit.go), and returns git's stdout.
func gitCmd(ctx context.Context, ws string, args ...string) ([]byte, error) {
	return repoGit(ctx, ws, args...)
}

// gitCleanBlobs maps the workspace-relative path of every tracked regular
// file or symlink whose work tree copy matches the index to its blob id; nil
// when ws is not in a git work tree or git is missing.
func gitCleanBlobs(ctx context.Context, ws string) map[string]string {
	if _, err := exec.LookPath("git"); err != nil {
		return nil
	}
	if real, err := filepath.EvalSymlinks(ws); err == nil {
		// A sparse index of many GiB claiming millions of entries: git
		// would parse them all into memory.
		if r, ok := findGitRepo(real); ok {
			if fi, err := os.Stat(filepath.Join(r.gitDir, "index")); err == nil && mostlyHoles(fi) {
				return nil
			}
		}
	}
	out, err := gitCmd(ctx, ws, "ls-files", "-s", "-z")
	if err != nil {
		return nil
	}
	blobs := make(map[string]string)
	for rec := range bytes.SplitSeq(out, []byte{0}) {
		// "<mode> <id> <stage>\t<path>"
		meta, p, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			continue
		}
		f := strings.Fields(string(meta))
		if len(f) != 3 || f[2] != "0" || (f[0] != "100644" && f[0] != "100755") || !validBlobID(f[1]) {
			continue
		}
		blobs[string(p)] = f[1]
	}
	if !plainAttributes(ws, out) {
		return nil
	}
	dirty, err := gitCmd(ctx, ws, "diff-files", "--name-only", "-z", "--relative")
	if err != nil {
		return nil
	}
	for p := range bytes.SplitSeq(dirty, []byte{0}) {
		delete(blobs, string(p))
	}
	return blobs
}

// plainAttributes reports whether no folder on the way of a file git
// lists (lsFiles: `git ls-files -s -z` run in ws), from the repository's
// top down, holds a .gitattributes that is a FIFO or a device: diff-files
// hashes a racily clean file again and reads the attributes on its way
// first, and would wait on a FIFO until its deadline (a symlink there git
// does not follow).
func plainAttributes(ws string, lsFiles []byte) bool {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return false
	}
	r, ok := findGitRepo(real)
	if !ok {
		return false
	}
	seen := map[string]bool{}
	check := func(dir string) bool {
		for !seen[dir] {
			seen[dir] = true
			if fi, err := os.Lstat(filepath.Join(dir, ".gitattributes")); err == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
				return false
			}
			if dir == r.top || dir == filepath.Dir(dir) {
				break
			}
			dir = filepath.Dir(dir)
		}
		return true
	}
	if !check(real) {
		return false
	}
	for rec := range bytes.SplitSeq(lsFiles, []byte{0}) {
		if _, p, ok := bytes.Cut(rec, []byte{'\t'}); ok && !check(filepath.Dir(filepath.Join(real, filepath.FromSlash(string(p))))) {
			return false
		}
	}
	return true
}

func (b *Baseline) loadManifest() error {
	b.once.Do(func() {
		f, err := os.Open(filepath.Join(b.dir, "manifest.jsonl"))
		if err != nil {
			b.loadErr = fmt.Errorf("%w: %v", ErrNoBaseline, err)
			return
		}
		defer f.Close()
		b.manifest = make(map[string]*manifestEntry)
		dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
		for {
			var m manifestEntry
			if err := dec.Decode(&m); err != nil {
				if err.Error() != "EOF" {
					b.loadErr = fmt.Errorf("%w: manifest: %v", ErrNoBaseline, err)
				}
				return
			}
			b.manifest[m.Path] = &m
		}
	})
	return b.loadErr
}

// inSkipped reports whether p lies in a directory baselines skip.
func inSkipped(p string) bool {
	for c := range strings.SplitSeq(p, "/") {
		if skipDir(c) {
			return true
		}
	}
	return false
}

// Old implements OldTree.
func (b *Baseline) Old(p string) (OldEntry, error) {
	if err := ValidatePath(p); err != nil {
		return OldEntry{}, err
	}
	if inSkipped(p) {
		return b.current(p)
	}
	if b.meta.Mode == BaselineClone {
		tree, err := b.root(true)
		if err != nil {
			return OldEntry{}, err
		}
		return readEntry(tree, p)
	}
	if err := b.loadManifest(); err != nil {
		return OldEntry{}, err
	}
	m := b.manifest[p]
	if m == nil {
		return OldEntry{}, nil
	}
	switch m.Type {
	case TypeSymlink:
		return OldEntry{Type: TypeSymlink, Mode: m.Mode, Target: m.Target}, nil
	case TypeDir, TypeSpecial:
		return OldEntry{Type: m.Type, Mode: m.Mode}, nil
	}
	// A regular file: the host copy if it is untouched, else the git blob.
	root, err := b.root(false)
	if err != nil {
		return OldEntry{}, err
	}
	cur, data, err := root.get(p)
	if err != nil && !errors.Is(err, ErrSymlinkInPath) {
		return OldEntry{}, err
	}
	if err == nil && cur.Type == TypeFile && cur.Size == m.Size && cur.Mtime == m.Mtime && cur.Ctime == m.Ctime && cur.Ino == m.Ino &&
		(m.Blob == "" || blobID(data) == m.Blob) {
		return OldEntry{Type: TypeFile, Mode: m.Mode, Content: data}, nil
	}
	if m.Blob != "" {
		if data, err := gitCmd(context.Background(), b.meta.Workspace, "cat-file", "blob", m.Blob); err == nil && blobID(data) == m.Blob {
			return OldEntry{Type: TypeFile, Mode: m.Mode, Content: data}, nil
		}
	}
	return b.current(p)
}

// OldSize is the size of the regular file p at session start, without
// reading it (ok false when p was no regular file or is not known so).
func (b *Baseline) OldSize(p string) (int64, bool) {
	if ValidatePath(p) != nil {
		return 0, false
	}
	if b.meta.Mode == BaselineClone || inSkipped(p) {
		root, err := b.root(b.meta.Mode == BaselineClone && !inSkipped(p))
		if err != nil {
			return 0, false
		}
		e, err := root.lstat(p)
		return e.Size, err == nil && e.Type == TypeFile
	}
	if b.loadManifest() != nil {
		return 0, false
	}
	m := b.manifest[p]
	return m.sizeIfFile()
}

func (m *manifestEntry) sizeIfFile() (int64, bool) {
	if m == nil || m.Type != TypeFile {
		return 0, false
	}
	return m.Size, true
}

// Current implements CurrentTree: the host's entry at p now.
func (b *Baseline) Current(p string) (OldEntry, error) {
	if err := ValidatePath(p); err != nil {
		return OldEntry{}, err
	}
	root, err := b.root(false)
	if err != nil {
		return OldEntry{}, err
	}
	return readEntry(root, p)
}

// current is the host's entry at p, marked Unknown.
func (b *Baseline) current(p string) (OldEntry, error) {
	root, err := b.root(false)
	if err != nil {
		return OldEntry{}, err
	}
	e, err := readEntry(root, p)
	if errors.Is(err, ErrSymlinkInPath) {
		return OldEntry{Unknown: true, UnknownWhy: whyStartLost}, nil
	}
	e.Unknown, e.UnknownWhy = true, whyStartLost
	return e, err
}

// readEntry reads p from a tree without following symlinks.
func readEntry(root *hostRoot, p string) (OldEntry, error) {
	e, data, err := root.get(p)
	if errors.Is(err, ErrSymlinkInPath) {
		return OldEntry{}, nil // not reachable without a symlink: not there
	}
	if err != nil {
		return OldEntry{}, err
	}
	return OldEntry{Type: e.Type, Mode: e.Mode, Target: e.Target, Content: data}, nil
}

var errCloneUnsupported = errors.New("copy-on-write clone not supported here")

func isCloneUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EXDEV) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.ENOSYS) || errors.Is(err, fs.ErrPermission)
}
