package netfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
	"github.com/vibedom/vibedom/netfilter/netstack"
)

// Target is what an admitted guest connection was admitted for (its name,
// port and decision): what a tap or a tracker is told.
type Target = netstack.Target

// Resolver tells the DNS server whether an allowed name exists.
type Resolver = netstack.Resolver

// EgressConfig is one guest's way out: the proxy engine that serves it and
// the network stack in front of that engine.
type EgressConfig struct {
	// Engine is "go" (the default when empty) or "mitmproxy": admitted
	// connections are then handed to a mitmdump the egress starts and
	// owns. Mitmdump names the program ("" means the release `vibedom
	// init --with-mitmproxy` installed under Home, else mitmdump on
	// PATH); CAKeyFile is the MITM CA's key, which mitmdump reads.
	// Inspect runs mitmweb instead (mitmproxy engine only).
	Engine    string
	Mitmdump  string
	Home      string
	CAKeyFile string
	Inspect   bool
	// Proxy configures the engine. Its Policy, Events and Logger are set
	// from the fields below; its Track, when set, is also told of every
	// transparently intercepted connection while it is served; its
	// Resolve names also exist for the DNS server.
	Proxy mitm.EngineConfig
	// Policy decides the stack's connections and DNS answers and the
	// proxy's targets; Events receives both's events.
	Policy egress.StackPolicy
	Events egress.EventSink
	// GuestMAC is the guest NIC's address.
	GuestMAC net.HardwareAddr
	// Resolver answers whether an allowed name exists (the host's resolver
	// when nil).
	Resolver Resolver
	// Tap, when set, is called once the engine has started (what it tells
	// the user comes after the engine's lines); the function it returns,
	// when not nil, is shown the bytes of each transparently intercepted
	// connection (TapEngine).
	Tap func() func(Target) ConnTap
	// Logger receives the engine's ("part" proxy) and the stack's ("part"
	// network) diagnostics; Progress the lines the user sees while the
	// egress starts (nil: none).
	Logger   *slog.Logger
	Progress func(format string, args ...any)
}

// Egress is a guest's network link served by the stack and the proxy
// engine behind it.
type Egress struct {
	engine interface {
		netstack.Engine
		Close() error
	}
	stack   *netstack.Stack
	hostEnd net.Conn
	vmEnd   *os.File
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

// NewEgress starts the proxy engine cfg names and the network stack, and
// serves the host end of the guest's link until Close (ctx ends the
// engine's start, not the serving).
func NewEgress(ctx context.Context, cfg EgressConfig) (*Egress, error) {
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, ...any) {}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ecfg := cfg.Proxy
	ecfg.Policy, ecfg.Events, ecfg.Logger = cfg.Policy, cfg.Events, log.With("part", "proxy")
	e := &Egress{}
	var err error
	switch cfg.Engine {
	case "", "go":
		e.engine, err = mitm.NewGoEngine(ecfg)
	case "mitmproxy":
		mitmdump := cfg.Mitmdump
		if mitmdump == "" {
			mitmdump = mitmproxy.PreferredMitmdump(filepath.Join(cfg.Home, mitmproxy.DirName))
		}
		if cfg.Inspect {
			progress("egress: starting mitmweb (--proxy-engine mitmproxy --inspect)")
		} else {
			progress("egress: starting mitmdump (--proxy-engine mitmproxy)")
		}
		var m *mitmproxy.Engine
		m, err = mitmproxy.NewEngine(ctx, mitmproxy.Config{EngineConfig: ecfg,
			CAKeyFile: cfg.CAKeyFile, Mitmdump: mitmdump, LiveView: cfg.Inspect})
		if err == nil {
			e.engine = m
			log.Info("proxy engine: mitmproxy", "version", m.Version(), "live_view", cfg.Inspect)
			if u := m.WebURL(); u != "" {
				progress("egress: live view (read-only) of the requests as sent upstream: %s", u)
			}
		}
	default:
		err = fmt.Errorf("unknown proxy engine %q: use go or mitmproxy", cfg.Engine)
	}
	if err == nil && cfg.Inspect && cfg.Engine != "mitmproxy" {
		e.engine.Close()
		err = errors.New("--inspect needs --proxy-engine mitmproxy")
	}
	if err != nil {
		return nil, err
	}
	resolver := cfg.Resolver
	if len(ecfg.Resolve) > 0 {
		resolver = ResolveResolver(ecfg.Resolve, resolver)
	}
	if resolver == nil {
		resolver = netstack.SystemResolver{}
	}
	var engine netstack.Engine = e.engine
	if ecfg.Track != nil {
		engine = &trackEngine{Engine: engine, track: ecfg.Track}
	}
	if cfg.Tap != nil {
		if tap := cfg.Tap(); tap != nil {
			engine = TapEngine(engine, tap)
		}
	}
	e.stack, err = netstack.NewStack(netstack.StackConfig{GuestMAC: cfg.GuestMAC, Resolver: resolver}, engine, cfg.Policy, cfg.Events, log.With("part", "network"))
	if err != nil {
		e.engine.Close()
		return nil, err
	}
	e.hostEnd, e.vmEnd, err = netstack.SocketPair()
	if err != nil {
		e.stack.Close()
		e.engine.Close()
		return nil, fmt.Errorf("make the guest's network link: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e.cancel = cancel
	e.done.Add(1)
	go func() {
		defer e.done.Done()
		if err := e.stack.Serve(sctx, e.hostEnd); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn("network stack stopped", "err", err)
		}
	}()
	return e, nil
}

// ProxyURL is the explicit proxy's URL as the guest reaches it.
func (e *Egress) ProxyURL() string { return e.stack.ProxyURL() }

// VMEnd is the guest's end of the link, for the VM's NIC.
func (e *Egress) VMEnd() *os.File { return e.vmEnd }

// Close stops serving, then the stack and the engine, and closes both ends
// of the link.
func (e *Egress) Close() error {
	e.cancel()
	errs := []error{e.stack.Close(), e.hostEnd.Close()}
	e.done.Wait()
	e.engine.Close()
	errs = append(errs, e.vmEnd.Close())
	return errors.Join(ignoreClosed(errs)...)
}

func ignoreClosed(errs []error) []error {
	out := errs[:0]
	for _, err := range errs {
		if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrClosed) {
			out = append(out, err)
		}
	}
	return out
}

// trackEngine serves transparently intercepted connections with Engine,
// telling track of each while it is served.
type trackEngine struct {
	netstack.Engine
	track func(Target, net.Conn) func()
}

func (e *trackEngine) HandleConn(ctx context.Context, conn net.Conn, t Target) {
	done := e.track(t, conn)
	defer done()
	e.Engine.HandleConn(ctx, conn, t)
}

// ProbeMitmproxy fails before anything boots, with the version found and
// needed, when the mitmdump (and with inspect, the mitmweb) the mitmproxy
// engine would run is missing or too old: the release `vibedom init
// --with-mitmproxy` installed under home, else PATH's.
func ProbeMitmproxy(ctx context.Context, home string, inspect bool) error {
	mitmdump := mitmproxy.PreferredMitmdump(filepath.Join(home, mitmproxy.DirName))
	if _, err := mitmproxy.MitmdumpVersion(ctx, mitmdump); err != nil {
		return err
	}
	if inspect {
		if _, err := mitmproxy.MitmwebVersion(ctx, mitmproxy.MitmwebProgram(mitmdump, "")); err != nil {
			return err
		}
	}
	return nil
}
