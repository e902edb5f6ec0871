//go:build !unix

package session

import "os"

func notifyWinch() chan os.Signal { return make(chan os.Signal) }

func stopWinch(chan os.Signal) {}
