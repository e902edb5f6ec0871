package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"

	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// TestConformanceSSHPush: an SSH client that speaks first (as OpenSSH and
// git do) pushes to an SSH server on an allowed host:22 through both
// engines: the key exchange, public key authentication, an exec channel
// carrying a push-sized upload, the server's answer, its exit status and
// the close all get through.
func TestConformanceSSHPush(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules)
		_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
		hostKey, err := ssh.NewSignerFromKey(hostPriv)
		if err != nil {
			t.Fatal(err)
		}
		_, userPriv, _ := ed25519.GenerateKey(rand.Reader)
		userKey, err := ssh.NewSignerFromKey(userPriv)
		if err != nil {
			t.Fatal(err)
		}
		want := userKey.PublicKey().Marshal()
		scfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if !bytes.Equal(k.Marshal(), want) {
				return nil, io.EOF
			}
			return nil, nil
		}}
		scfg.AddHostKey(hostKey)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go serveSSHPush(c, scfg)
			}
		}()
		v.AddServer("ssh.test", 22, ln.Addr().String())

		conn := v.GuestConn("ssh.test", 22)
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(time.Minute))
		cc, chans, reqs, err := ssh.NewClientConn(conn, "ssh.test:22", &ssh.ClientConfig{
			User: "git", Auth: []ssh.AuthMethod{ssh.PublicKeys(userKey)},
			HostKeyCallback: ssh.FixedHostKey(hostKey.PublicKey()),
		})
		if err != nil {
			t.Fatalf("ssh handshake through the %s engine: %v", kind, err)
		}
		client := ssh.NewClient(cc, chans, reqs)
		defer client.Close()
		s, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		pack := bytes.Repeat([]byte("PACK"), 64<<10)
		s.Stdin = bytes.NewReader(pack)
		out, err := s.Output("git-receive-pack 'repo.git'")
		if err != nil {
			t.Fatalf("push: %v (output %q)", err, out)
		}
		if want := "received 262144 bytes\n"; string(out) != want {
			t.Errorf("push answer: got %q, want %q", out, want)
		}
		client.Close()
		ev := v.Events.Wait(t, "ssh connect", func(e egress.Event) bool { return e.Kind == "connect" && e.Name == "ssh.test" })
		if ev.Decision != "allow" || !strings.Contains(ev.Reason, "spliced") || ev.BytesUp < int64(len(pack)) {
			t.Errorf("event: %+v", ev)
		}
	})
}

// serveSSHPush is a git-like SSH server: it answers one exec channel with
// the size of what the client sent and exit status 0.
func serveSSHPush(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "session only")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go func() {
			defer ch.Close()
			for r := range creqs {
				if r.Type != "exec" || !strings.Contains(string(r.Payload), "git-receive-pack") {
					r.Reply(false, nil)
					continue
				}
				r.Reply(true, nil)
				n, _ := io.Copy(io.Discard, ch)
				io.WriteString(ch, "received "+strconv.FormatInt(n, 10)+" bytes\n")
				ch.SendRequest("exit-status", false, []byte{0, 0, 0, 0})
				return
			}
		}()
	}
}
