//go:build unix

package session

import (
	"os"
	"syscall"
)

// detachAttr puts the session host in its own session (and so its own
// process group, without a controlling terminal): closing the terminal
// that started it, or Ctrl-C there, does not reach it.
func detachAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// hostPipes are the pipes detach passes the session host: readiness (fd
// 3) and the preflight's secret values (fd 4), made close-on-exec (as
// inherited they are not), so that no program the host starts holds them.
func hostPipes() (ready, secrets *os.File) {
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	return os.NewFile(3, "ready"), os.NewFile(4, "secrets")
}

// openNoFollow opens path for reading, not through a symlink in its last
// element and without waiting for a FIFO's writer.
func openNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
}
