package session

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/netfilter"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/policy"
)

// EgressOptions configures the session's network. The zero value gives the
// guest a NIC whose only way out is the allowlisting proxy.
type EgressOptions struct {
	// Disabled gives the guest no NIC at all.
	Disabled bool
	// Allow holds extra rules (--allow), the last scope of the policy.
	Allow []string
	// Filter rewrites outgoing requests (the DLP); nil changes nothing.
	Filter mitm.RequestFilter
	// Resolve maps allowed names to the addresses the proxy connects to
	// (--resolve); CAFiles are PEM files of extra roots trusted for
	// upstreams (--ca-file), on top of the system's.
	Resolve []nfegress.Resolve
	CAFiles []string
	// Dial, ExtraRoots and Resolver replace how the proxy reaches
	// upstreams; Dial is called only with an address the proxy's dial
	// guard has passed (mitm.EngineConfig.Dial).
	Dial       nfegress.DialFunc
	ExtraRoots []*x509.Certificate
	Resolver   netfilter.Resolver
	// ProxyEngine is "go" (the default when empty) or "mitmproxy": admitted
	// connections are then handed to a mitmdump the session starts and
	// owns (docs/network.md, "Proxy engines"). Mitmdump names the program
	// ("" means the release `vibedom init --with-mitmproxy` installed, else
	// mitmdump on PATH). Inspect runs mitmweb instead, a read-only live
	// view of the requests sent upstream (mitmproxy engine only).
	ProxyEngine string
	Mitmdump    string
	Inspect     bool
	// Mode is EgressModeDeny (the default when empty) or EgressModeAsk: a
	// name no rule decides is then held while the user is asked, for at
	// most AskTimeout (DefaultAskTimeout when 0).
	Mode       string
	AskTimeout time.Duration
	// NoMITM names hosts whose TLS passes through uninspected (--no-mitm),
	// for clients that pin certificates; never a model provider's host or
	// one a credential is swapped for.
	NoMITM []string
}

// ProxyEngines are the values of EgressOptions.ProxyEngine.
var ProxyEngines = []string{"go", "mitmproxy"}

// guestMAC is the guest NIC's address (locally administered).
const guestMAC = "02:76:64:00:00:02"

type egress struct {
	policy *nfegress.Policy
	live   *livePolicy // the policy as it stands now (live rules)
	conns  *connSet    // transparent connections, for a live deny to close
	// notices are the terminals told of ask mode's questions.
	notices noticeHub
	desk    deskNotifier      // the desktop, when no terminal is attached
	net     *netfilter.Egress // the stack and the proxy engine
	events  *netfilter.LogWriter
	caPEM   []byte
	mac     string
}

// setupEgress builds the policy, the proxy engine and the userspace network
// stack, and starts serving the host end of the guest's NIC. The returned
// egress is torn down by the session's cleanups.
func (s *sess) setupEgress(ctx context.Context) error {
	o := &s.opts
	eo := o.Egress
	trust, err := policy.LoadTrust(o.Home, s.plan.workspace)
	if err != nil {
		return fmt.Errorf("load the egress policy: %w", err)
	}
	allow := eo.Allow
	if s.creds != nil {
		allow = append(slices.Clip(allow), s.creds.AllowRules()...)
	}
	pol, notes, err := policy.EgressPolicy(o.Home, trust, allow)
	if err != nil {
		return fmt.Errorf("load the egress policy: %w", err)
	}
	for _, n := range notes {
		s.progress("egress: %s", n)
		s.log.Warn("egress policy", "note", n)
	}
	ca, err := keys.EnsureCA(o.Home.CA())
	if err != nil {
		return fmt.Errorf("the MITM CA: %w", err)
	}
	events, err := netfilter.NewLogWriter(filepath.Join(s.logDir, netfilter.NetworkLogFile), filepath.Join(s.logDir, netfilter.AlertsLogFile))
	if err != nil {
		return err
	}
	events.SetRedactor(s.redact)
	e := &egress{policy: pol, events: events, caPEM: ca.CertPEM(), mac: guestMAC}
	s.cleanup.add("close network log", events.Close)
	roots := append([]*x509.Certificate{}, eo.ExtraRoots...)
	for _, f := range eo.CAFiles {
		certs, err := readCerts(f)
		if err != nil {
			return err
		}
		roots = append(roots, certs...)
	}
	for _, r := range eo.Resolve {
		s.log.Info("--resolve: the proxy dials this address for this name and port only, even if it is loopback or private",
			"name", r.Name, "port", r.Port, "addr", r.Addr.String())
	}
	if err := s.startLogins(ctx, eo.Resolve, roots); err != nil {
		return err
	}
	// One wildcard guard for the DNS server and the explicit proxy: new
	// names under a wildcard are a channel to the host's resolver.
	noMITM, err := s.checkNoMITM(append(slices.Clone(eo.NoMITM), pol.NoMITM()...))
	if err != nil {
		return err
	}
	e.live, e.conns = newLivePolicy(o.Home, pol, time.Now()), newConnSet()
	switch eo.Mode {
	case "", EgressModeDeny:
	case EgressModeAsk:
		e.live.setAsk(newAsker(eo.AskTimeout))
		e.live.ask.notify, e.live.ask.onClear = s.notifyQuestion, e.notices.cleared
		e.desk.init(o.Home, s.log)
		s.progress("egress: ask mode: names no rule decides are held while you are asked (`vibedom watch %s`; %v, then denied)", s.name, e.live.ask.timeout)
	default:
		return fmt.Errorf("--egress must be ask or deny, got %q", eo.Mode)
	}
	limited := nfegress.LimitWildcards(e.live)
	// In ask mode vibedom watch also shows the guest's latest requests.
	var sink nfegress.EventSink = events
	if a := e.live.ask; a != nil {
		sink = nfegress.EventSinkFunc(func(ev nfegress.Event) {
			events.Record(ev)
			a.record(ev, s.redact)
		})
	}
	mac, _ := net.ParseMAC(guestMAC)
	e.net, err = netfilter.NewEgress(ctx, netfilter.EgressConfig{
		Engine: eo.ProxyEngine, Mitmdump: eo.Mitmdump, Home: string(o.Home),
		CAKeyFile: filepath.Join(o.Home.CA(), keys.CAKeyFile), Inspect: eo.Inspect,
		Proxy: mitm.EngineConfig{
			CA: ca, Filter: s.plan.filter,
			Dial: eo.Dial, Resolve: eo.Resolve, AllowPrivate: pol.PrivateRanges(), ExtraRoots: roots,
			Session: s.name, Track: func(t netfilter.Target, c net.Conn) func() { return e.conns.add(t, c) },
			NoMITM: noMITM,
		},
		Policy: limited, Events: sink, GuestMAC: mac, Resolver: eo.Resolver, Tap: s.sshTap,
		Logger: s.log, Progress: s.progress,
	})
	if err != nil {
		return err
	}
	s.cleanup.add("stop the network", e.net.Close)
	s.egress = e
	return nil
}

// readCerts reads the PEM certificates of a --ca-file.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("--ca-file %s: %w", path, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", path)
	}
	return certs, nil
}
