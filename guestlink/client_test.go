package guestlink

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/keys/keystest"
)

// fakeGuest is a minimal SSH server standing in for a guest that misbehaves:
// each exec command names what it answers.
type fakeGuest struct {
	keys *keys.Session
	cfg  *ssh.ServerConfig
}

func newFakeGuest(t *testing.T) *fakeGuest {
	t.Helper()
	sk := keystest.New(t)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) { return nil, nil }}
	cfg.AddHostKey(sk.HostSigner)
	return &fakeGuest{keys: sk.Keys, cfg: cfg}
}

// serve runs the fake guest on one end of a loopback connection, writing
// preamble first, and returns the other end.
func (f *fakeGuest) serve(t *testing.T, preamble string) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The listener is closed once it has accepted, not when serve returns:
	// closed with the connection still in its backlog (the goroutine not
	// yet at Accept, as on a loaded machine), it would reset it.
	go func() {
		conn, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, preamble); err != nil {
			return
		}
		if preamble != proto.ReadyBanner && !strings.HasSuffix(preamble, proto.ReadyBanner) {
			_, _ = io.Copy(io.Discard, conn) // stay silent
			return
		}
		_, chans, reqs, err := ssh.NewServerConn(conn, f.cfg)
		if err != nil {
			return
		}
		go f.global(reqs)
		for nc := range chans {
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			go f.session(ch, creqs)
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dial connects a Client to the fake guest; the test's end closes it.
func (f *fakeGuest) dial(t *testing.T) *Client {
	t.Helper()
	c, err := Dial(t.Context(), f.serve(t, proto.ReadyBanner), f.keys.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (f *fakeGuest) global(reqs <-chan *ssh.Request) {
	for r := range reqs {
		if r.Type == proto.RequestPoweroff {
			_ = r.Reply(false, nil) // this guest refuses
			continue
		}
		_ = r.Reply(false, nil)
	}
}

func (f *fakeGuest) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for r := range reqs {
		if r.Type != "exec" {
			_ = r.Reply(true, nil)
			continue
		}
		var e struct{ Command string }
		_ = ssh.Unmarshal(r.Payload, &e)
		_ = r.Reply(true, nil)
		switch e.Command {
		case "core":
			_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
				Signal     string
				CoreDumped bool
				Msg, Lang  string
			}{"SEGV", true, "core dumped", ""}))
		case "no status":
		case "garbage status":
			_, _ = ch.SendRequest("exit-status", false, []byte{1})
		case "huge status":
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{1 << 31}))
		case "weird signal":
			_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
				Signal     string
				CoreDumped bool
				Msg, Lang  string
			}{"\x1b[31mNOPE", false, "", ""}))
		}
		return
	}
}

func TestDial(t *testing.T) {
	t.Parallel()
	f := newFakeGuest(t)
	tests := []struct {
		name     string
		preamble string
		timeout  time.Duration
		wantErr  string
	}{
		{name: "banner", preamble: proto.ReadyBanner},
		{name: "console noise before the banner", preamble: "[    1.234] random: crng init done\r\n" + proto.ReadyBanner},
		{name: "no banner within 4 KiB", preamble: strings.Repeat("x", 8192), wantErr: "did not announce itself"},
		{name: "silent guest", preamble: "", timeout: 200 * time.Millisecond, wantErr: context.DeadlineExceeded.Error()},
		{name: "half a banner, then silence", preamble: proto.ReadyBanner[:5], timeout: 200 * time.Millisecond, wantErr: context.DeadlineExceeded.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			c, err := Dial(ctx, f.serve(t, tt.preamble), f.keys.ClientConfig())
			if c != nil {
				c.Close()
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Dial: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("Dial: got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestUntrustedStatus checks what a guest sends as a status is parsed
// defensively.
func TestUntrustedStatus(t *testing.T) {
	t.Parallel()
	c := newFakeGuest(t).dial(t)
	tests := []struct {
		cmd     string
		want    ExitStatus
		wantErr bool
	}{
		{cmd: "core", want: ExitStatus{Signal: "SEGV", CoreDumped: true}},
		{cmd: "no status", wantErr: true},
		{cmd: "garbage status", wantErr: true},
		{cmd: "huge status", want: ExitStatus{Code: 1 << 31}},
		{cmd: "weird signal", want: ExitStatus{Signal: "UNKNOWN"}},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			st, err := c.Exec(t.Context(), tt.cmd, ExecOptions{})
			if (err != nil) != tt.wantErr || st != tt.want {
				t.Errorf("got %+v, %v; want %+v, error %v", st, err, tt.want, tt.wantErr)
			}
			if code := st.ShellCode(); err == nil && tt.want.Signal != "" && (code < 129 || code > 255) {
				t.Errorf("shell code %d out of range", code)
			}
		})
	}
	t.Run("refused poweroff", func(t *testing.T) {
		if err := c.Poweroff(t.Context()); err == nil {
			t.Errorf("a refused poweroff reported success")
		}
	})
}

func TestExitStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		st      ExitStatus
		code    int
		str     string
		success bool
	}{
		{ExitStatus{}, 0, "exit status 0", true},
		{ExitStatus{Code: 42}, 42, "exit status 42", false},
		{ExitStatus{Signal: "KILL"}, 137, "killed by SIGKILL", false},
		{ExitStatus{Signal: "SEGV", CoreDumped: true}, 139, "killed by SIGSEGV (core dumped)", false},
		{ExitStatus{Signal: "36@vibedom"}, 164, "killed by SIG36@vibedom", false},
		{ExitStatus{Signal: "999@vibedom"}, 255, "killed by SIG999@vibedom", false},
		{ExitStatus{Signal: "NOPE"}, 255, "killed by SIGNOPE", false},
	}
	for _, tt := range tests {
		t.Run(tt.str, func(t *testing.T) {
			if got := tt.st.ShellCode(); got != tt.code {
				t.Errorf("ShellCode: got %d, want %d", got, tt.code)
			}
			if got := tt.st.String(); got != tt.str {
				t.Errorf("String: got %q, want %q", got, tt.str)
			}
			if got := tt.st.Success(); got != tt.success {
				t.Errorf("Success: got %v, want %v", got, tt.success)
			}
		})
	}
}

func TestExitErrorMessage(t *testing.T) {
	t.Parallel()
	err := error(&ExitError{Status: ExitStatus{Code: 2}, Stderr: []byte("no such file\n")})
	if got, want := err.Error(), "guest command failed: exit status 2: no such file"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Errorf("errors.As failed")
	}
	tb := &tailBuffer{max: 4}
	_, _ = tb.Write([]byte("abc"))
	_, _ = tb.Write([]byte("defg"))
	if string(tb.buf) != "defg" {
		t.Errorf("tail: got %q", tb.buf)
	}
}

// TestConnectRetriesAStalledAttempt: the first connection never answers
// (a stalled control port); Connect gives that attempt up after its bound,
// closes it, dials again and gets a working client.
func TestConnectRetriesAStalledAttempt(t *testing.T) {
	t.Parallel()
	f := newFakeGuest(t)
	var dials []net.Conn
	dial := func(context.Context) (net.Conn, error) {
		var c net.Conn
		if len(dials) == 0 {
			c = f.serve(t, "") // silent: the stall
		} else {
			c = f.serve(t, proto.ReadyBanner)
		}
		dials = append(dials, c)
		return c, nil
	}
	start := time.Now()
	c, err := Connect(t.Context(), dial, f.keys.ClientConfig(), 300*time.Millisecond)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer c.Close()
	if len(dials) != 2 {
		t.Fatalf("dialled %d times, want 2", len(dials))
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the stalled attempt was given up after %v, before its bound", d)
	}
	// The stalled connection was closed.
	dials[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := dials[0].Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the stalled connection is still open: %v", err)
	}
	st, err := c.Exec(t.Context(), "core", ExecOptions{})
	if err != nil || st.Signal != "SEGV" {
		t.Errorf("the client does not work: %v %v", st, err)
	}
}

// TestConnectGivesUpWithTheContext: when every attempt stalls, Connect
// returns once its context ends.
func TestConnectGivesUpWithTheContext(t *testing.T) {
	t.Parallel()
	f := newFakeGuest(t)
	n := 0
	dial := func(context.Context) (net.Conn, error) { n++; return f.serve(t, ""), nil }
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := Connect(ctx, dial, f.keys.ClientConfig(), 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || n < 3 {
		t.Errorf("Connect: %v after %d dials, want a deadline error after several", err, n)
	}
	// A dial error ends it at once.
	boom := errors.New("no control socket")
	if _, err := Connect(t.Context(), func(context.Context) (net.Conn, error) { return nil, boom }, f.keys.ClientConfig(), time.Second); !errors.Is(err, boom) {
		t.Errorf("dial error: %v", err)
	}
}

// TestMemInfoFromAnOlderGuest: a guest agent that does not know
// RequestMemInfo refuses it, and MemInfo says so with ErrNoMemInfo.
func TestMemInfoFromAnOlderGuest(t *testing.T) {
	t.Parallel()
	c := newFakeGuest(t).dial(t)
	if mi, err := c.MemInfo(t.Context()); !errors.Is(err, ErrNoMemInfo) {
		t.Fatalf("MemInfo = %+v, %v; want ErrNoMemInfo", mi, err)
	}
}
