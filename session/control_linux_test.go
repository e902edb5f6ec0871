package session

import (
	"context"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest"
	"github.com/vibedom/vibedom/guest/client"
	"github.com/vibedom/vibedom/keys"
)

// inProcessGuest is a guest agent served in this process on loopback,
// and the host's client to it.
func inProcessGuest(t *testing.T) *client.Client {
	t.Helper()
	k, err := keys.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	hostPEM, err := k.HostKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(hostPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := guest.NewServer(guest.ServerConfig{HostKey: signer, AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()},
		WorkDir: dir, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(ctx, c)
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(t.Context(), conn, k.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestExecStreamEndsWithTheCommand: input a client still sends after the
// command ended (`yes | vibedom exec -i NAME -- true`) must not leave the
// host's frame reader blocked for ever, holding the frame.
func TestExecStreamEndsWithTheCommand(t *testing.T) {
	s := controlHost(t, os.Getuid())
	s.client = inProcessGuest(t)
	for range 3 {
		conn, err := DialControl(&Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Do(ControlRequest{Op: OpExec, Argv: []string{"true"}}, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		st := conn.Stream()
		go func() {
			chunk := make([]byte, 32<<10)
			for {
				if _, err := st.Input().Write(chunk); err != nil {
					return
				}
			}
		}()
		x, err := st.Copy(io.Discard, io.Discard)
		conn.Close()
		if err != nil || x.Code != 0 {
			t.Fatalf("exec true: %v %v", x, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "session.(*sess).stream.func") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host's frame readers outlive their commands:\n%s", stacks)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
