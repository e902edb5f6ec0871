package guest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/vibedom/vibedom/guestlink"
)

func newKeyring(t *testing.T) (agent.Agent, ssh.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	kr := agent.NewKeyring()
	if err := kr.Add(agent.AddedKey{PrivateKey: priv, Comment: "test deploy key"}); err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return kr, sp
}

// loginServer is an SSH server on loopback that accepts only key and
// answers every exec with "hello <user>".
func loginServer(t *testing.T, key ssh.PublicKey) (port string, logins *atomic.Int32) {
	t.Helper()
	_, hk, _ := ed25519.GenerateKey(rand.Reader)
	hs, _ := ssh.NewSignerFromKey(hk)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), key.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("no")
	}}
	cfg.AddHostKey(hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	logins = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					c.Close()
					return
				}
				logins.Add(1)
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					for r := range creqs {
						r.Reply(r.Type == "exec", nil)
						if r.Type == "exec" {
							io.WriteString(ch, "hello "+sc.User()+"\n")
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ S uint32 }{0}))
							ch.Close()
						}
					}
				}
			}()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, logins
}

// TestAgentForwarding: a command run with ForwardAgent finds SSH_AUTH_SOCK
// in a private folder, lists the host's key through it and logs in to an
// SSH server with it (OpenSSH's ssh as the client); the socket is gone when
// the session ends; without ForwardAgent there is no socket.
func TestAgentForwarding(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"ssh", "ssh-add"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	g := startGuest(t)
	c := g.dial(t)
	kr, pub := newKeyring(t)

	t.Run("no agent served", func(t *testing.T) {
		_, err := c.Exec(t.Context(), "true", guestlink.ExecOptions{ForwardAgent: true})
		if !errors.Is(err, guestlink.ErrNoAgent) {
			t.Errorf("got %v, want ErrNoAgent", err)
		}
	})
	if err := c.ServeAgent(kr); err != nil {
		t.Fatal(err)
	}
	if err := c.ServeAgent(kr); err == nil {
		t.Error("a second ServeAgent succeeded")
	}
	port, logins := loginServer(t, pub)

	t.Run("exec", func(t *testing.T) {
		out, errOut, st := execIn(t, c, `echo "sock=$SSH_AUTH_SOCK"; stat -c 'mode=%a' "$(dirname "$SSH_AUTH_SOCK")"; ssh-add -L
ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentityFile=/dev/null -p `+port+` git@127.0.0.1 anything`,
			guestlink.ExecOptions{ForwardAgent: true})
		if !st.Success() {
			t.Fatalf("%v\n%s\n%s", st, out, errOut)
		}
		sock := between(out, "sock=", "\n")
		if !strings.HasSuffix(sock, "/"+agentSockName) || !strings.Contains(out, "mode=700\n") ||
			!strings.Contains(out, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))) || !strings.Contains(out, "hello git\n") {
			t.Errorf("output:\n%s\nstderr:\n%s", out, errOut)
		}
		if logins.Load() != 1 {
			t.Errorf("logins: %d", logins.Load())
		}
		waitUntil(t, "the socket's folder is removed", func() bool {
			_, err := os.Stat(filepath.Dir(sock))
			return os.IsNotExist(err)
		})
	})
	t.Run("shell", func(t *testing.T) {
		var out lockedBuffer
		st, err := c.Shell(t.Context(), guestlink.ShellOptions{Command: "ssh-add -l; exit 3", Stdout: &out, ForwardAgent: true})
		if err != nil || st.Code != 3 || !strings.Contains(out.String(), "ED25519") {
			t.Errorf("%v %v\n%s", st, err, out.String())
		}
	})
	t.Run("not asked for", func(t *testing.T) {
		out, _, _ := execIn(t, c, `echo "sock=$SSH_AUTH_SOCK."`, guestlink.ExecOptions{})
		if out != "sock=.\n" {
			t.Errorf("output %q", out)
		}
	})
	t.Run("after the command started", func(t *testing.T) {
		raw := g.raw(t)
		sess, err := raw.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.Start("sleep 1"); err != nil {
			t.Fatal(err)
		}
		if err := agent.RequestAgentForwarding(sess); err == nil {
			t.Error("agent forwarding was granted after the command started")
		}
	})
}

// TestAgentForwardingBounded: a command that opens more agent connections
// than the cap gets the extra ones closed at once, and closing the session
// ends the ones in flight.
func TestAgentForwardingBounded(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	fc := &stuckConn{hold: hold}
	f := &agentForward{conn: fc, log: startGuest(t).srv.log, conns: map[net.Conn]struct{}{}}
	kv, err := f.listen(runAs{})
	if err != nil {
		t.Fatal(err)
	}
	sock := strings.TrimPrefix(kv, "SSH_AUTH_SOCK=")
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket folder: %v %v", fi, err)
	}
	var conns []net.Conn
	for i := 0; i < maxAgentConns; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	waitUntil(t, "every allowed connection asks for a channel", func() bool { return fc.opens.Load() == maxAgentConns })
	extra, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("connection past the cap: read %v, want EOF", err)
	}
	if fc.opens.Load() != maxAgentConns {
		t.Errorf("channels opened: %d", fc.opens.Load())
	}
	done := make(chan struct{})
	go func() { f.close(); close(done) }()
	close(hold) // the host answers (refuses) the pending opens
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return")
	}
	if _, err := os.Stat(filepath.Dir(sock)); !os.IsNotExist(err) {
		t.Errorf("socket folder left: %v", err)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("connection after close: %v", err)
		}
	}
}

// stuckConn is an SSH connection whose host takes until hold is closed to
// refuse a channel.
type stuckConn struct {
	ssh.Conn
	hold  chan struct{}
	opens atomic.Int32
}

func (s *stuckConn) OpenChannel(string, []byte) (ssh.Channel, <-chan *ssh.Request, error) {
	s.opens.Add(1)
	<-s.hold
	return nil, nil, errors.New("refused")
}

func between(s, a, b string) string {
	_, after, _ := strings.Cut(s, a)
	v, _, _ := strings.Cut(after, b)
	return v
}

// TestAgentForwardingKept: a kept terminal started with ForwardAgent keeps
// its agent socket after the channel that started it detaches.
func TestAgentForwardingKept(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("ssh-add"); err != nil {
		t.Skip("ssh-add not installed")
	}
	g := startGuest(t)
	c := g.dial(t)
	kr, _ := newKeyring(t)
	if err := c.ServeAgent(kr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Shell(ctx, guestlink.ShellOptions{Keep: "k", ForwardAgent: true,
			Command: "touch " + g.path("started") + "; while [ ! -e " + g.path("go") + " ]; do sleep 0.05; done; ssh-add -l > " + g.path("out") + " 2>&1"})
		done <- err
	}()
	waitUntil(t, "the kept command started", func() bool {
		_, err := os.Stat(g.path("started"))
		return err == nil
	})
	// Detach; under load this may come before Shell heard the guest start
	// the command, which must still only detach (not kill) it.
	cancel()
	t.Logf("shell: %v", <-done)
	// Only now may the command ask the forwarded agent: after the detach.
	if err := os.WriteFile(g.path("go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the kept command lists the key after the detach", func() bool {
		b, _ := os.ReadFile(g.path("out"))
		return strings.Contains(string(b), "ED25519")
	})
	b, _ := os.ReadFile(g.path("out"))
	t.Logf("kept command: %s", b)
}
