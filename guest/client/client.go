// Package client is the host's side of the control channel: an SSH client
// for the vibedom guest agent that runs commands (with or without a
// pseudo-terminal), opens SFTP, and asks the guest to power off. It speaks
// over any net.Conn the caller dialled (vsock, a virtio-serial socket), so
// it never knows which hypervisor is underneath.
//
// Nothing the guest sends is trusted: exit statuses are parsed defensively
// and output goes only where the caller said.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
)

// Client is an SSH connection to one guest agent. It is safe for concurrent
// use: each Exec or Shell opens its own channel.
type Client struct {
	conn *ssh.Client
}

// Dial runs the SSH handshake over conn. cfg must pin the guest's host key
// (keys.Session.ClientConfig does). ctx bounds the handshake only; on
// failure conn is closed.
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
		c, ch, rq, err := ssh.NewClientConn(conn, "vibedom-guest", cfg)
		done <- result{c, ch, rq, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			conn.Close()
			return nil, fmt.Errorf("SSH handshake with the guest: %w", r.err)
		}
		return &Client{conn: ssh.NewClient(r.c, r.ch, r.rq)}, nil
	case <-ctx.Done():
		conn.Close()
		<-done
		return nil, fmt.Errorf("SSH handshake with the guest: %w", ctx.Err())
	}
}

// Close closes the connection and every channel on it.
func (c *Client) Close() error { return c.conn.Close() }

// Wait blocks until the connection is closed and returns why.
func (c *Client) Wait() error { return c.conn.Wait() }

// ExitStatus is how a guest command ended.
type ExitStatus struct {
	// Code is the exit code when the command exited normally.
	Code int
	// Signal is the signal's name without "SIG" ("KILL", "TERM") when a
	// signal killed the command, else "".
	Signal string
	// CoreDumped reports a core dump with Signal.
	CoreDumped bool
}

// ShellCode is the exit status as a shell reports it: Code, or 128 plus the
// signal's number when a signal killed the command.
func (s ExitStatus) ShellCode() int {
	if s.Signal == "" {
		return s.Code
	}
	if n, ok := signalNumbers[s.Signal]; ok {
		return 128 + n
	}
	return 128 + 127
}

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
}

// Exec runs cmd through /bin/sh -c in the guest (working directory /work)
// and waits for it. The error is non-nil only when the command could not be
// run or its status was lost; a failing command is a non-zero ExitStatus.
// When ctx ends, the command gets SIGTERM, then SIGKILL two seconds later,
// and Exec returns ctx's error.
func (c *Client) Exec(ctx context.Context, cmd string, o ExecOptions) (ExitStatus, error) {
	sess, err := c.conn.NewSession()
	if err != nil {
		return ExitStatus{}, fmt.Errorf("open a session to the guest: %w", err)
	}
	defer sess.Close()
	if err := setEnv(sess, o.Env); err != nil {
		return ExitStatus{}, err
	}
	if o.Stdin == nil {
		o.Stdin = strings.NewReader("")
	}
	sess.Stdin = o.Stdin
	sess.Stdout = orDiscard(o.Stdout)
	sess.Stderr = orDiscard(o.Stderr)
	if err := sess.Start(cmd); err != nil {
		return ExitStatus{}, fmt.Errorf("start %q in the guest: %w", cmd, err)
	}
	return wait(ctx, sess)
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
}

// Shell runs a login shell (or o.Command) on a pseudo-terminal in the guest
// and waits for it to end.
func (c *Client) Shell(ctx context.Context, o ShellOptions) (ExitStatus, error) {
	sess, err := c.conn.NewSession()
	if err != nil {
		return ExitStatus{}, fmt.Errorf("open a session to the guest: %w", err)
	}
	defer sess.Close()
	if err := setEnv(sess, o.Env); err != nil {
		return ExitStatus{}, err
	}
	if o.Term == "" {
		o.Term = "xterm-256color"
	}
	if o.Cols <= 0 || o.Rows <= 0 {
		o.Cols, o.Rows = 80, 24
	}
	modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
	if err := sess.RequestPty(o.Term, o.Rows, o.Cols, modes); err != nil {
		return ExitStatus{}, fmt.Errorf("ask the guest for a terminal: %w", err)
	}
	if o.Stdin == nil {
		o.Stdin = strings.NewReader("")
	}
	sess.Stdin = o.Stdin
	sess.Stdout = orDiscard(o.Stdout)
	sess.Stderr = sess.Stdout
	if o.Command != "" {
		err = sess.Start(o.Command)
	} else {
		err = sess.Shell()
	}
	if err != nil {
		return ExitStatus{}, fmt.Errorf("start a shell in the guest: %w", err)
	}
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
	return wait(ctx, sess)
}

// wait waits for sess, signalling the command when ctx ends.
func wait(ctx context.Context, sess *ssh.Session) (ExitStatus, error) {
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	select {
	case err := <-done:
		return exitStatus(err)
	case <-ctx.Done():
		_ = sess.Signal(ssh.SIGTERM)
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			_ = sess.Signal(ssh.SIGKILL)
			select {
			case <-done:
			case <-time.After(2 * time.Second):
			}
		}
		return ExitStatus{}, ctx.Err()
	}
}

func exitStatus(err error) (ExitStatus, error) {
	if err == nil {
		return ExitStatus{}, nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		st := ExitStatus{Code: ee.ExitStatus(), Signal: ee.Signal()}
		if st.Signal != "" {
			st.Signal = strings.TrimPrefix(strings.ToUpper(st.Signal), "SIG")
			st.Code = 0
			st.CoreDumped = strings.Contains(ee.Msg(), "core dumped")
		}
		return st, nil
	}
	var em *ssh.ExitMissingError
	if errors.As(err, &em) {
		return ExitStatus{}, errors.New("the guest closed the session without an exit status (did the VM stop?)")
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
		return ExitStatus{}, fmt.Errorf("lost the connection to the guest: %w", err)
	}
	return ExitStatus{}, err
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
func (c *Client) SFTP() (*sftp.Client, error) {
	sc, err := sftp.NewClient(c.conn, sftp.MaxPacketUnchecked(1<<18), sftp.UseConcurrentReads(true))
	if err != nil {
		return nil, fmt.Errorf("open SFTP to the guest: %w", err)
	}
	return sc, nil
}

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
