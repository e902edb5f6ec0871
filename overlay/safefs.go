//go:build unix

package overlay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrSymlinkInPath means a path on the host goes through a symlink (or a
// non-directory) where a directory was expected. Apply never writes through
// a symlink.
var ErrSymlinkInPath = errors.New("path goes through a symlink on the host")

// hostRoot performs file operations on a workspace relative to its directory
// file descriptor. Every parent is resolved afresh for each operation with
// no symlink allowed in any component (openat2 RESOLVE_NO_SYMLINKS on Linux,
// an O_NOFOLLOW walk elsewhere), and the last component is acted on with
// *at calls that do not follow it either. A directory swapped for a symlink
// at any time before the operation is refused.
type hostRoot struct {
	fd   int
	path string
}

func openHostRoot(path string) (*hostRoot, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", path, err)
	}
	return &hostRoot{fd: fd, path: path}, nil
}

func (r *hostRoot) Close() error { return unix.Close(r.fd) }

// splitParent splits rel into its parent directory and last component.
func splitParent(rel string) (string, string) {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i], rel[i+1:]
	}
	return "", rel
}

// forceWalk makes openDir use the portable walk even where openat2 works
// (tests cover both).
var forceWalk = false

// openDir returns a descriptor of the directory rel ("" is the root). With
// create, missing directories are made (0755) and returned in created, in
// order. A symlink or non-directory anywhere is ErrSymlinkInPath.
func (r *hostRoot) openDir(rel string, create bool) (fd int, created []string, err error) {
	if rel == "" {
		// A new open file description, not a dup: a dup shares the
		// directory's read offset, and a second listing would come back
		// empty.
		fd, err := unix.Openat(r.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, nil, fmt.Errorf("open workspace: %w", err)
		}
		return fd, nil, nil
	}
	if !forceWalk {
		fd, err := openBeneath(r.fd, rel)
		switch {
		case err == nil:
			return fd, nil, nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTDIR):
			return -1, nil, fmt.Errorf("%s: %w", DisplayPath(rel), ErrSymlinkInPath)
		case errors.Is(err, unix.ENOENT) && !create:
			return -1, nil, fmt.Errorf("%s: %w", DisplayPath(rel), os.ErrNotExist)
		case errors.Is(err, unix.ENOENT), errors.Is(err, errNoOpenat2):
			// Walk, creating what is missing.
		default:
			return -1, nil, fmt.Errorf("open %s: %w", DisplayPath(rel), err)
		}
	}
	cur, err := unix.Dup(r.fd)
	if err != nil {
		return -1, nil, fmt.Errorf("open workspace: %w", err)
	}
	done := ""
	for comp := range strings.SplitSeq(rel, "/") {
		done = join(done, comp)
		next, err := unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(cur, comp, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				if err == nil {
					created = append(created, done)
				}
				next, err = unix.Openat(cur, comp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(cur)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, created, fmt.Errorf("%s: %w", DisplayPath(done), ErrSymlinkInPath)
			}
			if errors.Is(err, unix.ENOENT) {
				return -1, created, fmt.Errorf("%s: %w", DisplayPath(done), os.ErrNotExist)
			}
			return -1, created, fmt.Errorf("open %s: %w", DisplayPath(done), err)
		}
		cur = next
	}
	return cur, created, nil
}

// hostEntry is what is at a path on the host.
type hostEntry struct {
	Type   FileType // "" when absent
	Mode   uint32   // permission bits
	Size   int64
	Target string
	Ino    uint64
	Dev    uint64
	Mtime  int64 // ns
	Ctime  int64 // ns
}

// lstat describes rel without following it. A missing parent is an absent
// entry; a symlink among the parents is ErrSymlinkInPath.
func (r *hostRoot) lstat(rel string) (hostEntry, error) {
	dir, base := splitParent(rel)
	fd, _, err := r.openDir(dir, false)
	if errors.Is(err, os.ErrNotExist) {
		return hostEntry{}, nil
	}
	if err != nil {
		return hostEntry{}, err
	}
	defer unix.Close(fd)
	return fstatatEntry(fd, base, rel)
}

func fstatatEntry(dirfd int, base, rel string) (hostEntry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return hostEntry{}, nil
		}
		return hostEntry{}, fmt.Errorf("stat %s: %w", DisplayPath(rel), err)
	}
	e := hostEntry{Mode: uint32(st.Mode) & 0o7777, Size: st.Size, Ino: uint64(st.Ino), Dev: uint64(st.Dev),
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = TypeFile
	case unix.S_IFDIR:
		e.Type = TypeDir
	case unix.S_IFLNK:
		e.Type = TypeSymlink
		buf := make([]byte, MaxTargetLen+1)
		n, err := unix.Readlinkat(dirfd, base, buf)
		if err != nil {
			return hostEntry{}, fmt.Errorf("read symlink %s: %w", DisplayPath(rel), err)
		}
		e.Target = string(buf[:n])
	default:
		e.Type = TypeSpecial
	}
	return e, nil
}

// get describes rel and, for a regular file, reads it, resolving the
// parent once. A missing parent is an absent entry.
func (r *hostRoot) get(rel string) (hostEntry, []byte, error) {
	dir, base := splitParent(rel)
	dfd, _, err := r.openDir(dir, false)
	if errors.Is(err, os.ErrNotExist) {
		return hostEntry{}, nil, nil
	}
	if err != nil {
		return hostEntry{}, nil, err
	}
	defer unix.Close(dfd)
	e, err := fstatatEntry(dfd, base, rel)
	if err != nil || e.Type != TypeFile {
		return e, nil, err
	}
	data, err := readFileAt(dfd, base, rel, -1)
	return e, data, err
}

// ReadWorkspaceFile reads the regular file rel (slash-separated, relative
// to workspace) without following a symlink in any component of its path
// and without opening anything but a regular file (a FIFO would block). A
// file larger than limit bytes is refused.
func ReadWorkspaceFile(workspace, rel string, limit int64) ([]byte, error) {
	if err := ValidatePath(rel); err != nil {
		return nil, err
	}
	r, err := openHostRoot(workspace)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	dir, base := splitParent(rel)
	dfd, _, err := r.openDir(dir, false)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return readFileAt(dfd, base, rel, limit)
}

// readFile reads the regular file rel (never through a symlink).
func (r *hostRoot) readFile(rel string) ([]byte, error) {
	dir, base := splitParent(rel)
	dfd, _, err := r.openDir(dir, false)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return readFileAt(dfd, base, rel, -1)
}

// readFileAt reads the regular file base in dfd; limit >= 0 refuses a file
// larger than limit bytes.
func readFileAt(dfd int, base, rel string, limit int64) ([]byte, error) {
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s: %w", DisplayPath(rel), ErrSymlinkInPath)
		}
		return nil, fmt.Errorf("read %s: %w", DisplayPath(rel), err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", DisplayPath(rel), err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s: not a regular file", DisplayPath(rel))
	}
	if limit >= 0 && fi.Size() > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes", DisplayPath(rel), limit)
	}
	data := make([]byte, 0, fi.Size()+1)
	for {
		n, err := f.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", DisplayPath(rel), err)
		}
		if limit >= 0 && int64(len(data)) > limit {
			return nil, fmt.Errorf("read %s: larger than %d bytes", DisplayPath(rel), limit)
		}
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", DisplayPath(rel), err)
	}
	return data, nil
}

// stageFail makes stageFile fail for that path (tests).
var stageFail string

// tempPrefix is the prefix of apply's temporary files.
const tempPrefix = ".vibedom-tmp-"

// stageFile writes data to a new temporary file in rel's directory (made
// when missing) with the given permission bits, and returns its name. It is
// not yet durable: see syncStaged.
func (r *hostRoot) stageFile(rel string, data []byte, perm uint32, nonce string) (tmp string, created []string, err error) {
	if stageFail != "" && rel == stageFail {
		return "", nil, fmt.Errorf("write temporary file for %s: %w", DisplayPath(rel), unix.EIO)
	}
	dir, base := splitParent(rel)
	dfd, created, err := r.openDir(dir, true)
	if err != nil {
		return "", created, err
	}
	defer unix.Close(dfd)
	tmpBase := tempPrefix + nonce + "-" + shortName(base)
	fd, err := unix.Openat(dfd, tmpBase, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", created, fmt.Errorf("create temporary file for %s: %w", DisplayPath(rel), err)
	}
	f := os.NewFile(uintptr(fd), tmpBase)
	_, werr := f.Write(data)
	merr := f.Chmod(os.FileMode(perm & 0o777))
	var serr error
	if !batchSync {
		serr = f.Sync()
	}
	cerr := f.Close()
	if err := errors.Join(werr, merr, serr, cerr); err != nil {
		unix.Unlinkat(dfd, tmpBase, 0)
		return "", created, fmt.Errorf("write temporary file for %s: %w", DisplayPath(rel), err)
	}
	return join(dir, tmpBase), created, nil
}

// stageSymlink makes a temporary symlink in rel's directory.
func (r *hostRoot) stageSymlink(rel, target, nonce string) (tmp string, created []string, err error) {
	dir, base := splitParent(rel)
	dfd, created, err := r.openDir(dir, true)
	if err != nil {
		return "", created, err
	}
	defer unix.Close(dfd)
	tmpBase := tempPrefix + nonce + "-" + shortName(base)
	if err := unix.Symlinkat(target, dfd, tmpBase); err != nil {
		return "", created, fmt.Errorf("create symlink for %s: %w", DisplayPath(rel), err)
	}
	return join(dir, tmpBase), created, nil
}

func shortName(s string) string {
	if len(s) > 100 {
		return s[:100]
	}
	return s
}

// rename moves the staged tmp over rel (both in one directory), atomically.
// An existing directory at rel is not replaced.
func (r *hostRoot) rename(tmp, rel string) error {
	dir, base := splitParent(rel)
	tdir, tbase := splitParent(tmp)
	if dir != tdir {
		return fmt.Errorf("rename %s: temporary file in another directory", DisplayPath(rel))
	}
	dfd, _, err := r.openDir(dir, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if e, err := fstatatEntry(dfd, base, rel); err != nil {
		return err
	} else if e.Type == TypeDir {
		return fmt.Errorf("replace %s: a directory is in the way", DisplayPath(rel))
	}
	if err := unix.Renameat(dfd, tbase, dfd, base); err != nil {
		return fmt.Errorf("rename into %s: %w", DisplayPath(rel), err)
	}
	if !batchSync {
		if err := unix.Fsync(dfd); err != nil {
			return fmt.Errorf("sync directory of %s: %w", DisplayPath(rel), err)
		}
	}
	return nil
}

// remove unlinks the file or symlink rel (or the empty directory, with dir).
func (r *hostRoot) remove(rel string, dir bool) error {
	d, base := splitParent(rel)
	dfd, _, err := r.openDir(d, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(dfd, base, flags); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", DisplayPath(rel), err)
	}
	if !batchSync {
		unix.Fsync(dfd)
	}
	return nil
}

// mkdir makes the directory rel with perm (its parent must exist).
func (r *hostRoot) mkdir(rel string, perm uint32) error {
	d, base := splitParent(rel)
	dfd, _, err := r.openDir(d, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Mkdirat(dfd, base, perm&0o7777); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("make directory %s: %w", DisplayPath(rel), err)
	}
	// mkdir applies the umask; set the exact bits.
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("make directory %s: %w", DisplayPath(rel), err)
	}
	defer unix.Close(fd)
	return unix.Fchmod(fd, perm&0o7777)
}

// chmod sets the permission bits of the regular file or directory rel.
func (r *hostRoot) chmod(rel string, perm uint32) error {
	d, base := splitParent(rel)
	dfd, _, err := r.openDir(d, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return fmt.Errorf("%s: %w", DisplayPath(rel), ErrSymlinkInPath)
		}
		return fmt.Errorf("chmod %s: %w", DisplayPath(rel), err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, perm&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", DisplayPath(rel), err)
	}
	return nil
}

// readDirNames lists the directory rel (nil when it does not exist).
func (r *hostRoot) readDirNames(rel string) ([]string, error) {
	fd, _, err := r.openDir(rel, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", DisplayPath(rel), err)
	}
	return names, nil
}

// sync makes everything staged or renamed so far durable: one syncfs on
// Linux; elsewhere each write was synced as it happened.
func (r *hostRoot) sync() error {
	if !batchSync {
		return nil
	}
	return syncFS(r.fd)
}
