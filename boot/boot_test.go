package boot

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/keys/keystest"
	"github.com/vibedom/vibedom/vm"
)

// fakeDriver starts fakeMachines, or fails with err.
type fakeDriver struct {
	m   *fakeMachine
	err error
}

var _ vm.Driver = (*fakeDriver)(nil)

func (d *fakeDriver) Name() string                             { return "fake" }
func (d *fakeDriver) Info() vm.Info                            { return vm.Info{} }
func (d *fakeDriver) Available(context.Context, vm.Arch) error { return nil }
func (d *fakeDriver) Start(context.Context, vm.Config) (vm.Machine, error) {
	if d.err != nil {
		return nil, d.err
	}
	return d.m, nil
}

// fakeMachine dials with dial; it dies (Wait returns waitErr) when died
// is closed.
type fakeMachine struct {
	dial    func(context.Context) (net.Conn, error)
	died    chan struct{}
	waitErr error
	killed  atomic.Bool
}

var _ vm.Machine = (*fakeMachine)(nil)

func (m *fakeMachine) DialControl(ctx context.Context) (net.Conn, error) { return m.dial(ctx) }
func (m *fakeMachine) State() vm.State                                   { return vm.StateRunning }
func (m *fakeMachine) StateChanges() <-chan vm.State                     { return make(chan vm.State) }
func (m *fakeMachine) Stop(context.Context) error                        { return nil }
func (m *fakeMachine) Kill() error                                       { m.killed.Store(true); return nil }
func (m *fakeMachine) Wait(ctx context.Context) error {
	select {
	case <-m.died:
		return m.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// never is a control channel nobody answers.
func never(ctx context.Context) (net.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// agent returns a dial function reaching a minimal guest agent: the ready
// banner, then an SSH server with host key hostPEM that lets anyone in.
func agent(t *testing.T, hostPEM []byte) func(context.Context) (net.Conn, error) {
	signer, err := ssh.ParsePrivateKey(hostPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) { return nil, nil }}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if _, err := io.WriteString(conn, proto.ReadyBanner); err != nil {
					return
				}
				sc, chans, reqs, err := ssh.NewServerConn(conn, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				go func() {
					for nc := range chans {
						nc.Reject(ssh.Prohibited, "no")
					}
				}()
				sc.Wait()
			}()
		}
	}()
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

func TestStart(t *testing.T) {
	sk, so := keystest.New(t), keystest.New(t)
	k, hostPEM, otherPEM := sk.Keys, sk.HostPEM, so.HostPEM
	startErr := errors.New("no hypervisor")
	crashed := errors.New("the guest crashed")

	tests := []struct {
		name    string
		driver  func(t *testing.T) *fakeDriver
		timeout time.Duration
		cancel  bool // the caller's ctx ends once the machine runs
		started bool // the machine ran (Started called, machine returned)
		check   func(t *testing.T, err error)
	}{
		{
			name: "the agent answers",
			driver: func(t *testing.T) *fakeDriver {
				return &fakeDriver{m: &fakeMachine{dial: agent(t, hostPEM), died: make(chan struct{})}}
			},
			timeout: time.Minute,
			started: true,
		},
		{
			name:   "the driver fails",
			driver: func(t *testing.T) *fakeDriver { return &fakeDriver{err: startErr} },
			check: func(t *testing.T, err error) {
				if !errors.Is(err, startErr) || !strings.HasPrefix(err.Error(), "start the VM: ") {
					t.Errorf("got %v, want start the VM: %v", err, startErr)
				}
				var be *Error
				if errors.As(err, &be) {
					t.Errorf("a failed Driver.Start is a boot Error: %v", err)
				}
			},
		},
		{
			name: "the machine dies before the agent answers",
			driver: func(t *testing.T) *fakeDriver {
				m := &fakeMachine{dial: never, died: make(chan struct{}), waitErr: crashed}
				close(m.died)
				return &fakeDriver{m: m}
			},
			timeout: time.Hour, // must not be waited for
			started: true,
			check: func(t *testing.T, err error) {
				var be *Error
				if !errors.As(err, &be) || !errors.Is(err, crashed) {
					t.Fatalf("got %v, want a boot Error wrapping %v", err, crashed)
				}
				if !strings.Contains(err.Error(), "last lines of the VM console") || !strings.Contains(be.Tail, "  Kernel panic \\x1b[31m") {
					t.Errorf("the error has no (escaped) console tail: %q", err)
				}
			},
		},
		{
			name: "the guest powers off before the agent answers",
			driver: func(t *testing.T) *fakeDriver {
				m := &fakeMachine{dial: never, died: make(chan struct{})}
				close(m.died)
				return &fakeDriver{m: m}
			},
			started: true,
			check: func(t *testing.T, err error) {
				var be *Error
				if !errors.As(err, &be) || be.Err.Error() != "the guest powered off" {
					t.Errorf("got %v, want a boot Error: the guest powered off", err)
				}
			},
		},
		{
			name: "no answer in time",
			driver: func(t *testing.T) *fakeDriver {
				return &fakeDriver{m: &fakeMachine{dial: never, died: make(chan struct{})}}
			},
			timeout: 50 * time.Millisecond,
			started: true,
			check: func(t *testing.T, err error) {
				var be *Error
				if !errors.As(err, &be) || be.Err.Error() != "no answer from the guest agent within 50ms" {
					t.Errorf("got %v, want a boot Error: no answer from the guest agent within 50ms", err)
				}
			},
		},
		{
			name: "the agent's host key is not the pinned one",
			driver: func(t *testing.T) *fakeDriver {
				return &fakeDriver{m: &fakeMachine{dial: agent(t, otherPEM), died: make(chan struct{})}}
			},
			timeout: time.Minute,
			started: true,
			check: func(t *testing.T, err error) {
				var be *Error
				if !errors.As(err, &be) {
					t.Errorf("got %v, want a boot Error", err)
				}
			},
		},
		{
			name: "the caller gives up",
			driver: func(t *testing.T) *fakeDriver {
				return &fakeDriver{m: &fakeMachine{dial: never, died: make(chan struct{})}}
			},
			timeout: time.Hour,
			cancel:  true,
			started: true,
			check: func(t *testing.T, err error) {
				var be *Error
				if !errors.Is(err, context.Canceled) || errors.As(err, &be) {
					t.Errorf("got %v, want context.Canceled alone", err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			console := filepath.Join(t.TempDir(), "console.log")
			if err := os.WriteFile(console, []byte("booting\nKernel panic \x1b[31m\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var ran vm.Machine
			o := Options{Client: k.ClientConfig(), Timeout: tt.timeout, Started: func(m vm.Machine) {
				ran = m
				if tt.cancel {
					cancel()
				}
			}}
			m, c, _, err := Start(ctx, tt.driver(t), vm.Config{ConsoleLog: console}, o)
			if c != nil {
				defer c.Close()
			}
			if tt.started != (m != nil) || tt.started != (ran != nil) || m != ran {
				t.Errorf("machine returned %v, Started given %v; want the machine to have run: %v", m, ran, tt.started)
			}
			if tt.check == nil {
				if err != nil || c == nil {
					t.Fatalf("Start: %v (client %v)", err, c)
				}
				return
			}
			if err == nil || c != nil {
				t.Fatalf("Start succeeded (client %v), want an error", c)
			}
			tt.check(t, err)
		})
	}
}

func TestErrorMessage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(p, []byte("one\n\n  \ntwo\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := NewError(errors.New("the guest crashed"), p).Error()
	want := "the guest crashed\nlast lines of the VM console (" + p + "):\n  one\n  two"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := NewError(errors.New("x"), filepath.Join(t.TempDir(), "none")).Error(); got != "x" {
		t.Errorf("without a console: got %q, want %q", got, "x")
	}
}

// probingDriver starts machines[i] for the i-th Start; the first of them
// runs under "probed acceleration" until FallBack.
type probingDriver struct {
	machines []*fakeMachine
	started  int
	fellBack []vm.Config
	killed   []int
}

var _ vm.AccelFallback = (*probingDriver)(nil)

func (d *probingDriver) Name() string                             { return "probing" }
func (d *probingDriver) Info() vm.Info                            { return vm.Info{} }
func (d *probingDriver) Available(context.Context, vm.Arch) error { return nil }
func (d *probingDriver) Start(context.Context, vm.Config) (vm.Machine, error) {
	if d.started == len(d.machines) {
		return nil, errors.New("no more machines")
	}
	d.started++
	return d.machines[d.started-1], nil
}
func (d *probingDriver) Probed(m vm.Machine) bool { return len(d.fellBack) == 0 }
func (d *probingDriver) FallBack(cfg vm.Config)   { d.fellBack = append(d.fellBack, cfg) }

// A guest that stays silent under probed acceleration is booted once more
// emulated; one that answers, or one whose driver chose nothing by a
// probe, is not.
func TestStartAccelFallback(t *testing.T) {
	sk := keystest.New(t)
	k, hostPEM := sk.Keys, sk.HostPEM
	silent := func() *fakeMachine { return &fakeMachine{dial: never, died: make(chan struct{})} }
	answering := func() *fakeMachine { return &fakeMachine{dial: agent(t, hostPEM), died: make(chan struct{})} }

	t.Run("silent under KVM, then emulated", func(t *testing.T) {
		d := &probingDriver{machines: []*fakeMachine{silent(), answering()}}
		var ran []vm.Machine
		var notices []string
		cfg := vm.Config{Name: "s1", Kernel: "/k"}
		m, c, _, err := Start(t.Context(), d, cfg, Options{Client: k.ClientConfig(), Timeout: time.Minute,
			AccelGrace: 100 * time.Millisecond, Started: func(m vm.Machine) { ran = append(ran, m) },
			Notice: func(s string) { notices = append(notices, s) }})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		defer c.Close()
		if d.started != 2 || len(ran) != 2 || m != vm.Machine(d.machines[1]) {
			t.Errorf("started %d machines (Started saw %d), returned %v; want 2, the second returned", d.started, len(ran), m)
		}
		if len(d.fellBack) != 1 || d.fellBack[0].Name != "s1" {
			t.Errorf("FallBack calls: %+v, want one with the machine's config", d.fellBack)
		}
		if !d.machines[0].killed.Load() {
			t.Error("the silent machine was not killed")
		}
		if len(notices) != 1 || !strings.Contains(notices[0], "emulated (TCG)") {
			t.Errorf("notices %q, want one saying it boots again emulated", notices)
		}
	})
	t.Run("silent twice is a boot error, not a loop", func(t *testing.T) {
		d := &probingDriver{machines: []*fakeMachine{silent(), silent(), answering()}}
		_, _, _, err := Start(t.Context(), d, vm.Config{}, Options{Client: k.ClientConfig(), Timeout: 300 * time.Millisecond,
			AccelGrace: 50 * time.Millisecond})
		var be *Error
		if !errors.As(err, &be) || be.Err.Error() != "no answer from the guest agent within 300ms" {
			t.Errorf("got %v, want a boot Error: no answer from the guest agent within 300ms", err)
		}
		if d.started != 2 {
			t.Errorf("started %d machines, want 2", d.started)
		}
	})
	t.Run("a grace as long as the timeout is no grace", func(t *testing.T) {
		d := &probingDriver{machines: []*fakeMachine{silent(), answering()}}
		_, _, _, err := Start(t.Context(), d, vm.Config{}, Options{Client: k.ClientConfig(), Timeout: 100 * time.Millisecond,
			AccelGrace: time.Hour})
		if err == nil || d.started != 1 || len(d.fellBack) != 0 {
			t.Errorf("err %v, %d machines started, %d fallbacks; want the timeout's error from one machine", err, d.started, len(d.fellBack))
		}
	})
	t.Run("a guest that has answered is not booted again", func(t *testing.T) {
		// The guest's first bytes come at once; the rest of the
		// handshake only well after the grace.
		release := make(chan struct{})
		grace := 20 * time.Millisecond
		time.AfterFunc(10*grace, func() { close(release) })
		dial := agent(t, hostPEM)
		slow := &fakeMachine{died: make(chan struct{}), dial: func(ctx context.Context) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			return &gatedConn{Conn: c, release: release}, nil
		}}
		d := &probingDriver{machines: []*fakeMachine{slow, answering()}}
		_, c, _, err := Start(t.Context(), d, vm.Config{}, Options{Client: k.ClientConfig(), Timeout: time.Minute, AccelGrace: grace})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		c.Close()
		if d.started != 1 || len(d.fellBack) != 0 {
			t.Errorf("%d machines started, %d fallbacks; want the answering guest kept", d.started, len(d.fellBack))
		}
	})
}

// gatedConn lets its first Read through and holds the later ones until
// release is closed.
type gatedConn struct {
	net.Conn
	release <-chan struct{}
	reads   int
}

func (c *gatedConn) Read(p []byte) (int, error) {
	if c.reads > 0 {
		<-c.release
	}
	c.reads++
	return c.Conn.Read(p)
}
