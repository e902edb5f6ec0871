package sshagent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// sshWorld is an SSH server on loopback (golang.org/x/crypto/ssh) and a
// splice in front of it that does what the session's proxy does for a
// guest connection to an allowed git.test:22: it copies bytes both ways and
// shows them to the agent's Carried set first. A client that dials spliced
// is the guest's; one that dials direct is outside the VM.
type sshWorld struct {
	host     ssh.Signer
	carried  *Carried
	direct   string
	spliced  string
	logins   atomic.Int32
	closedCh chan struct{} // one value per spliced connection Carried saw close
}

// newSSHWorld: the server lets "git" in with the deploy key only, and
// "probe" in without authentication (to hold a carried connection whose
// signature is unused).
func newSSHWorld(t *testing.T, deploy ssh.PublicKey) *sshWorld {
	t.Helper()
	return newSSHWorldWith(t, deploy, newSigner(t))
}

// newSSHWorldWith is newSSHWorld with host key host, speaking only kex
// when given.
func newSSHWorldWith(t *testing.T, deploy ssh.PublicKey, host ssh.Signer, kex ...string) *sshWorld {
	t.Helper()
	w := &sshWorld{host: host, carried: NewCarried(), closedCh: make(chan struct{}, 64)}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(m ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if m.User() == "git" && bytes.Equal(k.Marshal(), deploy.Marshal()) {
				return nil, nil
			}
			return nil, errors.New("no")
		},
		NoClientAuth: true,
		NoClientAuthCallback: func(m ssh.ConnMetadata) (*ssh.Permissions, error) {
			if m.User() == "probe" {
				return nil, nil
			}
			return nil, errors.New("authenticate")
		},
	}
	cfg.KeyExchanges = kex
	cfg.AddHostKey(w.host)
	// The user's known_hosts lists this server's key (TestAgentChecksKnownHosts
	// replaces the check with real files).
	w.carried.CheckHostKeys(func(_ string, k ssh.PublicKey) (bool, error) {
		return bytes.Equal(k.Marshal(), w.host.PublicKey().Marshal()), nil
	})
	w.direct = serve(t, func(c net.Conn) {
		defer c.Close()
		sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		if sc.User() == "git" {
			w.logins.Add(1)
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			go func() {
				for r := range creqs {
					r.Reply(r.Type == "exec", nil)
					if r.Type == "exec" {
						io.WriteString(ch, "logged in\n")
						ch.SendRequest("exit-status", false, ssh.Marshal(struct{ S uint32 }{0}))
						ch.Close()
					}
				}
			}()
		}
	})
	w.spliced = serve(t, func(g net.Conn) {
		cc := w.carried.Track("git.test", 22)
		defer func() { w.closedCh <- struct{}{} }()
		defer cc.Close()
		defer g.Close()
		up, err := net.Dial("tcp", w.direct)
		if err != nil {
			return
		}
		defer up.Close()
		var wg sync.WaitGroup
		wg.Add(2)
		pipe := func(dst, src net.Conn, see func([]byte)) {
			defer wg.Done()
			defer dst.Close()
			defer src.Close()
			buf := make([]byte, 7) // small reads: the parser must reassemble
			for {
				n, err := src.Read(buf)
				if n > 0 {
					see(buf[:n])
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}
		go pipe(up, g, cc.FromGuest)
		go pipe(g, up, cc.FromServer)
		wg.Wait()
	})
	return w
}

func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
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
			go handle(c)
		}
	}()
	return ln.Addr().String()
}

// dial logs in to addr as user with the signers of ag (nil: no key).
func (w *sshWorld) dial(addr, user string, ag agent.ExtendedAgent) (*ssh.Client, error) {
	cfg := &ssh.ClientConfig{User: user, HostKeyCallback: ssh.FixedHostKey(w.host.PublicKey()), Timeout: 30 * time.Second}
	if ag != nil {
		cfg.Auth = []ssh.AuthMethod{ssh.PublicKeysCallback(ag.Signers)}
	}
	return ssh.Dial("tcp", addr, cfg)
}

// probe opens a carried connection (its key exchange done, no signature
// used) and returns its session id.
func (w *sshWorld) probe(t *testing.T) (*ssh.Client, []byte) {
	t.Helper()
	c, err := w.dial(w.spliced, "probe", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, c.SessionID()
}

// closeAndWait closes c and waits until the splice has told Carried.
func (w *sshWorld) closeAndWait(t *testing.T, c *ssh.Client) {
	t.Helper()
	c.Close()
	select {
	case <-w.closedCh:
	case <-time.After(30 * time.Second):
		t.Fatal("the splice did not end")
	}
}

func (w *sshWorld) run(t *testing.T, c *ssh.Client) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := s.Output("x"); err != nil || string(out) != "logged in\n" {
		t.Fatalf("session: %q %v", out, err)
	}
}

func lastEvent(t *testing.T, rec *events) Event {
	t.Helper()
	ev := rec.all()
	if len(ev) == 0 {
		t.Fatal("no event")
	}
	return ev[len(ev)-1]
}

func wantRefusal(t *testing.T, rec *events, reason string) {
	t.Helper()
	e := lastEvent(t, rec)
	if e.Op != "sign" || e.Decision != "deny" || !e.Alert || !strings.Contains(e.Reason, reason) {
		t.Errorf("last event %+v, want a sign refusal (alert) with %q", e, reason)
	}
}

// TestAgentRefusesRelayedLogin is the attack of issue 18 item 9: a client
// outside the VM logs in to a real SSH server on its own connection and
// has the guest get its login request signed by the forwarded agent (the
// agent client's Signers forward exactly what the outsider's client signs).
// The agent refuses, with and without a carried connection open, and the
// guest's own login through the splice still works.
func TestAgentRefusesRelayedLogin(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	w := newSSHWorld(t, deploy.PublicKey())
	rec := &events{}
	ag := served(t, New(deploy, w.carried, rec))

	if c, err := w.dial(w.direct, "git", ag); err == nil {
		c.Close()
		t.Fatal("the outsider logged in with no SSH connection carried")
	}
	wantRefusal(t, rec, "no SSH connection to an allowed host:22 is open")

	// A carried connection is open, past its key exchange, unsigned.
	_, _ = w.probe(t)
	if c, err := w.dial(w.direct, "git", ag); err == nil {
		c.Close()
		t.Fatal("the outsider logged in beside a carried connection")
	}
	wantRefusal(t, rec, "not that of any SSH connection vibedom carries")
	if n := w.logins.Load(); n != 0 {
		t.Fatalf("%d logins as the deploy key", n)
	}

	// The guest's own login on a carried connection is signed.
	c, err := w.dial(w.spliced, "git", ag)
	if err != nil {
		t.Fatalf("login through the splice: %v", err)
	}
	defer c.Close()
	w.run(t, c)
	e := lastEvent(t, rec)
	if e.Decision != "allow" || e.Alert || e.Server != "git.test:22" || e.ServerHostKey != ssh.FingerprintSHA256(w.host.PublicKey()) {
		t.Errorf("event of the carried login: %+v", e)
	}
	if n := w.logins.Load(); n != 1 {
		t.Errorf("%d logins as the deploy key, want 1", n)
	}
}

// TestAgentOneSignaturePerConnection: a carried connection gets one
// signature; a second one, and one after the connection closed, are
// refused (and logged as alerts).
func TestAgentOneSignaturePerConnection(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	w := newSSHWorld(t, deploy.PublicKey())
	rec := &events{}
	ag := served(t, New(deploy, w.carried, rec))
	pc, sid := w.probe(t)
	data := userAuthData(sid, "git", ssh.KeyAlgoED25519, deploy.PublicKey())
	if _, err := ag.Sign(deploy.PublicKey(), data); err != nil {
		t.Fatalf("first signature: %v", err)
	}
	if _, err := ag.Sign(deploy.PublicKey(), data); err == nil {
		t.Error("a second signature on the same connection")
	}
	wantRefusal(t, rec, "already had its one signature")
	w.closeAndWait(t, pc)
	if _, err := ag.Sign(deploy.PublicKey(), data); err == nil {
		t.Error("signed after the connection closed")
	}
	wantRefusal(t, rec, "has closed")

	// Unsigned, then closed: refused as closed.
	pc2, sid2 := w.probe(t)
	w.closeAndWait(t, pc2)
	if _, err := ag.Sign(deploy.PublicKey(), userAuthData(sid2, "git", ssh.KeyAlgoED25519, deploy.PublicKey())); err == nil {
		t.Error("signed for a closed connection")
	}
	wantRefusal(t, rec, "has closed")
	// The same with another connection open.
	w.probe(t)
	if _, err := ag.Sign(deploy.PublicKey(), userAuthData(sid2, "git", ssh.KeyAlgoED25519, deploy.PublicKey())); err == nil {
		t.Error("signed for a closed connection")
	}
	wantRefusal(t, rec, "has closed")
}

// TestAgentHostboundNeedsTheCarriedHostKey: a hostbound login request must
// name the host key that signed the carried connection's key exchange.
func TestAgentHostboundNeedsTheCarriedHostKey(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	w := newSSHWorld(t, deploy.PublicKey())
	rec := &events{}
	ag := served(t, New(deploy, w.carried, rec))
	_, sid := w.probe(t)
	if _, err := ag.Sign(deploy.PublicKey(), hostboundData(sid, deploy.PublicKey(), newSigner(t).PublicKey())); err == nil {
		t.Error("signed a hostbound login naming another host key")
	}
	wantRefusal(t, rec, "another server host key")
	if _, err := ag.Sign(deploy.PublicKey(), hostboundData(sid, deploy.PublicKey(), w.host.PublicKey())); err != nil {
		t.Errorf("hostbound login naming the server's key: %v", err)
	}
}

// hostboundData is a hostbound login of git with pub to the server whose
// host key is host.
func hostboundData(sid []byte, pub, host ssh.PublicKey) []byte {
	return append(loginData(sid, "git", methodHostbound, ssh.KeyAlgoED25519, pub), ssh.Marshal(struct{ HostKey []byte }{host.Marshal()})...)
}

// TestCarriedNotSSH: only port 22 is tracked; a stream that is not SSH,
// or garbage after the version lines, gives no connection to sign for.
func TestCarriedNotSSH(t *testing.T) {
	t.Parallel()
	c := NewCarried()
	if c.Track("x", 443) != nil {
		t.Error("port 443 tracked")
	}
	for _, server := range [][]byte{
		[]byte("HTTP/1.1 200 OK\r\n\r\n"),
		append([]byte("SSH-2.0-x\r\n"), 0xff, 0xff, 0xff, 0xff, 0, 1, 2),
		append([]byte("SSH-2.0-x\r\n"), bytes.Repeat([]byte{0}, 100)...),
	} {
		cc := c.Track("x", 22)
		cc.FromGuest([]byte("SSH-2.0-guest\r\n"))
		cc.FromServer(server)
		if _, _, _, r := c.claim([]byte("sid"), nil); r == "" {
			t.Error("claimed")
		}
		cc.Close()
	}
}

// FuzzCarried: whatever both sides send, in whatever pieces, Carried does
// not panic, holds a bounded buffer, and claims nothing it cannot verify.
func FuzzCarried(f *testing.F) {
	f.Add([]byte("SSH-2.0-g\r\n"), []byte("SSH-2.0-s\r\n\x00\x00\x00\x0c\x0a\x14"), uint8(3))
	f.Add([]byte("SSH-2.0-g\n\x00\x00\x00\x10\x04\x14aaaaaaaaaaa"), []byte("SSH-1.99-s\n\x00\x00\x00\x08\x02\x1f\x00\x00\x00\x00\x00"), uint8(1))
	f.Fuzz(func(t *testing.T, guest, server []byte, step uint8) {
		c := NewCarried()
		cc := c.Track("x", 22)
		n := int(step%16) + 1
		for i := 0; i < len(guest) || i < len(server); i += n {
			if i < len(guest) {
				cc.FromGuest(guest[i:min(i+n, len(guest))])
			}
			if i < len(server) {
				cc.FromServer(server[i:min(i+n, len(server))])
			}
		}
		if len(cc.guest.buf) > maxPreKexPacket+maxVersionLine+2 || len(cc.srv.buf) > maxPreKexPacket+maxVersionLine+2 {
			t.Fatal("unbounded buffer")
		}
		if _, _, _, r := c.claim([]byte("not a session id"), nil); r == "" {
			t.Fatal("claimed an unverified session id")
		}
		cc.Close()
	})
}

// TestCarriedKeyExchanges: the binding reads every key exchange method
// golang.org/x/crypto/ssh speaks (OpenSSH's default, a post-quantum hybrid,
// is in TestAgentWithOpenSSH), including group exchange, whose reply is not
// message 31, and RSA and ECDSA host keys.
func TestCarriedKeyExchanges(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	hosts := map[string]func() ssh.Signer{
		"ed25519": func() ssh.Signer { return newSigner(t) },
		"ecdsa": func() ssh.Signer {
			k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
			s, _ := ssh.NewSignerFromKey(k)
			return s
		},
		"rsa": func() ssh.Signer {
			k, _ := rsa.GenerateKey(rand.Reader, 2048)
			s, _ := ssh.NewSignerFromKey(k)
			return s
		},
	}
	for _, kex := range ssh.SupportedAlgorithms().KeyExchanges {
		for _, hk := range []string{"ed25519", "ecdsa", "rsa"} {
			if hk != "ed25519" && kex != ssh.KeyExchangeCurve25519 {
				continue
			}
			t.Run(kex+"/"+hk, func(t *testing.T) {
				w := newSSHWorldWith(t, deploy.PublicKey(), hosts[hk](), kex)
				rec := &events{}
				ag := served(t, New(deploy, w.carried, rec))
				cfg := &ssh.ClientConfig{User: "git", HostKeyCallback: ssh.FixedHostKey(w.host.PublicKey()),
					Auth: []ssh.AuthMethod{ssh.PublicKeysCallback(ag.Signers)}, Config: ssh.Config{KeyExchanges: []string{kex}}}
				c, err := ssh.Dial("tcp", w.spliced, cfg)
				if err != nil {
					t.Fatalf("login through the splice: %v (events %+v)", err, rec.all())
				}
				c.Close()
			})
		}
	}
}
