//go:build unix

package session

import "syscall"

// detachAttr puts the session host in its own session (and so its own
// process group, without a controlling terminal): closing the terminal
// that started it, or Ctrl-C there, does not reach it.
func detachAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
