//go:build linux || darwin

package image

import (
	"os"

	"golang.org/x/sys/unix"
)

// statID identifies one version of a file: if any field changes, the
// content may have changed. The inode change time cannot be set back by
// user programs, so rewriting a file in place and restoring its mtime still
// changes the identity.
func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: errNotRegular}
	}
	return fileID{
		Dev:   uint64(st.Dev),
		Ino:   uint64(st.Ino),
		Size:  st.Size,
		Mtime: st.Mtim.Nano(),
		Ctime: st.Ctim.Nano(),
	}, nil
}

// locksWork reports whether lockFile really excludes other processes.
const locksWork = true

// lockFile takes an exclusive advisory lock on f, waiting for it.
func lockFile(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX) }

// unlockFile releases the lock taken by lockFile.
func unlockFile(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_UN) }

// tryLockFile takes the lock of lockFile if it is free and reports whether
// it did.
func tryLockFile(f *os.File) (bool, error) {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == unix.EWOULDBLOCK {
		return false, nil
	}
	return err == nil, err
}

// openNoFollow opens (creating) a lock file, refusing a symlink.
func openNoFollow(p string) (*os.File, error) {
	return os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o644)
}

// processAlive reports whether a process with this PID exists.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || err == unix.EPERM
}
