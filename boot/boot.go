// Package boot starts a VM and connects to the guest agent in it: the one
// boot sequence that sessions and the backend conformance suite share. It
// calls vm.Driver.Start, then dials the control channel and completes the
// SSH handshake, giving up as soon as the machine dies or the time allowed
// runs out, and explains a failed boot with the end of the VM's console.
//
// It does not build what the machine boots (kernel, initrd, disks: see
// package image), stop the machine when the boot fails (the caller owns
// it from Driver.Start on), or retry a boot, but for one case: a guest
// that stays silent under acceleration its driver chose by a probe is
// booted once more emulated (vm.AccelFallback).
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
	// its state) here. It is called again for a machine started anew
	// (see AccelGrace).
	Started func(vm.Machine)
	// AccelGrace is how long a guest under acceleration that its driver
	// chose by a probe has to send its first byte before Start boots it
	// again emulated; zero means DefaultAccelGrace.
	AccelGrace time.Duration
	// Notice, if set, receives a sentence for the user when Start falls
	// back to emulation.
	Notice func(string)
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
// A machine under acceleration its driver chose by a probe
// (vm.AccelFallback) gets o.AccelGrace to answer; if it stays silent
// that long, Start kills it, tells the driver to emulate, says so through
// o.Notice and starts the machine once more, within what is left of
// o.Timeout. o.Started is called for each machine.
//
// Whenever a machine started, the last one is returned, error or not, and
// the caller stops it. Timings hold the steps that were reached.
func Start(ctx context.Context, d vm.Driver, cfg vm.Config, o Options) (vm.Machine, *guestlink.Client, Timings, error) {
	first := time.Now()
	for retried := false; ; retried = true {
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
		timeout := o.Timeout
		if timeout > 0 {
			// The time allowed counts from the first machine running.
			timeout -= time.Since(first) - t.VMStart
			if timeout <= 0 {
				timeout = time.Millisecond
			}
		}
		grace := time.Duration(0)
		if fb, ok := d.(vm.AccelFallback); ok && !retried && fb.Probed(m) {
			grace = o.AccelGrace
			if grace == 0 {
				grace = DefaultAccelGrace
			}
			if timeout > 0 && grace >= timeout {
				grace = 0
			}
		}
		c, err := wait(ctx, m, cfg, o, &t, timeout, grace)
		if errors.Is(err, errGrace) {
			_ = m.Kill()
			d.(vm.AccelFallback).FallBack(cfg)
			if o.Notice != nil {
				o.Notice(fmt.Sprintf("the guest did not answer within %v under hardware acceleration (KVM), "+
					"although a probe boot worked: booting again emulated (TCG), which is slower; "+
					"`vibedom doctor` shows the verdict kept for later sessions", grace))
			}
			continue
		}
		return m, c, t, err
	}
}

// DefaultAccelGrace is how long a guest under probed acceleration has to
// answer before Start boots it again emulated: many times what a working
// KVM guest needs (about a second), under any load.
const DefaultAccelGrace = 45 * time.Second

// errGrace is wait's answer when the guest was silent for the grace.
var errGrace = errors.New("no answer within the acceleration grace")

// wait waits for m's guest agent for timeout (zero: until ctx ends), and
// returns errGrace if a nonzero grace passes first without a byte from the
// agent.
func wait(ctx context.Context, m vm.Machine, cfg vm.Config, o Options, t *Timings, timeout, grace time.Duration) (*guestlink.Client, error) {
	// Wait for the guest agent, but give up at once if the VM dies.
	t1 := time.Now()
	bctx, cancel := context.WithCancel(ctx)
	if timeout > 0 {
		bctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	var graceC <-chan time.Time
	if grace > 0 {
		gt := time.NewTimer(grace)
		defer gt.Stop()
		graceC = gt.C
	}
	died := make(chan error, 1)
	go func() { died <- m.Wait(bctx) }()
	type dialed struct {
		c         *guestlink.Client
		handshake time.Duration
		err       error
	}
	ready := make(chan dialed, 1)
	var mu sync.Mutex
	var answered time.Time
	go func() {
		// The SSH handshake starts with the guest's version line: its
		// first byte splits the wait for the guest from the handshake.
		dial := func(ctx context.Context) (net.Conn, error) {
			c, err := m.DialControl(ctx)
			if err != nil {
				return nil, err
			}
			return &firstRead{Conn: c, at: func() {
				mu.Lock()
				if answered.IsZero() {
					answered = time.Now()
				}
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
	// discard closes a handshake that completes after all.
	discard := func() {
		go func() {
			if r := <-ready; r.c != nil {
				r.c.Close()
			}
		}()
	}
	var failed error
	for failed == nil {
		select {
		case r := <-ready:
			if r.err == nil {
				t.Ready = time.Since(t1)
				t.Handshake = r.handshake
				t.Answer = t.Ready - r.handshake
				if cfg.ConsoleLog != "" {
					t.Guest = GuestTimings(cfg.ConsoleLog)
				}
				return r.c, nil
			}
			failed = r.err
		case err := <-died:
			discard()
			failed = err
			if failed == nil {
				failed = errors.New("the guest powered off")
			}
		case <-graceC:
			mu.Lock()
			silent := answered.IsZero()
			mu.Unlock()
			if silent {
				cancel()
				discard()
				return nil, errGrace
			}
		}
	}
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case bctx.Err() != nil:
		failed = fmt.Errorf("no answer from the guest agent within %v", o.Timeout)
	}
	return nil, NewError(failed, cfg.ConsoleLog)
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
