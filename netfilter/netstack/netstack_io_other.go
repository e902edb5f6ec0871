//go:build !linux

package netfilter

import "net"

func newFrameIO(c net.Conn, frameSize int) frameIO { return newConnIO(c, frameSize) }
