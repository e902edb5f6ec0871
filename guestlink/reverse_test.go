package guestlink

import (
	"io"
	"net"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
)

// TestGuestOpensNothingTowardTheHost: published ports run one way only, host
// to guest. A guest that asks the host to connect somewhere (a
// forwarded-tcpip or direct-tcpip channel toward the host, a tcpip-forward
// or streamlocal-forward request for a listener on the host, an X11 or
// agent channel while no agent is served) is refused every time.
func TestGuestOpensNothingTowardTheHost(t *testing.T) {
	t.Parallel()
	f := newFakeGuest(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		what string
		ok   bool
	}
	results := make(chan result)
	go func() {
		defer close(results)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, proto.ReadyBanner); err != nil {
			return
		}
		sc, chans, reqs, err := ssh.NewServerConn(conn, f.cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		go func() {
			for nc := range chans {
				_ = nc.Reject(ssh.Prohibited, "no")
			}
		}()
		fwd := ssh.Marshal(struct {
			Addr     string
			Port     uint32
			OrigAddr string
			OrigPort uint32
		}{"127.0.0.1", 22, "127.0.0.1", 1})
		for _, kind := range []string{"forwarded-tcpip", "direct-tcpip", "x11", "auth-agent@openssh.com", "forwarded-streamlocal@openssh.com"} {
			ch, _, err := sc.OpenChannel(kind, fwd)
			if ch != nil {
				ch.Close()
			}
			results <- result{kind, err == nil}
		}
		for _, kind := range []string{"tcpip-forward", "streamlocal-forward@openssh.com", "cancel-tcpip-forward"} {
			ok, _, _ := sc.SendRequest(kind, true, ssh.Marshal(struct {
				Addr string
				Port uint32
			}{"127.0.0.1", 0}))
			results <- result{kind, ok}
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, err := Dial(t.Context(), conn, f.keys.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := 0
	for r := range results {
		n++
		if r.ok {
			t.Errorf("the host accepted the guest's %s", r.what)
		}
	}
	if n != 8 {
		t.Fatalf("%d of 8 attempts made", n)
	}
}
