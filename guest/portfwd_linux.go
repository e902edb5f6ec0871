package guest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// Published ports: the host's `vibedom run -p` and `vibedom port add` reach
// a server in the guest by opening an SSH direct-tcpip channel on the
// control channel, one per connection. The guest dials only itself:
// loopback or one of its own interface addresses, given as an address
// (no name but "localhost" is resolved), so a channel is never a way from
// the host's side to any other machine; the guest's network and egress
// policy are not involved.

// ChannelDirectTCPIP is the SSH channel type of a published port's
// connection (RFC 4254 7.2).
const ChannelDirectTCPIP = "direct-tcpip"

// Bounds of the forwarded connections of one control connection.
const (
	maxForwards    = 256              // open at once
	forwardDialMax = 10 * time.Second // connecting to the guest's port
)

// forwardTarget is the address a direct-tcpip channel may connect to: host
// must be an IP address of the guest itself (loopback, or one of own) or
// "localhost"; port 1–65535.
func forwardTarget(host string, port uint32, own []net.IP) (string, error) {
	if port == 0 || port > 65535 {
		return "", fmt.Errorf("port %d out of range", port)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", fmt.Errorf("%q is not an address of this guest", host)
	}
	ok := ip.IsLoopback()
	for _, o := range own {
		if !ok && !o.IsUnspecified() && o.Equal(ip) {
			ok = true
		}
	}
	if !ok {
		return "", fmt.Errorf("%s is not an address of this guest", ip)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), nil
}

// ownAddrs lists the addresses of the guest's interfaces.
func ownAddrs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out
}

// directTCPIP serves one direct-tcpip channel: it connects to the target
// first (a refusal reaches the host as the channel's rejection) and then
// copies both ways, each direction's end passed on as a half close.
func (s *Server) directTCPIP(ctx context.Context, nc ssh.NewChannel, slots chan struct{}, wg *sync.WaitGroup) {
	var req struct {
		DestAddr string
		DestPort uint32
		OrigAddr string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &req); err != nil {
		_ = nc.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	addr, err := forwardTarget(req.DestAddr, req.DestPort, ownAddrs())
	if err != nil {
		s.log.Warn("port forward refused", "err", err)
		_ = nc.Reject(ssh.Prohibited, err.Error())
		return
	}
	select {
	case slots <- struct{}{}:
	default:
		_ = nc.Reject(ssh.ResourceShortage, "too many forwarded connections")
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-slots }()
		dctx, cancel := context.WithTimeout(ctx, forwardDialMax)
		conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
		cancel()
		if err != nil {
			_ = nc.Reject(ssh.ConnectionFailed, fmt.Sprintf("nothing answers on %s in the guest", addr))
			return
		}
		defer conn.Close()
		ch, reqs, err := nc.Accept()
		if err != nil {
			return
		}
		defer ch.Close()
		go ssh.DiscardRequests(reqs)
		closeAll := func() { conn.Close(); ch.Close() }
		stop := context.AfterFunc(ctx, closeAll)
		defer stop()
		splice(ch, conn.(*net.TCPConn), closeAll)
	}()
}

// halfCloser is a connection whose write side can be closed alone.
type halfCloser interface {
	io.ReadWriter
	CloseWrite() error
}

// splice copies a to b and b to a until both directions ended, passing each
// end of input on as a half close. A direction that fails calls closeAll,
// which must close both (so the other direction ends too).
func splice(a, b halfCloser, closeAll func()) {
	done := make(chan struct{}, 2)
	pipe := func(dst, src halfCloser) {
		if _, err := io.Copy(dst, src); err != nil {
			closeAll()
		}
		_ = dst.CloseWrite()
		done <- struct{}{}
	}
	go pipe(a, b)
	go pipe(b, a)
	<-done
	<-done
}
