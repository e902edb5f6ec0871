//go:build !unix

package session

import "syscall"

func detachAttr() *syscall.SysProcAttr { return nil }
