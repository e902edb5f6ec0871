package session

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/keys/keystest"
)

// inProcessGuest is a guest agent served in this process on loopback,
// and the host's client to it.
func inProcessGuest(t *testing.T) *guestlink.Client { return inProcessGuestLog(t, nil) }

// inProcessGuestLog is inProcessGuest with the guest's diagnostics going
// to log (nil: nowhere).
func inProcessGuestLog(t *testing.T, log *slog.Logger) *guestlink.Client {
	t.Helper()
	sk := keystest.New(t)
	k, signer := sk.Keys, sk.HostSigner
	dir := t.TempDir()
	srv, err := guest.NewServer(guest.ServerConfig{HostKey: signer, AuthorizedKeys: []ssh.PublicKey{k.ClientSigner().PublicKey()},
		WorkDir: dir, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir}, Log: log})
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
	c, err := guestlink.Dial(t.Context(), conn, k.ClientConfig())
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

// TestForegroundTerminalFallingBehind: the guest detaches an attachment
// that cannot keep up with the agent's output (guest/kept_linux.go). When
// that is the foreground terminal of vibedom run (a slow terminal, a slow
// link to it), the session joins the agent's terminal again and goes on:
// it does not fail as if the VM had gone.
func TestForegroundTerminalFallingBehind(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	t.Cleanup(func() { tty.Close(); ptmx.Close() })
	behind, guestLog := fellBehind()
	s := &sess{ctl: newHostCtl(), client: inProcessGuestLog(t, guestLog), log: slog.New(slog.DiscardHandler),
		opts: Options{Terminal: &Terminal{In: tty, Out: tty}}}
	type result struct {
		st  guestlink.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := s.shell(t.Context(), guestlink.ShellOptions{Keep: keptAgent, Command: "yes | head -c 10000000; echo the-end; exit 3"})
		done <- result{st, err}
	}()
	// The terminal reads nothing until the guest's queue for it has
	// overflowed and the guest detached it. Then it reads everything.
	waitBehind(t, behind)
	go io.Copy(io.Discard, ptmx)
	select {
	case r := <-done:
		if r.err != nil || r.st.Code != 3 {
			t.Fatalf("the foreground terminal fell behind: status %v, err %v", r.st, r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the foreground session did not end with its agent")
	}
}

// TestAttachFallingBehind: a vibedom attach that cannot keep up is
// detached (docs/sessions.md), and told so, not that the VM stopped.
func TestAttachFallingBehind(t *testing.T) {
	s := controlHost(t, os.Getuid())
	behind, guestLog := fellBehind()
	s.client = inProcessGuestLog(t, guestLog)
	s.state.Agent = "command"
	s.plan.command = []string{"sh", "-c", "i=0; while [ $i -lt 100 ]; do yes | head -c 1000000; sleep 0.1; i=$((i+1)); done"}
	conn, err := DialControl(&Info{State: s.snapshotState(), Live: StatusRunning, Dir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Do(ControlRequest{Op: OpAttach, Term: "xterm", Cols: 80, Rows: 24}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	waitBehind(t, behind) // reads nothing meanwhile
	x, err := conn.Stream().Copy(io.Discard, io.Discard)
	if err != nil || !x.Detached || x.Error != "" {
		t.Fatalf("an attachment that fell behind: %+v, %v", x, err)
	}
}

// fellBehind returns a logger for the guest and a channel closed when the
// guest logs that it detached an attachment that fell behind its output.
func fellBehind() (<-chan struct{}, *slog.Logger) {
	h := &behindHandler{ch: make(chan struct{})}
	return h.ch, slog.New(h)
}

type behindHandler struct {
	once sync.Once
	ch   chan struct{}
}

func (h *behindHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *behindHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *behindHandler) WithGroup(string) slog.Handler            { return h }
func (h *behindHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "fell behind") {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}

// waitBehind waits until the guest has detached an attachment that fell
// behind (fellBehind).
func waitBehind(t *testing.T, behind <-chan struct{}) {
	t.Helper()
	select {
	case <-behind:
	case <-time.After(2 * time.Minute):
		t.Fatal("the guest never detached the attachment that reads nothing")
	}
}
