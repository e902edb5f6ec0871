//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/keys/keystest"
)

// testGuest is the real SSH server of the guest agent, run in-process on a
// loopback listener with this host's /bin/sh as the guest's shell and a
// temporary folder as /work.
type testGuest struct {
	keys     *keys.Session
	srv      *Server
	addr     string
	workDir  string
	poweroff atomic.Int32
}

type guestOption func(*ServerConfig)

func withoutPoweroff() guestOption { return func(c *ServerConfig) { c.Poweroff = nil } }

func startGuest(t *testing.T, opts ...guestOption) *testGuest {
	t.Helper()
	sk := keystest.New(t)
	k, hostSigner := sk.Keys, sk.HostSigner
	g := &testGuest{keys: k, workDir: t.TempDir()}
	cfg := ServerConfig{
		HostKey:        hostSigner,
		AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()},
		WorkDir:        g.workDir,
		Env:            []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + g.workDir, "VIBEDOM_TEST=1"},
		Poweroff:       func() { g.poweroff.Add(1) },
	}
	for _, o := range opts {
		o(&cfg)
	}
	var err error
	g.srv, err = NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.srv.outputDrain, g.srv.hangupGrace = 200*time.Millisecond, 200*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	var conns sync.WaitGroup
	conns.Add(1)
	go func() {
		defer conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				_ = g.srv.ServeConn(ctx, c)
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		conns.Wait() // every connection and every command ended
	})
	return g
}

// dial connects the host's client (guestlink) to the server.
func (g *testGuest) dial(t *testing.T) *guestlink.Client {
	t.Helper()
	conn, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := guestlink.Dial(t.Context(), conn, g.keys.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// raw connects a plain x/crypto/ssh client, for requests guestlink
// never sends.
func (g *testGuest) raw(t *testing.T) *ssh.Client {
	t.Helper()
	conn, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, g.addr, g.keys.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	sc := ssh.NewClient(c, chans, reqs)
	t.Cleanup(func() { sc.Close() })
	return sc
}

func (g *testGuest) path(name string) string { return filepath.Join(g.workDir, name) }

// killPIDFileAtCleanup kills the process whose pid a test command writes
// to name, so no test leaves processes behind.
func (g *testGuest) killPIDFileAtCleanup(t *testing.T, name string) {
	t.Cleanup(func() {
		if pid, ok := readPID(g.path(name)); ok {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

func readPID(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 1
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// waitUntil polls cond until it holds or the deadline passes (generous:
// tests never assert wall-clock time).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func execIn(t *testing.T, c *guestlink.Client, cmd string, o guestlink.ExecOptions) (string, string, guestlink.ExitStatus) {
	t.Helper()
	var out, errb lockedBuffer
	o.Stdout, o.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := c.Exec(ctx, cmd, o)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out.String(), errb.String(), st
}

func TestExec(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	tests := []struct {
		name, cmd, stdin string
		wantOut, wantErr string
		wantStatus       guestlink.ExitStatus
		wantShell        int
	}{
		{name: "stdout and stderr apart", cmd: "echo out; echo err >&2; echo out2", wantOut: "out\nout2\n", wantErr: "err\n"},
		{name: "exit 0", cmd: "true"},
		{name: "exit 1", cmd: "exit 1", wantStatus: guestlink.ExitStatus{Code: 1}, wantShell: 1},
		{name: "exit 42", cmd: "exit 42", wantStatus: guestlink.ExitStatus{Code: 42}, wantShell: 42},
		{name: "stdin reaches EOF", cmd: "cat; echo done", stdin: "abc", wantOut: "abcdone\n"},
		{name: "no stdin is an empty stdin", cmd: "wc -c", wantOut: "0\n"},
		{name: "working directory is /work", cmd: "pwd", wantOut: "WORKDIR\n"},
		{name: "base environment", cmd: "echo $VIBEDOM_TEST", wantOut: "1\n"},
		{name: "no TERM without a pty", cmd: "echo ${TERM-unset}", wantOut: "unset\n"},
		{name: "killed by SIGKILL", cmd: "kill -9 $$", wantStatus: guestlink.ExitStatus{Signal: "KILL"}, wantShell: 137},
		{name: "killed by SIGSEGV", cmd: "kill -SEGV $$", wantStatus: guestlink.ExitStatus{Signal: "SEGV"}, wantShell: 139},
		{name: "killed by a signal without a name", cmd: "kill -36 $$", wantStatus: guestlink.ExitStatus{Signal: "36@vibedom"}, wantShell: 164},
		{name: "empty command", cmd: ""},
		{name: "stdin is not a terminal", cmd: "test -t 0 || echo notty", wantOut: "notty\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, st := execIn(t, c, tt.cmd, guestlink.ExecOptions{Stdin: strings.NewReader(tt.stdin)})
			want := strings.ReplaceAll(tt.wantOut, "WORKDIR", g.workDir)
			if out != want {
				t.Errorf("stdout: got %q, want %q", out, want)
			}
			if errOut != tt.wantErr {
				t.Errorf("stderr: got %q, want %q", errOut, tt.wantErr)
			}
			st.CoreDumped = false // depends on the host's core limits
			if st != tt.wantStatus {
				t.Errorf("status: got %+v, want %+v", st, tt.wantStatus)
			}
			if st.ShellCode() != tt.wantShell {
				t.Errorf("shell code: got %d, want %d", st.ShellCode(), tt.wantShell)
			}
		})
	}
}

func TestExecStreams(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	const size = 4 << 20
	t.Run("all output arrives before the status", func(t *testing.T) {
		var n countingWriter
		st, err := c.Exec(t.Context(), fmt.Sprintf("head -c %d /dev/zero; exit 3", size), guestlink.ExecOptions{Stdout: &n})
		if err != nil {
			t.Fatal(err)
		}
		if n.n.Load() != size || st.Code != 3 {
			t.Errorf("got %d bytes and %+v, want %d bytes and exit 3", n.n.Load(), st, size)
		}
	})
	t.Run("large stdin", func(t *testing.T) {
		out, _, st := execIn(t, c, "wc -c", guestlink.ExecOptions{Stdin: io.LimitReader(zeroReader{}, size)})
		if strings.TrimSpace(out) != strconv.Itoa(size) || st.Code != 0 {
			t.Errorf("wc -c of %d bytes: got %q (%+v)", size, out, st)
		}
	})
	t.Run("a command that ignores stdin still ends", func(t *testing.T) {
		pr, pw := io.Pipe() // never closed until the end
		defer pw.Close()
		out, _, st := execIn(t, c, "echo hi", guestlink.ExecOptions{Stdin: pr})
		if out != "hi\n" || st.Code != 0 {
			t.Errorf("got %q (%+v)", out, st)
		}
	})
	t.Run("background job does not hold the session", func(t *testing.T) {
		g.killPIDFileAtCleanup(t, "bg.pid")
		out, _, st := execIn(t, c, "sleep 60 & echo $! > bg.pid; echo started", guestlink.ExecOptions{})
		if out != "started\n" || st.Code != 0 {
			t.Errorf("got %q (%+v)", out, st)
		}
	})
	t.Run("Output", func(t *testing.T) {
		out, err := c.Output(t.Context(), "echo fine")
		if err != nil || string(out) != "fine\n" {
			t.Errorf("Output: got %q, %v", out, err)
		}
		_, err = c.Output(t.Context(), "echo why >&2; exit 4")
		var ee *guestlink.ExitError
		if !errors.As(err, &ee) || ee.Status.Code != 4 || string(ee.Stderr) != "why\n" {
			t.Errorf("Output of a failing command: got %v", err)
		}
	})
}

func TestExecEnv(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	ok := []struct {
		name string
		env  map[string]string
		cmd  string
		want string
	}{
		{"client variable", map[string]string{"FOO": "a b=c"}, `printf %s "$FOO"`, "a b=c"},
		{"client overrides the base", map[string]string{"VIBEDOM_TEST": "2"}, `printf %s "$VIBEDOM_TEST"`, "2"},
		{"quotes and newlines kept", map[string]string{"Q": "it's\n\"$(x)\""}, `printf %s "$Q"`, "it's\n\"$(x)\""},
		{"large value", map[string]string{"BIG": strings.Repeat("x", 100<<10)}, `printf %s "$BIG" | wc -c`, strconv.Itoa(100<<10) + "\n"},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			out, _, st := execIn(t, c, tt.cmd, guestlink.ExecOptions{Env: tt.env})
			if out != tt.want || st.Code != 0 {
				t.Errorf("got %q (%+v), want %q", out, st, tt.want)
			}
		})
	}
	refused := []struct {
		name string
		env  map[string]string
	}{
		{"name with =", map[string]string{"A=B": "x"}},
		{"name with a space", map[string]string{"A B": "x"}},
		{"name starting with a digit", map[string]string{"1A": "x"}},
		{"empty name", map[string]string{"": "x"}},
		{"NUL in the value", map[string]string{"A": "x\x00y"}},
		{"too many bytes in all", hugeEnv(6, 200<<10)},
		{"too many variables", hugeEnv(maxEnvVars+1, 1)},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := c.Exec(t.Context(), "true", guestlink.ExecOptions{Env: tt.env}); err == nil {
				t.Errorf("environment accepted")
			}
		})
	}
	t.Run("a value larger than an SSH packet ends only that connection", func(t *testing.T) {
		other := g.dial(t)
		_, err := other.Exec(t.Context(), "true", guestlink.ExecOptions{Env: map[string]string{"HUGE": strings.Repeat("y", 2<<20)}})
		if err == nil {
			t.Errorf("a 2 MiB variable was accepted")
		}
		if out, _, _ := execIn(t, c, "echo alive", guestlink.ExecOptions{}); out != "alive\n" {
			t.Errorf("server after a huge variable: got %q", out)
		}
	})
}

func hugeEnv(n, size int) map[string]string {
	m := map[string]string{}
	for i := 0; i < n; i++ {
		m[fmt.Sprintf("V%d", i)] = strings.Repeat("v", size)
	}
	return m
}

func TestSignals(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	tests := []struct {
		name       string
		cmd        string
		sig        ssh.Signal
		wantOut    string
		wantStatus guestlink.ExitStatus
	}{
		{"trapped INT", "trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done", ssh.SIGINT, "ready\ngot-int\n", guestlink.ExitStatus{Code: 5}},
		{"TERM kills", "echo ready; exec sleep 60", ssh.SIGTERM, "ready\n", guestlink.ExitStatus{Signal: "TERM"}},
		{"KILL reaches the whole pipeline", "echo ready; sleep 60 | sleep 60", ssh.SIGKILL, "ready\n", guestlink.ExitStatus{Signal: "KILL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out lockedBuffer
			sigs := make(chan ssh.Signal, 1)
			res := make(chan guestlink.ExitStatus, 1)
			go func() {
				st, err := c.Exec(t.Context(), tt.cmd, guestlink.ExecOptions{Stdout: &out, Signals: sigs})
				if err != nil {
					t.Errorf("exec: %v", err)
				}
				res <- st
			}()
			waitUntil(t, "the command to start", func() bool { return strings.Contains(out.String(), "ready") })
			sigs <- tt.sig
			st := <-res
			st.CoreDumped = false
			if st != tt.wantStatus || out.String() != tt.wantOut {
				t.Errorf("got %q %+v, want %q %+v", out.String(), st, tt.wantOut, tt.wantStatus)
			}
		})
	}
	t.Run("the whole process group is signalled", func(t *testing.T) {
		g.killPIDFileAtCleanup(t, "child.pid")
		var out lockedBuffer
		sigs := make(chan ssh.Signal, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = c.Exec(t.Context(), "sh -c 'echo $$ > child.pid; exec sleep 60' & sleep 0.2; echo ready; wait", guestlink.ExecOptions{Stdout: &out, Signals: sigs})
		}()
		waitUntil(t, "the command to start", func() bool { return strings.Contains(out.String(), "ready") })
		pid, ok := readPID(g.path("child.pid"))
		if !ok {
			t.Fatal("no child pid")
		}
		sigs <- ssh.SIGTERM
		<-done
		waitUntil(t, "the background child to die", func() bool { return !alive(pid) })
	})
}

func TestExecContextCancel(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out lockedBuffer
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "trap 'touch got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done", guestlink.ExecOptions{Stdout: &out})
		errc <- err
	}()
	waitUntil(t, "the command to start", func() bool { return strings.Contains(out.String(), "ready") })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Exec: got %v, want context.Canceled", err)
	}
	waitUntil(t, "the command to get SIGTERM", func() bool { _, err := os.Stat(g.path("got-term")); return err == nil })
}

func TestShellPTY(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	t.Run("window-change reaches stty size", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		var out lockedBuffer
		resize := make(chan guestlink.WindowSize, 1)
		done := make(chan guestlink.ExitStatus, 1)
		go func() {
			st, err := c.Shell(t.Context(), guestlink.ShellOptions{
				Term: "xterm", Cols: 100, Rows: 30, Resize: resize, Stdin: pr, Stdout: &out,
				Command: "stty size; while read x && [ \"$x\" != q ]; do stty size; done; exit 7",
			})
			if err != nil {
				t.Errorf("shell: %v", err)
			}
			done <- st
		}()
		waitUntil(t, "the first size", func() bool { return strings.Contains(out.String(), "30 100") })
		resize <- guestlink.WindowSize{Cols: 120, Rows: 40}
		// The resize and the typed lines travel apart: ask again until the
		// shell reports the new size, then end its input.
		waitUntil(t, "the new size", func() bool {
			io.WriteString(pw, "go\n")
			return strings.Contains(out.String(), "40 120")
		})
		io.WriteString(pw, "q\n")
		if st := <-done; st.Code != 7 {
			t.Errorf("exit code: got %d, want 7", st.Code)
		}
	})
	t.Run("login shell on a terminal", func(t *testing.T) {
		var out lockedBuffer
		st, err := c.Shell(t.Context(), guestlink.ShellOptions{
			Term: "vt100", Stdout: &out,
			Stdin: strings.NewReader("echo \"0=$0 TERM=$TERM\"; tty; exit 3\n"),
		})
		if err != nil {
			t.Fatal(err)
		}
		if s := out.String(); !strings.Contains(s, "0=-sh TERM=vt100") || !strings.Contains(s, "/dev/pts/") || st.Code != 3 {
			t.Errorf("login shell: got %q (%+v)", s, st)
		}
	})
	t.Run("killed by a signal", func(t *testing.T) {
		st, err := c.Shell(t.Context(), guestlink.ShellOptions{Command: "kill -TERM $$"})
		if err != nil || st.Signal != "TERM" || st.ShellCode() != 143 {
			t.Errorf("got %+v, %v", st, err)
		}
	})
	t.Run("a process keeping the terminal does not hold the session", func(t *testing.T) {
		g.killPIDFileAtCleanup(t, "holder.pid")
		var out lockedBuffer
		st, err := c.Shell(t.Context(), guestlink.ShellOptions{Stdout: &out,
			Command: "setsid sh -c 'echo $$ > holder.pid; exec sleep 60' & sleep 0.2; echo bye"})
		if err != nil || st.Code != 0 || !strings.Contains(out.String(), "bye") {
			t.Errorf("got %q %+v, %v", out.String(), st, err)
		}
	})
	modes := []struct {
		name  string
		modes ssh.TerminalModes
		want  string
	}{
		{"echo off", ssh.TerminalModes{ssh.ECHO: 0}, " -echo "},
		{"echo on", ssh.TerminalModes{ssh.ECHO: 1}, " echo "},
		{"intr is ^B", ssh.TerminalModes{ssh.VINTR: 2}, "intr = ^B"},
		{"icrnl off", ssh.TerminalModes{ssh.ICRNL: 0}, " -icrnl "},
	}
	for _, tt := range modes {
		t.Run("modes "+tt.name, func(t *testing.T) {
			sess, err := g.raw(t).NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			if err := sess.RequestPty("xterm", 24, 80, tt.modes); err != nil {
				t.Fatal(err)
			}
			out, err := sess.Output("stty -a | tr '\\n;' '  '; echo")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(" "+string(out), tt.want) {
				t.Errorf("stty -a: got %q, want it to contain %q", out, tt.want)
			}
		})
	}
}

func TestSFTP(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	sc, err := c.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	f, err := sc.Create(g.path("x.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(f, "written over sftp"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := execIn(t, c, "cat x.txt", guestlink.ExecOptions{}); out != "written over sftp" {
		t.Errorf("file written over SFTP: got %q", out)
	}
	execIn(t, c, "printf guest > y.txt", guestlink.ExecOptions{})
	for _, p := range []string{g.path("y.txt"), "y.txt"} {
		t.Run(p, func(t *testing.T) {
			r, err := sc.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(r)
			r.Close()
			if err != nil || string(b) != "guest" {
				t.Errorf("file read over SFTP: got %q, %v", b, err)
			}
		})
	}
}

// TestSFTPLargeFile: a file far larger than one SFTP packet is read whole.
// The client once asked for 256 KiB reads, the server answered 32 KiB and
// the client took the short read for the end of the file (1.1 MB came back
// of every larger file).
func TestSFTPLargeFile(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	want := make([]byte, 3<<20+5)
	for i := range want {
		want[i] = byte(i*7 + i>>13)
	}
	if err := os.WriteFile(g.path("big.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := c.SFTP()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	r, err := sc.Open(g.path("big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got bytes.Buffer
	if _, err := r.WriteTo(&got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("read %d bytes over SFTP, want %d", got.Len(), len(want))
	}
}

func TestPoweroffRequest(t *testing.T) {
	t.Parallel()
	t.Run("accepted once", func(t *testing.T) {
		g := startGuest(t)
		c := g.dial(t)
		for i := 0; i < 2; i++ {
			if err := c.Poweroff(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		waitUntil(t, "poweroff", func() bool { return g.poweroff.Load() > 0 })
		// A second request must not start a second poweroff.
		time.Sleep(50 * time.Millisecond)
		if got := g.poweroff.Load(); got != 1 {
			t.Errorf("poweroff called %d times, want 1", got)
		}
	})
	t.Run("refused without a poweroff action", func(t *testing.T) {
		g := startGuest(t, withoutPoweroff())
		if err := g.dial(t).Poweroff(t.Context()); err == nil {
			t.Errorf("poweroff accepted by a server that cannot power off")
		}
	})
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	other, err := keys.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		cfg     func() *ssh.ClientConfig
		wantErr string
	}{
		{"right key and pinned host key", g.keys.ClientConfig, ""},
		{"client key not authorized", func() *ssh.ClientConfig {
			cfg := other.ClientConfig()
			cfg.HostKeyCallback = g.keys.HostKeyCallback()
			return cfg
		}, "unable to authenticate"},
		{"host key differs from the pinned one", func() *ssh.ClientConfig {
			cfg := g.keys.ClientConfig()
			cfg.HostKeyCallback = other.HostKeyCallback()
			return cfg
		}, "does not match the pinned key"},
		{"no host key pinning", func() *ssh.ClientConfig {
			cfg := g.keys.ClientConfig()
			cfg.HostKeyCallback = nil
			return cfg
		}, "no host key pinning"},
		{"password only", func() *ssh.ClientConfig {
			cfg := g.keys.ClientConfig()
			cfg.Auth = []ssh.AuthMethod{ssh.Password("root")}
			return cfg
		}, "unable to authenticate"},
		{"no authentication", func() *ssh.ClientConfig {
			cfg := g.keys.ClientConfig()
			cfg.Auth = nil
			return cfg
		}, "unable to authenticate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", g.addr)
			if err != nil {
				t.Fatal(err)
			}
			c, err := guestlink.Dial(t.Context(), conn, tt.cfg())
			if c != nil {
				defer c.Close()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("dial: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("dial: got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestOnlySessionChannels(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.raw(t)
	for _, typ := range []string{"forwarded-tcpip", "x11", "auth-agent@openssh.com", "direct-streamlocal@openssh.com", "bogus"} {
		t.Run("channel "+typ, func(t *testing.T) {
			_, _, err := c.OpenChannel(typ, nil)
			var oce *ssh.OpenChannelError
			if !errors.As(err, &oce) || oce.Reason != ssh.UnknownChannelType {
				t.Errorf("got %v, want an unknown channel type refusal", err)
			}
		})
	}
	for _, typ := range []string{"tcpip-forward", "streamlocal-forward@openssh.com", "cancel-tcpip-forward", "no-more-sessions@openssh.com"} {
		t.Run("global request "+typ, func(t *testing.T) {
			ok, _, err := c.SendRequest(typ, true, ssh.Marshal(struct {
				Addr string
				Port uint32
			}{"127.0.0.1", 0}))
			if err != nil || ok {
				t.Errorf("got ok=%v err=%v, want a refusal", ok, err)
			}
		})
	}
	t.Run("session requests for forwarding", func(t *testing.T) {
		ch, reqs, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		go ssh.DiscardRequests(reqs)
		for _, typ := range []string{"x11-req"} {
			if ok, err := ch.SendRequest(typ, true, nil); err != nil || ok {
				t.Errorf("%s: got ok=%v err=%v, want a refusal", typ, ok, err)
			}
		}
	})
}

func TestMalformedRequests(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.raw(t)
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 1}
	open := func(t *testing.T) ssh.Channel {
		ch, reqs, err := c.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.Close() })
		go ssh.DiscardRequests(reqs)
		return ch
	}
	send := func(ch ssh.Channel, typ string, payload []byte) bool {
		ok, err := ch.SendRequest(typ, true, payload)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		return ok
	}
	pty := func(term string, cols, rows uint32, modes string) []byte {
		return ssh.Marshal(ptyRequest{Term: term, Columns: cols, Rows: rows, Modes: modes})
	}
	exec := func(cmd string) []byte { return ssh.Marshal(struct{ Command string }{cmd}) }
	type step struct {
		typ     string
		payload []byte
		want    bool
	}
	var tests []struct {
		name  string
		steps []step
	}
	add := func(name string, steps ...step) {
		tests = append(tests, struct {
			name  string
			steps []step
		}{name, steps})
	}
	for _, typ := range []string{"env", "pty-req", "exec", "subsystem", "signal", "window-change"} {
		add("garbage "+typ, step{typ, garbage, false})
		add("empty "+typ, step{typ, nil, false})
	}
	add("unknown request", step{"shell-x", nil, false})
	add("signal before start", step{"signal", ssh.Marshal(struct{ Signal string }{"TERM"}), false})
	add("window-change without a pty", step{"window-change", ssh.Marshal(struct{ C, R, W, H uint32 }{80, 24, 0, 0}), false})
	add("second pty-req", step{"pty-req", pty("xterm", 80, 24, ""), true}, step{"pty-req", pty("xterm", 80, 24, ""), false})
	add("terminal name with control characters", step{"pty-req", pty("xterm\x1b]0;x\x07", 80, 24, ""), false})
	add("terminal name with a quote", step{"pty-req", pty("x'; reboot; '", 80, 24, ""), false})
	add("terminal name too long", step{"pty-req", pty(strings.Repeat("x", 4096), 80, 24, ""), false})
	add("truncated modes", step{"pty-req", pty("xterm", 80, 24, "\x35\x00\x00"), true}, step{"exec", exec("true"), true})
	add("modes with an undefined opcode", step{"pty-req", pty("xterm", 80, 24, "\xa0\x00\x00\x00\x01\x35\x00\x00\x00\x00"), true}, step{"exec", exec("true"), true})
	add("mode values out of range", step{"pty-req", pty("xterm", 80, 24, "\x01\xff\xff\xff\xff\x5a\xff\xff\xff\xff"), true}, step{"exec", exec("true"), true})
	add("unknown subsystem", step{"subsystem", ssh.Marshal(struct{ Name string }{"netconf"}), false})
	add("NUL in a command", step{"exec", exec("echo a\x00b"), false})
	add("second exec", step{"exec", exec("sleep 1"), true}, step{"exec", exec("true"), false},
		step{"shell", nil, false}, step{"subsystem", ssh.Marshal(struct{ Name string }{"sftp"}), false},
		step{"env", ssh.Marshal(struct{ Name, Value string }{"A", "b"}), false},
		step{"signal", ssh.Marshal(struct{ Signal string }{"NOPE"}), false},
		step{"signal", ssh.Marshal(struct{ Signal string }{"SIGTERM"}), false})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := open(t)
			for _, s := range tt.steps {
				if got := send(ch, s.typ, s.payload); got != s.want {
					t.Errorf("%s %q: got %v, want %v", s.typ, s.payload, got, s.want)
				}
			}
		})
	}
	t.Run("bogus terminal sizes are clamped", func(t *testing.T) {
		ch := open(t)
		if !send(ch, "pty-req", pty("xterm", 1<<31, 0, "")) {
			t.Fatal("pty-req with a huge size refused")
		}
		if !send(ch, "exec", exec("stty size")) {
			t.Fatal("exec refused")
		}
		b, _ := io.ReadAll(ch)
		if got := strings.TrimSpace(string(b)); got != "24 4096" {
			t.Errorf("clamped size: got %q, want %q", got, "24 4096")
		}
	})
	t.Run("the server still works", func(t *testing.T) {
		if out, _, _ := execIn(t, g.dial(t), "echo alive", guestlink.ExecOptions{}); out != "alive\n" {
			t.Errorf("got %q", out)
		}
	})
}

func TestServeConnBadPeers(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	tests := []struct {
		name string
		send []byte
	}{
		{"closes at once", nil},
		{"not SSH", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"endless version line", bytes.Repeat([]byte("A"), 64<<10)},
		{"garbage after the version", append([]byte("SSH-2.0-x\r\n"), bytes.Repeat([]byte{0xff}, 64<<10)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := net.Pipe()
			done := make(chan error, 1)
			go func() { done <- g.srv.ServeConn(t.Context(), a) }()
			go func() {
				_, _ = b.Write(tt.send)
				b.Close()
			}()
			go func() { _, _ = io.Copy(io.Discard, b) }()
			if err := <-done; err == nil {
				t.Errorf("ServeConn accepted a bad peer")
			}
		})
	}
}

func TestManyChannels(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.raw(t)
	var sessions []*ssh.Session
	for i := 0; i < maxChannels; i++ {
		s, err := c.NewSession()
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		if _, err := s.StdinPipe(); err != nil { // held open: cat runs until the end
			t.Fatal(err)
		}
		if err := s.Start("cat"); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		sessions = append(sessions, s)
	}
	_, err := c.NewSession()
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) || oce.Reason != ssh.ResourceShortage {
		t.Errorf("session %d: got %v, want a resource shortage", maxChannels+1, err)
	}
	for _, s := range sessions {
		s.Close()
	}
	waitUntil(t, "a free slot", func() bool {
		s, err := c.NewSession()
		if err != nil {
			return false
		}
		s.Close()
		return true
	})
}

func TestClientGoneEndsCommands(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	tests := []struct {
		name, cmd string
	}{
		{"hung up", "echo $$ > NAME; echo ready; exec sleep 60"},
		{"SIGHUP ignored, then killed", "trap '' HUP; echo $$ > NAME; echo ready; while :; do sleep 0.05; done"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("gone%d.pid", i)
			g.killPIDFileAtCleanup(t, name)
			c := g.raw(t)
			s, err := c.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			var out lockedBuffer
			s.Stdout = &out
			if err := s.Start(strings.ReplaceAll(tt.cmd, "NAME", name)); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the command to start", func() bool { return strings.Contains(out.String(), "ready") })
			pid, ok := readPID(g.path(name))
			if !ok {
				t.Fatal("no pid")
			}
			c.Close() // the host vanishes
			waitUntil(t, "the command to end", func() bool { return !alive(pid) })
		})
	}
}

// TestNoGoroutineLeak runs every kind of session, cleanly and not, and
// checks the server leaves no goroutine behind once its connections end.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("sessions", func(t *testing.T) {
		g := startGuest(t)
		c := g.dial(t)
		execIn(t, c, "echo x; cat", guestlink.ExecOptions{Stdin: strings.NewReader("y")})
		if _, err := c.Shell(t.Context(), guestlink.ShellOptions{Command: "stty size"}); err != nil {
			t.Fatal(err)
		}
		sc, err := c.SFTP()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sc.ReadDir("."); err != nil {
			t.Fatal(err)
		}
		sc.Close()
		// Sessions abandoned mid-command, with and without a pty.
		r := g.raw(t)
		for _, ptyReq := range []bool{false, true} {
			s, err := r.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			if ptyReq {
				if err := s.RequestPty("xterm", 24, 80, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Start("sleep 60"); err != nil {
				t.Fatal(err)
			}
		}
		// Half-open channels with nothing started.
		for i := 0; i < 5; i++ {
			if _, _, err := r.OpenChannel("session", nil); err != nil {
				t.Fatal(err)
			}
		}
		r.Close()
		c.Close()
	})
	waitUntil(t, "the server's goroutines to end", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

// BenchmarkExec measures a command's round trip over the control channel
// (loopback here; add the VM transport's latency in a real guest).
func BenchmarkExec(b *testing.B) {
	_, c := benchGuest(b)
	b.ResetTimer()
	for b.Loop() {
		st, err := c.Exec(b.Context(), "true", guestlink.ExecOptions{})
		if err != nil || st.Code != 0 {
			b.Fatal(err, st)
		}
	}
}

// BenchmarkExecThroughput measures stdout throughput of one command.
func BenchmarkExecThroughput(b *testing.B) {
	_, c := benchGuest(b)
	const size = 64 << 20
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		var n countingWriter
		if _, err := c.Exec(b.Context(), fmt.Sprintf("head -c %d /dev/zero", size), guestlink.ExecOptions{Stdout: &n}); err != nil || n.n.Load() != size {
			b.Fatal(err, n.n.Load())
		}
	}
}

func benchGuest(b *testing.B) (*Server, *guestlink.Client) {
	sk := keystest.New(b)
	k, hostSigner := sk.Keys, sk.HostSigner
	srv, err := NewServer(ServerConfig{HostKey: hostSigner, AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()}, WorkDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err == nil {
			_ = srv.ServeConn(context.Background(), conn)
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	ln.Close()
	c, err := guestlink.Dial(b.Context(), conn, k.ClientConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); <-done })
	return srv, c
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
