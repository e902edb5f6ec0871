//go:build unix

package session

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
)

// processIs reports whether process pid exists and, when start is known,
// is the one that started at start (not a later process given the same
// PID).
func processIs(pid int, start string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if procZombie(pid) {
		return false
	}
	if start == "" {
		return true
	}
	got := procStart(pid)
	return got == "" || got == start
}

// fileUID is the owner of fi's file.
func fileUID(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// dirID identifies the folder at path (device and inode), "" when it
// cannot be read.
func dirID(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}
