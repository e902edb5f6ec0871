//go:build !linux

package netstack

import "net"

func newFrameIO(c net.Conn, frameSize int) frameIO { return newConnIO(c, frameSize) }
