//go:build linux

package guest

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/client"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/keys"
)

type testGuest struct {
	keys     *keys.Session
	client   *client.Client
	workDir  string
	poweroff atomic.Int32
}

// startServer runs the real SSH server in-process over a loopback TCP
// connection, with this host's /bin/sh as the guest's shell.
func startServer(t *testing.T) *testGuest {
	t.Helper()
	k, err := keys.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	g := &testGuest{keys: k, workDir: t.TempDir()}
	hostPEM, err := k.HostKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	hostSigner, err := ssh.ParsePrivateKey(hostPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{
		HostKey:        hostSigner,
		AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()},
		WorkDir:        g.workDir,
		Env:            []string{"PATH=/usr/local/bin:/usr/bin:/bin", "VIBEDOM_TEST=1"},
		Poweroff:       func() { g.poweroff.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(ctx, c)
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
	})
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	g.client, err = client.Dial(t.Context(), conn, k.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.client.Close() })
	return g
}

func (g *testGuest) exec(t *testing.T, cmd string, stdin string) (string, string, client.ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := g.client.Exec(ctx, cmd, client.ExecOptions{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String(), errb.String(), st
}

func TestExec(t *testing.T) {
	g := startServer(t)
	tests := []struct {
		name, cmd, stdin    string
		wantOut, wantErr    string
		wantCode, wantShell int
		wantSignal          string
	}{
		{name: "stdout and stderr apart", cmd: "echo out; echo err >&2", wantOut: "out\n", wantErr: "err\n"},
		{name: "exit 1", cmd: "exit 1", wantCode: 1, wantShell: 1},
		{name: "exit 42", cmd: "exit 42", wantCode: 42, wantShell: 42},
		{name: "stdin reaches EOF", cmd: "cat; echo done", stdin: "abc", wantOut: "abcdone\n"},
		{name: "working directory", cmd: "pwd", wantOut: "WORKDIR\n"},
		{name: "base env", cmd: "echo $VIBEDOM_TEST", wantOut: "1\n"},
		{name: "killed by signal", cmd: "kill -9 $$", wantSignal: "KILL", wantShell: 137},
		{name: "background job does not hold the session", cmd: "sleep 30 & echo started", wantOut: "started\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, st := g.exec(t, tt.cmd, tt.stdin)
			want := strings.ReplaceAll(tt.wantOut, "WORKDIR", g.workDir)
			if out != want {
				t.Errorf("stdout: got %q, want %q", out, want)
			}
			if errOut != tt.wantErr {
				t.Errorf("stderr: got %q, want %q", errOut, tt.wantErr)
			}
			if st.Code != tt.wantCode || st.Signal != tt.wantSignal {
				t.Errorf("status: got %+v, want code %d signal %q", st, tt.wantCode, tt.wantSignal)
			}
			if st.ShellCode() != tt.wantShell {
				t.Errorf("shell code: got %d, want %d", st.ShellCode(), tt.wantShell)
			}
		})
	}
}

func TestExecEnvFromClient(t *testing.T) {
	g := startServer(t)
	var out bytes.Buffer
	st, err := g.client.Exec(t.Context(), `printf '%s' "$FOO"`, client.ExecOptions{Stdout: &out, Env: map[string]string{"FOO": "a b=c"}})
	if err != nil || st.Code != 0 {
		t.Fatalf("exec: %v %+v", err, st)
	}
	if got := out.String(); got != "a b=c" {
		t.Errorf("FOO: got %q, want %q", got, "a b=c")
	}
	// An invalid name is refused, a huge value too.
	for name, env := range map[string]map[string]string{
		"bad name":   {"A=B": "x"},
		"huge value": {"BIG": strings.Repeat("x", maxEnvBytes+1)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := g.client.Exec(t.Context(), "true", client.ExecOptions{Env: env})
			if err == nil {
				t.Errorf("env %s accepted", name)
			}
		})
	}
}

func TestExecContextCancelSignals(t *testing.T) {
	g := startServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	marker := filepath.Join(g.workDir, "got-term")
	started := make(chan struct{})
	var out syncWriter
	out.onWrite = func() {
		select {
		case <-started:
		default:
			close(started)
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := g.client.Exec(ctx, "trap 'touch "+marker+"; exit 3' TERM; echo ready; while :; do sleep 0.1; done", client.ExecOptions{Stdout: &out})
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("command did not start")
	}
	cancel()
	if err := <-errc; err == nil {
		t.Errorf("cancelled Exec returned no error")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command never got SIGTERM")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type syncWriter struct {
	onWrite func()
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.onWrite()
	return len(p), nil
}

func TestShellPTYResize(t *testing.T) {
	g := startServer(t)
	pr, pw := io.Pipe()
	var out lockedBuffer
	resize := make(chan client.WindowSize, 1)
	done := make(chan client.ExitStatus, 1)
	go func() {
		st, err := g.client.Shell(t.Context(), client.ShellOptions{
			Term: "xterm", Cols: 100, Rows: 30, Resize: resize, Stdin: pr, Stdout: &out,
			Command: "stty size; read x; stty size; test -t 0 && echo tty; exit 7",
		})
		if err != nil {
			t.Errorf("shell: %v", err)
		}
		done <- st
	}()
	waitOutput(t, &out, "30 100")
	resize <- client.WindowSize{Cols: 120, Rows: 40}
	// Give the window-change a moment to arrive before the line.
	time.Sleep(200 * time.Millisecond)
	io.WriteString(pw, "go\n")
	waitOutput(t, &out, "40 120")
	st := <-done
	if st.Code != 7 {
		t.Errorf("exit code: got %d, want 7", st.Code)
	}
	if !strings.Contains(out.String(), "tty") {
		t.Errorf("stdin is not a terminal: %q", out.String())
	}
}

func TestSFTP(t *testing.T) {
	g := startServer(t)
	sc, err := g.client.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	p := filepath.Join(g.workDir, "x.txt")
	f, err := sc.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(f, "written over sftp")
	f.Close()
	out, _, _ := g.exec(t, "cat x.txt", "")
	if out != "written over sftp" {
		t.Errorf("file written over SFTP: got %q", out)
	}
	g.exec(t, "printf guest > y.txt", "")
	r, err := sc.Open(filepath.Join(g.workDir, "y.txt"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "guest" {
		t.Errorf("file read over SFTP: got %q", b)
	}
}

func TestPoweroffRequest(t *testing.T) {
	g := startServer(t)
	if err := g.client.Poweroff(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.poweroff.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := g.poweroff.Load(); got != 1 {
		t.Errorf("poweroff called %d times, want 1", got)
	}
	if err := g.client.Poweroff(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if got := g.poweroff.Load(); got != 1 {
		t.Errorf("poweroff called %d times after two requests, want 1", got)
	}
}

func TestAuthentication(t *testing.T) {
	g := startServer(t)
	_ = g
	k, _ := keys.NewSession()
	hostPEM, _ := k.HostKeyPEM()
	hostSigner, _ := ssh.ParsePrivateKey(hostPEM)
	srv, err := NewServer(ServerConfig{HostKey: hostSigner, AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()}})
	if err != nil {
		t.Fatal(err)
	}
	serve := func() net.Conn {
		a, b := tcpPair(t)
		go srv.ServeConn(context.Background(), a)
		return b
	}
	t.Run("wrong client key", func(t *testing.T) {
		other, _ := keys.NewSession()
		cfg := other.ClientConfig()
		cfg.HostKeyCallback = k.HostKeyCallback()
		if _, err := client.Dial(t.Context(), serve(), cfg); err == nil {
			t.Errorf("a client key that is not authorized logged in")
		}
	})
	t.Run("different host key", func(t *testing.T) {
		other, _ := keys.NewSession()
		cfg := k.ClientConfig()
		cfg.HostKeyCallback = other.HostKeyCallback()
		_, err := client.Dial(t.Context(), serve(), cfg)
		if err == nil || !strings.Contains(err.Error(), "does not match the pinned key") {
			t.Errorf("unpinned host key: got %v", err)
		}
	})
	t.Run("other channel types refused", func(t *testing.T) {
		c, chans, reqs, err := ssh.NewClientConn(serve(), "x", k.ClientConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go ssh.DiscardRequests(reqs)
		go func() {
			for nc := range chans {
				nc.Reject(ssh.Prohibited, "no")
			}
		}()
		for _, typ := range []string{"direct-tcpip", "x11", "auth-agent@openssh.com"} {
			if _, _, err := c.OpenChannel(typ, nil); err == nil {
				t.Errorf("channel type %s accepted", typ)
			}
		}
		if _, _, err := c.SendRequest("tcpip-forward", true, nil); err != nil {
			t.Fatal(err)
		}
	})
}

func TestMalformedRequests(t *testing.T) {
	g := startServer(t)
	k := g.keys
	_ = k
	// Raw session with garbage payloads must be refused, not crash.
	sc, err := g.client.SFTP() // the server is alive
	if err != nil {
		t.Fatal(err)
	}
	sc.Close()
	sess, err := rawSession(t, g)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"env", "pty-req", "exec", "subsystem", "signal", "window-change", "shell-x"} {
		ok, err := sess.SendRequest(typ, true, []byte{0xff, 0xff, 0xff, 0xff, 1})
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if ok && typ != "window-change" {
			t.Errorf("garbage %s accepted", typ)
		}
	}
	// Bogus terminal sizes are clamped, not fatal.
	ok, err := sess.SendRequest("pty-req", true, ssh.Marshal(ptyRequest{Term: "xterm", Columns: 1 << 31, Rows: 0}))
	if err != nil || !ok {
		t.Fatalf("pty-req with huge size: ok=%v err=%v", ok, err)
	}
	ok, err = sess.SendRequest("exec", true, ssh.Marshal(struct{ Command string }{"stty size"}))
	if err != nil || !ok {
		t.Fatalf("exec after pty-req: ok=%v err=%v", ok, err)
	}
	b, _ := io.ReadAll(sess)
	if got := strings.TrimSpace(string(b)); got != "24 4096" {
		t.Errorf("clamped size: got %q, want %q", got, "24 4096")
	}
	out, _, _ := g.exec(t, "echo alive", "")
	if out != "alive\n" {
		t.Errorf("server after malformed requests: got %q", out)
	}
}

func rawSession(t *testing.T, g *testGuest) (ssh.Channel, error) {
	t.Helper()
	// Reach the underlying connection through a fresh client.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	hostPEM, _ := g.keys.HostKeyPEM()
	hostSigner, _ := ssh.ParsePrivateKey(hostPEM)
	srv, _ := NewServer(ServerConfig{HostKey: hostSigner, AuthorizedKeys: []ssh.PublicKey{g.keys.ClientSigner().PublicKey()}, WorkDir: g.workDir})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			srv.ServeConn(context.Background(), c)
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, "x", g.keys.ClientConfig())
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	go ssh.DiscardRequests(reqs)
	go func() {
		for nc := range chans {
			nc.Reject(ssh.Prohibited, "no")
		}
	}()
	ch, creqs, err := c.OpenChannel("session", nil)
	if err != nil {
		return nil, err
	}
	go ssh.DiscardRequests(creqs)
	return ch, nil
}

type lockedBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func (b *lockedBuffer) lock() {
	if b.mu == nil {
		b.mu = make(chan struct{}, 1)
	}
	b.mu <- struct{}{}
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.lock()
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.lock()
	defer func() { <-b.mu }()
	return b.buf.String()
}

func waitOutput(t *testing.T, b *lockedBuffer, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %q; output so far: %q", s, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = proto.WorkDir

// tcpPair returns both ends of a loopback TCP connection (net.Pipe has no
// buffering, and both SSH ends write their version before reading).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := <-acc
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
