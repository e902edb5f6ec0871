package guest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// TestForwardTarget: a direct-tcpip channel reaches only the guest itself.
func TestForwardTarget(t *testing.T) {
	own := []net.IP{net.ParseIP("10.0.2.15"), net.ParseIP("fe80::1"), net.IPv4zero}
	for _, tc := range []struct {
		host string
		port uint32
		want string // "" = refused
	}{
		{"127.0.0.1", 8080, "127.0.0.1:8080"},
		{"127.1.2.3", 80, "127.1.2.3:80"},
		{"::1", 3000, "[::1]:3000"},
		{"localhost", 3000, "127.0.0.1:3000"},
		{"10.0.2.15", 3000, "10.0.2.15:3000"},
		{"10.0.2.2", 80, ""},        // the gateway: the host's network stack
		{"169.254.169.254", 80, ""}, // metadata
		{"192.168.1.1", 22, ""},
		{"0.0.0.0", 80, ""},
		{"example.com", 80, ""},
		{"127.0.0.1.nip.io", 80, ""},
		{"127.0.0.1", 0, ""},
		{"127.0.0.1", 70000, ""},
		{"", 80, ""},
	} {
		got, err := forwardTarget(tc.host, tc.port, own)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("forwardTarget(%q, %d) = %q, %v; want %q", tc.host, tc.port, got, err, tc.want)
		}
	}
}

// TestDirectTCPIP: through the real server, a connection to a port on the
// guest's loopback carries bytes both ways with half closes; a port where
// nothing listens and an address that is not the guest's are refused.
func TestDirectTCPIP(t *testing.T) {
	g := startGuest(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo in upper case, then say goodbye after the client's end
				defer c.Close()
				data, _ := io.ReadAll(c)
				c.Write([]byte(strings.ToUpper(string(data)) + "bye\n"))
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	c := g.dial(t)
	conn, err := c.DialPort(t.Context(), port)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("hello\n"))
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(bufio.NewReader(conn))
	conn.Close()
	if err != nil || string(got) != "HELLO\nbye\n" {
		t.Errorf("through the forward: %q %v", got, err)
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	cport := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	if _, err := c.DialPort(t.Context(), cport); err == nil || !strings.Contains(err.Error(), "nothing answers") {
		t.Errorf("a closed port: %v", err)
	}
	raw := g.raw(t)
	for _, dest := range []string{"10.255.255.1", "example.com", "0.0.0.0"} {
		_, err := raw.Dial("tcp", net.JoinHostPort(dest, strconv.Itoa(port)))
		var oce *ssh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != ssh.Prohibited {
			t.Errorf("direct-tcpip to %s: %v, want prohibited", dest, err)
		}
	}
}
