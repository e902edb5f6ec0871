// Package boot starts a VM and connects to the guest agent in it: the one
// boot sequence that sessions and the backend conformance suite share. It
// calls vm.Driver.Start, then dials the control channel and completes the
// SSH handshake, giving up as soon as the machine dies or the time allowed
// runs out, and explains a failed boot with the end of the VM's console.
//
// It does not build what the machine boots (kernel, initrd, disks: see
// package image), stop the machine when the boot fails (the caller owns
// it from Driver.Start on), or retry a boot.
package boot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
)

// attempt bounds one dial-and-handshake attempt: a stalled one is
// abandoned and the channel dialled again (see guestlink.Connect).
const attempt = 30 * time.Second

// TailLines is how many lines of the console an Error shows.
const TailLines = 15

// Options are what Start needs besides the machine's configuration.
type Options struct {
	// Client authenticates the host to the guest agent and pins the
	// agent's host key.
	Client *ssh.ClientConfig
	// Timeout bounds the wait for the agent, counted from the machine
	// running; zero leaves it to ctx.
	Timeout time.Duration
	// Started, if set, is called once the machine runs, before the wait
	// for the agent: a caller records the machine (for its cleanup, in
	// its state) here.
	Started func(vm.Machine)
}

// Timings are how long the steps of a boot took.
type Timings struct {
	VMStart time.Duration // Driver.Start until the hypervisor runs the VM
	Ready   time.Duration // the VM running until the SSH handshake completed
	// Handshake is the SSH handshake proper: from the guest agent's first
	// byte on the control channel until it completed.
	Handshake time.Duration
	// Answer is the VM running until the guest agent's first byte: the
	// firmware, the kernel, PID 1's set-up and the agent's start.
	Answer time.Duration
	// Guest is the guest's own account (GuestTimings), nil when its
	// console has none.
	Guest []Step
}

// Error is a boot that got as far as a running machine and failed there:
// the agent did not answer in time, the machine died, or the handshake
// failed. Its message ends with the last lines of the console log,
// control characters escaped.
type Error struct {
	Err     error  // what went wrong
	Console string // the console log's path ("" if none)
	Tail    string // its last TailLines non-empty lines, indented, escaped
}

// NewError makes the Error for err, reading the tail of the console log
// at console.
func NewError(err error, console string) *Error {
	e := &Error{Err: err, Console: console}
	if console != "" {
		e.Tail = ConsoleTail(console, TailLines)
	}
	return e
}

func (e *Error) Error() string {
	if e.Tail == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("%v\nlast lines of the VM console (%s):\n%s", e.Err, termtext.Line(e.Console), e.Tail)
}

func (e *Error) Unwrap() error { return e.Err }

// Start starts a machine from cfg on d and connects to its guest agent
// with o.Client. It returns the machine and a connected client, or an
// error:
//   - Driver.Start failed: the error says "start the VM", and no machine
//     is returned (nor o.Started called);
//   - ctx ended: ctx.Err();
//   - the machine died, the agent did not answer within o.Timeout, or the
//     handshake failed: an *Error.
//
// Whenever the machine started, it is returned, error or not, and the
// caller stops it. Timings hold the steps that were reached.
func Start(ctx context.Context, d vm.Driver, cfg vm.Config, o Options) (vm.Machine, *guestlink.Client, Timings, error) {
	var t Timings
	t0 := time.Now()
	m, err := d.Start(ctx, cfg)
	if err != nil {
		return nil, nil, t, fmt.Errorf("start the VM: %w", err)
	}
	t.VMStart = time.Since(t0)
	if o.Started != nil {
		o.Started(m)
	}

	// Wait for the guest agent, but give up at once if the VM dies.
	t1 := time.Now()
	bctx, cancel := context.WithCancel(ctx)
	if o.Timeout > 0 {
		bctx, cancel = context.WithTimeout(ctx, o.Timeout)
	}
	defer cancel()
	died := make(chan error, 1)
	go func() { died <- m.Wait(bctx) }()
	type dialed struct {
		c         *guestlink.Client
		handshake time.Duration
		err       error
	}
	ready := make(chan dialed, 1)
	go func() {
		// The SSH handshake starts with the guest's version line: its
		// first byte splits the wait for the guest from the handshake.
		var mu sync.Mutex
		var answered time.Time
		dial := func(ctx context.Context) (net.Conn, error) {
			c, err := m.DialControl(ctx)
			if err != nil {
				return nil, err
			}
			return &firstRead{Conn: c, at: func() {
				mu.Lock()
				answered = time.Now()
				mu.Unlock()
			}}, nil
		}
		c, err := guestlink.Connect(bctx, dial, o.Client, attempt)
		done := time.Now()
		mu.Lock()
		defer mu.Unlock()
		var hs time.Duration
		if !answered.IsZero() {
			hs = done.Sub(answered)
		}
		ready <- dialed{c: c, handshake: hs, err: err}
	}()
	var failed error
	select {
	case r := <-ready:
		if r.err == nil {
			t.Ready = time.Since(t1)
			t.Handshake = r.handshake
			t.Answer = t.Ready - r.handshake
			if cfg.ConsoleLog != "" {
				t.Guest = GuestTimings(cfg.ConsoleLog)
			}
			return m, r.c, t, nil
		}
		failed = r.err
	case err := <-died:
		// A handshake that completes after all is not wanted.
		go func() {
			if r := <-ready; r.c != nil {
				r.c.Close()
			}
		}()
		failed = err
		if failed == nil {
			failed = errors.New("the guest powered off")
		}
	}
	switch {
	case ctx.Err() != nil:
		return m, nil, t, ctx.Err()
	case bctx.Err() != nil:
		failed = fmt.Errorf("no answer from the guest agent within %v", o.Timeout)
	}
	return m, nil, t, NewError(failed, cfg.ConsoleLog)
}

// ConsoleTail returns the last n non-empty lines of the console log at
// path, each indented by two spaces and escaped with termtext.Text (the
// console is guest output), or "" when there is none. It reads at most the
// last 64 KiB.
func ConsoleTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	data, _ := io.ReadAll(io.LimitReader(f, max))
	var lines []string
	for _, l := range strings.Split(strings.ReplaceAll(string(data), "\r", ""), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, "  "+termtext.Text(l))
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
