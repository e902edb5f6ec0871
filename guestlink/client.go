// Package guestlink is the host's end of the control channel: an SSH client
// for the vibedom guest agent that runs commands (with or without a
// pseudo-terminal), serves a forwarded SSH agent, opens SFTP, sets the
// guest's clock and asks the guest to power off. It speaks over any net.Conn
// the caller dialled (vsock, a virtio-serial socket), so it never knows
// which hypervisor is underneath.
//
// It is host-side code: nothing of it runs in the VM (the server it talks
// to is package guest), and it does not start or stop machines (package
// boot starts one and hands back a connected Client).
//
// Nothing the guest sends is trusted: exit statuses are parsed defensively
// and output goes only where the caller said.
package guestlink

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
)

// Client is an SSH connection to one guest agent. It is safe for concurrent
// use: each Exec or Shell opens its own channel.
type Client struct {
	conn     *ssh.Client
	stop     chan struct{}
	stopOnce sync.Once
	held     atomic.Bool // keepalives held while the VM is paused
	agent    agentState
}

// keepaliveEvery is the keepalive period. See keepalive.
const keepaliveEvery = 250 * time.Millisecond

// keepalive sends a keepalive request every period until the client is
// closed. Measured on QEMU (TCG) with a virtio-serial control port: about
// one connection in ten, a message stays held between the two ends until
// the next one passes, so a command's start or a subsystem request could
// wait forever for a reply that was already on its way. The keepalives are
// that next message; they cost a few bytes each way. At most one waits for
// its reply; while it waits, the others ask for none.
func (c *Client) keepalive(period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	waiting := make(chan struct{}, 1)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if c.held.Load() {
			continue
		}
		select {
		case waiting <- struct{}{}:
			go func() {
				defer func() { <-waiting }()
				_, _, _ = c.conn.SendRequest(proto.RequestKeepalive, true, nil)
			}()
		default:
			if _, _, err := c.conn.SendRequest(proto.RequestKeepalive, false, nil); err != nil {
				return
			}
		}
	}
}

// Dial waits for the guest agent's proto.ReadyBanner on conn (skipping up
// to 4 KiB of anything before it), then runs the SSH handshake. cfg must
// pin the guest's host key (keys.Session.ClientConfig does). ctx bounds the
// wait and the handshake only; on failure conn is closed.
func Dial(ctx context.Context, conn net.Conn, cfg *ssh.ClientConfig) (*Client, error) {
	if cfg == nil || cfg.HostKeyCallback == nil {
		conn.Close()
		return nil, errors.New("dial guest: no host key pinning configured")
	}
	type result struct {
		c   ssh.Conn
		ch  <-chan ssh.NewChannel
		rq  <-chan *ssh.Request
		err error
	}
	done := make(chan result, 1)
	go func() {
		stopNudge := nudge(conn)
		err := readBanner(conn)
		stopNudge()
		if err != nil {
			done <- result{err: err}
			return
		}
		c, ch, rq, err := ssh.NewClientConn(conn, "vibedom-guest", cfg)
		done <- result{c, ch, rq, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			conn.Close()
			return nil, fmt.Errorf("SSH handshake with the guest: %w", r.err)
		}
		c := &Client{conn: ssh.NewClient(r.c, r.ch, r.rq), stop: make(chan struct{})}
		go c.keepalive(keepaliveEvery)
		return c, nil
	case <-ctx.Done():
		conn.Close()
		<-done
		return nil, fmt.Errorf("SSH handshake with the guest: %w", ctx.Err())
	}
}

// nudge writes an empty line to conn every half second until stop is
// called (stop returns once the writer is done, so nothing interleaves with
// the SSH version line). On QEMU's virtio-serial port a message from the
// guest can stay held until the next one from the host passes (see
// keepalive): the banner is such a message, and the host has nothing else
// to send before it. The guest's SSH server ignores lines before the
// client's version line (up to 1024 of them; this sends at most 900).
func nudge(conn net.Conn) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for i := 0; i < 900; i++ {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if _, err := conn.Write([]byte("\n")); err != nil {
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}

// readBanner reads up to and including proto.ReadyBanner, one byte at a
// time so nothing after it is consumed. Anything else the guest wrote first
// (at most 4 KiB) is skipped.
func readBanner(conn net.Conn) error {
	want := []byte(proto.ReadyBanner)
	var got []byte
	b := make([]byte, 1)
	for n := 0; n < 4096+len(want); n++ {
		if _, err := io.ReadFull(conn, b); err != nil {
			return fmt.Errorf("wait for the guest agent: %w", err)
		}
		got = append(got, b[0])
		if len(got) > len(want) {
			got = got[1:]
		}
		if string(got) == string(want) {
			return nil
		}
	}
	return errors.New("the guest agent did not announce itself")
}

// Close closes the connection and every channel on it.
func (c *Client) Close() error {
	c.stopOnce.Do(func() { close(c.stop) })
	return c.conn.Close()
}

// Wait blocks until the connection is closed and returns why.
func (c *Client) Wait() error { return c.conn.Wait() }

// ExitStatus is how a guest command ended.
type ExitStatus struct {
	// Code is the exit code when the command exited normally.
	Code int
	// Signal is the signal's name without "SIG" ("KILL", "TERM") when a
	// signal killed the command, else "". A signal without a name is
	// "<number>@vibedom"; a name that does not look like one is "UNKNOWN".
	Signal string
	// CoreDumped reports a core dump with Signal.
	CoreDumped bool
}

// ShellCode is the exit status as a shell reports it: Code, or 128 plus the
// signal's Linux number when a signal killed the command (255 for a signal
// this package cannot number).
func (s ExitStatus) ShellCode() int {
	if s.Signal == "" {
		return s.Code
	}
	if n, ok := signalNumbers[s.Signal]; ok {
		return 128 + n
	}
	// The guest names signals without a standard name "<number>@vibedom".
	if num, ok := strings.CutSuffix(s.Signal, "@vibedom"); ok {
		if n, err := strconv.Atoi(num); err == nil && n > 0 && n < 128 {
			return 128 + n
		}
	}
	return 255
}

// Success reports whether the command exited with status 0.
func (s ExitStatus) Success() bool { return s.Signal == "" && s.Code == 0 }

// String describes the status as a user would want it.
func (s ExitStatus) String() string {
	if s.Signal != "" {
		core := ""
		if s.CoreDumped {
			core = " (core dumped)"
		}
		return "killed by SIG" + s.Signal + core
	}
	return fmt.Sprintf("exit status %d", s.Code)
}

// signalNumbers are Linux's numbers (the guest is Linux whatever the host).
var signalNumbers = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
	"USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16, "CHLD": 17,
	"CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25,
	"VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31,
}

// ExecOptions are the streams and environment of a command without a TTY.
type ExecOptions struct {
	// Stdin is copied to the command; when it ends the command sees EOF.
	// nil gives the command an empty stdin.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output; nil discards it.
	Stdout, Stderr io.Writer
	// Env is added to the command's environment.
	Env map[string]string
	// Signals delivers signals to send to the command's process group
	// (ssh.SIGINT, ssh.SIGTERM …) while it runs.
	Signals <-chan ssh.Signal
	// ForwardAgent gives the command SSH_AUTH_SOCK, a socket to the agent
	// given to ServeAgent (ErrNoAgent without one).
	ForwardAgent bool
}

// Exec runs cmd through /bin/sh -c in the guest (working directory /work)
// and waits for it. The error is non-nil only when the command could not be
// run or its status was lost; a failing command is a non-zero ExitStatus.
// When ctx ends, the command gets SIGTERM, then SIGKILL two seconds later,
// and Exec returns ctx's error.
func (c *Client) Exec(ctx context.Context, cmd string, o ExecOptions) (ExitStatus, error) {
	sess, err := c.open(ctx, false, func(sess *ssh.Session) error {
		if err := setEnv(sess, o.Env); err != nil {
			return err
		}
		if o.ForwardAgent {
			if err := c.requestAgent(sess); err != nil {
				return err
			}
		}
		if err := feedStdin(sess, o.Stdin); err != nil {
			return err
		}
		sess.Stdout = orDiscard(o.Stdout)
		sess.Stderr = orDiscard(o.Stderr)
		if err := sess.Start(cmd); err != nil {
			return fmt.Errorf("start a command in the guest: %w", err)
		}
		return nil
	})
	if err != nil {
		return ExitStatus{}, err
	}
	defer sess.Close()
	return wait(ctx, sess, o.Signals, false)
}

// open opens a session channel and sets it up (requests that wait for the
// guest's answer), giving up when ctx ends: a guest that stopped answering
// must not hang the host. A session that completes after that is killed
// and closed, or with kept (a kept terminal: ending ctx detaches) only
// closed.
func (c *Client) open(ctx context.Context, kept bool, setup func(*ssh.Session) error) (*ssh.Session, error) {
	type result struct {
		s   *ssh.Session
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := c.conn.NewSession()
		if err != nil {
			done <- result{nil, fmt.Errorf("open a session to the guest: %w", err)}
			return
		}
		if err := setup(s); err != nil {
			s.Close()
			done <- result{nil, err}
			return
		}
		done <- result{s, nil}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.s != nil {
				// A kept terminal's command goes on when ctx ends (the
				// guest may have started it, or it ran before this
				// attach): only the channel ends.
				if !kept {
					_ = r.s.Signal(ssh.SIGKILL)
				}
				r.s.Close()
			}
		}()
		return nil, fmt.Errorf("the guest did not answer: %w", ctx.Err())
	}
}

// ExitError is the error of Output when the command ran but failed.
type ExitError struct {
	Status ExitStatus
	// Stderr is the end of the command's standard error (at most 4 KiB).
	Stderr []byte
}

func (e *ExitError) Error() string {
	msg := "guest command failed: " + e.Status.String()
	if s := strings.TrimSpace(string(e.Stderr)); s != "" {
		msg += ": " + s
	}
	return msg
}

// Output runs cmd like Exec with no input and returns its standard output.
// A command that runs but fails gives an *ExitError holding its status and
// the end of its standard error.
func (c *Client) Output(ctx context.Context, cmd string) ([]byte, error) {
	var out bytes.Buffer
	errTail := &tailBuffer{max: 4096}
	st, err := c.Exec(ctx, cmd, ExecOptions{Stdout: &out, Stderr: errTail})
	if err != nil {
		return out.Bytes(), err
	}
	if !st.Success() {
		return out.Bytes(), &ExitError{Status: st, Stderr: errTail.buf}
	}
	return out.Bytes(), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

// WindowSize is a terminal size in character cells.
type WindowSize struct {
	Cols, Rows int
}

// ShellOptions configure a command on a pseudo-terminal.
type ShellOptions struct {
	// Term is the terminal type ($TERM); "" means xterm-256color.
	Term string
	// Cols and Rows are the initial size; zero means 80x24.
	Cols, Rows int
	// Resize delivers new sizes until it is closed or the command ends.
	Resize <-chan WindowSize
	// Stdin and Stdout are the terminal's input and output (a PTY merges
	// stderr into stdout).
	Stdin  io.Reader
	Stdout io.Writer
	// Command runs instead of a login shell when non-empty.
	Command string
	// Env is added to the environment.
	Env map[string]string
	// Signals delivers signals to send to the command's process group
	// while it runs.
	Signals <-chan ssh.Signal
	// Keep, when set, names a kept terminal (proto.KeepVar): the first
	// Shell with a name starts the command on a terminal the guest keeps;
	// later ones attach to it and first get its recent output. Ending ctx
	// then detaches instead of signalling the command.
	Keep string
	// ForwardAgent gives the command SSH_AUTH_SOCK, a socket to the agent
	// given to ServeAgent (ErrNoAgent without one).
	ForwardAgent bool
}

// Shell runs a login shell (or o.Command) on a pseudo-terminal in the guest
// and waits for it to end.
func (c *Client) Shell(ctx context.Context, o ShellOptions) (ExitStatus, error) {
	if o.Term == "" {
		o.Term = "xterm-256color"
	}
	if o.Cols <= 0 || o.Rows <= 0 {
		o.Cols, o.Rows = 80, 24
	}
	sess, err := c.open(ctx, o.Keep != "", func(sess *ssh.Session) error {
		if err := setEnv(sess, o.Env); err != nil {
			return err
		}
		if o.Keep != "" {
			if err := sess.Setenv(proto.KeepVar, o.Keep); err != nil {
				return fmt.Errorf("ask the guest for a kept terminal: %w", err)
			}
		}
		if o.ForwardAgent {
			if err := c.requestAgent(sess); err != nil {
				return err
			}
		}
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := sess.RequestPty(o.Term, o.Rows, o.Cols, modes); err != nil {
			return fmt.Errorf("ask the guest for a terminal: %w", err)
		}
		if err := feedStdin(sess, o.Stdin); err != nil {
			return err
		}
		sess.Stdout = orDiscard(o.Stdout)
		sess.Stderr = sess.Stdout
		var err error
		if o.Command != "" {
			err = sess.Start(o.Command)
		} else {
			err = sess.Shell()
		}
		if err != nil {
			return fmt.Errorf("start a shell in the guest: %w", err)
		}
		return nil
	})
	if err != nil {
		return ExitStatus{}, err
	}
	defer sess.Close()
	stop := make(chan struct{})
	defer close(stop)
	if o.Resize != nil {
		go func() {
			for {
				select {
				case ws, ok := <-o.Resize:
					if !ok {
						return
					}
					if ws.Cols > 0 && ws.Rows > 0 {
						_ = sess.WindowChange(ws.Rows, ws.Cols)
					}
				case <-stop:
					return
				}
			}
		}()
	}
	return wait(ctx, sess, o.Signals, o.Keep != "")
}

// ErrDetached is returned by a kept-terminal Shell whose ctx ended: the
// channel was closed and the command keeps running in the guest.
var ErrDetached = errors.New("detached")

// feedStdin copies r (nil: nothing) to the command's stdin and closes it at
// r's end. The copy is not part of the session's Wait: a command that ends
// while r (a terminal, say) has no input must not wait for a keystroke. The
// copy goroutine ends at r's next read or write error; callers passing a
// blocking reader make it interruptible (session does).
func feedStdin(sess *ssh.Session, r io.Reader) error {
	w, err := sess.StdinPipe()
	if err != nil {
		return fmt.Errorf("open the command's stdin: %w", err)
	}
	if r == nil {
		return w.Close()
	}
	go func() {
		_, _ = io.Copy(w, r)
		_ = w.Close()
	}()
	return nil
}

// killGrace is how long a command gets between SIGTERM and SIGKILL when
// the caller's context ends.
const killGrace = 2 * time.Second

// wait waits for sess, forwarding signals. When ctx ends it signals the
// command (TERM, then KILL), or with detach only closes the channel and
// returns ErrDetached.
func wait(ctx context.Context, sess *ssh.Session, signals <-chan ssh.Signal, detach bool) (ExitStatus, error) {
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	for ctx.Err() == nil {
		select {
		case err := <-done:
			return exitStatus(err)
		case sig, ok := <-signals:
			if !ok {
				signals = nil
			} else {
				_ = sess.Signal(sig)
			}
		case <-ctx.Done():
		}
	}
	if detach {
		// A kept terminal's command goes on: only the channel ends.
		sess.Close()
		return ExitStatus{}, ErrDetached
	}
	_ = sess.Signal(ssh.SIGTERM)
	select {
	case <-done:
	case <-time.After(killGrace):
		_ = sess.Signal(ssh.SIGKILL)
		select {
		case <-done:
		case <-time.After(killGrace):
		}
	}
	return ExitStatus{}, ctx.Err()
}

// ErrNoExitStatus means the guest closed a command's channel without its
// exit status: the VM stopped, or, on a kept terminal, the guest detached
// a channel that could not keep up with the output (the command goes on).
var ErrNoExitStatus = errors.New("the guest closed the session without an exit status (did the VM stop?)")

func exitStatus(err error) (ExitStatus, error) {
	if err == nil {
		return ExitStatus{}, nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		st := ExitStatus{Code: ee.ExitStatus(), Signal: ee.Signal()}
		if st.Signal != "" {
			st.Signal = cleanSignal(strings.TrimPrefix(st.Signal, "SIG"))
			st.Code = 0
			st.CoreDumped = strings.Contains(ee.Msg(), "core dumped")
		}
		return st, nil
	}
	var em *ssh.ExitMissingError
	if errors.As(err, &em) {
		return ExitStatus{}, ErrNoExitStatus
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
		return ExitStatus{}, fmt.Errorf("lost the connection to the guest: %w", err)
	}
	return ExitStatus{}, err
}

// cleanSignal keeps a signal name the guest sent only when it looks like
// one, so it can be shown to the user safely.
func cleanSignal(name string) string {
	if name == "" || len(name) > 32 {
		return "UNKNOWN"
	}
	for _, r := range name {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '@' || r == '.' || r == '_' || r == '-') {
			return "UNKNOWN"
		}
	}
	return name
}

func setEnv(sess *ssh.Session, env map[string]string) error {
	for k, v := range env {
		if err := sess.Setenv(k, v); err != nil {
			return fmt.Errorf("set %s in the guest: %w", k, err)
		}
	}
	return nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// SFTP opens the guest's SFTP subsystem. Paths are absolute guest paths.
// Sessions collect changes with proto.CollectCommand, not over SFTP.
//
// The packet size stays at SFTP's 32 KiB: pkg/sftp's server answers no
// more than that, and its client takes a shorter answer than it asked for
// as the end of the file (asked for 256 KiB, every file over ~1.1 MB came
// back truncated).
func (c *Client) SFTP() (*sftp.Client, error) {
	sc, err := sftp.NewClient(c.conn, sftp.UseConcurrentReads(true))
	if err != nil {
		return nil, fmt.Errorf("open SFTP to the guest: %w", err)
	}
	return sc, nil
}

// SetTime sets the guest's wall clock to t (after a resume: the clock of
// a paused VM stands still).
func (c *Client) SetTime(ctx context.Context, t time.Time) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(t.UnixNano()))
	res := make(chan error, 1)
	go func() {
		ok, _, err := c.conn.SendRequest(proto.RequestSetTime, true, b[:])
		if err == nil && !ok {
			err = errors.New("the guest refused to set its clock")
		}
		res <- err
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("set the guest's clock: %w", ctx.Err())
	}
}

// ErrNoMemInfo means the guest agent does not report its memory (an agent
// older than proto.RequestMemInfo, or one that cannot read it).
var ErrNoMemInfo = errors.New("the guest agent does not report its memory")

// MemInfo asks the guest how much memory it has and how much of it new work
// could have. The answer is the guest's word: use it only for what a lying
// guest can only hurt itself with.
func (c *Client) MemInfo(ctx context.Context) (proto.MemInfo, error) {
	type result struct {
		mi  proto.MemInfo
		err error
	}
	res := make(chan result, 1)
	go func() {
		ok, payload, err := c.conn.SendRequest(proto.RequestMemInfo, true, nil)
		var r result
		switch {
		case err != nil:
			r.err = err
		case !ok:
			r.err = ErrNoMemInfo
		default:
			r.mi, r.err = proto.ParseMemInfo(payload)
		}
		res <- r
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return proto.MemInfo{}, fmt.Errorf("ask the guest for its memory: %w", r.err)
		}
		return r.mi, nil
	case <-ctx.Done():
		return proto.MemInfo{}, fmt.Errorf("ask the guest for its memory: %w", ctx.Err())
	}
}

// Hold stops (true) or restarts (false) the keepalives: a paused VM
// answers nothing, and requests queued meanwhile would only fill the
// control channel's buffers.
func (c *Client) Hold(hold bool) { c.held.Store(hold) }

// Poweroff asks the guest to end every process, unmount its filesystems and
// power off. It returns once the guest has accepted; the caller then waits
// for the machine to stop.
func (c *Client) Poweroff(ctx context.Context) error {
	var (
		once sync.Once
		res  = make(chan error, 1)
	)
	go func() {
		ok, _, err := c.conn.SendRequest(proto.RequestPoweroff, true, nil)
		if err == nil && !ok {
			err = errors.New("the guest refused to power off")
		}
		once.Do(func() { res <- err })
	}()
	select {
	case err := <-res:
		if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)) {
			return nil // the guest went down before it could answer
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("ask the guest to power off: %w", ctx.Err())
	}
}

// Connect dials the control channel with dial and runs Dial on it, each
// attempt bounded by attempt. When an attempt times out while ctx is still
// live it closes that connection and tries again: the guest agent reopens
// its end when the host goes away, and a fresh connection gets past a
// control-port stall (see keepalive) that a stuck handshake cannot.
func Connect(ctx context.Context, dial func(context.Context) (net.Conn, error), cfg *ssh.ClientConfig, attempt time.Duration) (*Client, error) {
	for {
		conn, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithTimeout(ctx, attempt)
		c, err := Dial(actx, conn, cfg)
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
	}
}
