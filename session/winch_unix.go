//go:build unix

package session

import (
	"os"
	"os/signal"
	"syscall"
)

func notifyWinch() chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGWINCH)
	return c
}

func stopWinch(c chan os.Signal) { signal.Stop(c) }
