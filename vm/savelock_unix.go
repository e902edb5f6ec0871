//go:build linux || darwin

package vm

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openLockFile opens (creating) the lock file, refusing a symbolic link and
// a file another user owns: the folder may be a shared /tmp.
func openLockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || (ok && int(st.Uid) != os.Getuid()) {
		f.Close()
		return nil, fmt.Errorf("not a regular file of this user: remove it")
	}
	return f, nil
}

// tryFlock takes an exclusive flock on f without waiting; ok is false when
// someone else holds it.
func tryFlock(f *os.File) (ok bool, err error) {
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EWOULDBLOCK), errors.Is(err, unix.EINTR):
		return false, nil
	default:
		return false, err
	}
}

func unFlock(f *os.File) { unix.Flock(int(f.Fd()), unix.LOCK_UN) }
