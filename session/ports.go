package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vibedom/vibedom/guestlink"
)

// Published ports (`vibedom run -p`, `vibedom port NAME add|rm|list`): the
// session host listens on a host address (127.0.0.1 unless the user names
// another) and carries each connection to a port of the guest over the
// control channel (guestlink.Client.DialPort: an SSH direct-tcpip channel,
// which the guest agent connects only to its own addresses). No network
// path into the guest is made, and the guest's egress policy is unchanged.

// OpPort is the control operation on published ports; the request carries
// a PortRequest.
const OpPort = "port"

// Port actions.
const (
	PortAdd  = "add"
	PortRm   = "rm"
	PortList = "list"
)

// MaxPortConns bounds the connections open at once through one published
// port; more are closed as they arrive.
const MaxPortConns = 128

// portDialMax bounds the wait for the guest to take a connection (a
// guest that never answers must not hold a port's slots for good).
const portDialMax = 30 * time.Second

// DefaultPortAddr is where a published port listens unless told otherwise.
const DefaultPortAddr = "127.0.0.1"

// Errors of publishing a port.
var (
	ErrPortInUse      = errors.New("host port in use")
	ErrPortPrivileged = errors.New("privileged port")
)

// PortSpec is one published port: [HOSTADDR:][HOSTPORT:]GUESTPORT.
type PortSpec struct {
	// HostAddr is the address the host listens on; "" is DefaultPortAddr.
	HostAddr string `json:"host_addr,omitempty"`
	// HostPort is the host's port; 0 is GuestPort.
	HostPort int `json:"host_port,omitempty"`
	// GuestPort is the port in the guest.
	GuestPort int `json:"guest_port"`
}

// ParsePortSpec reads [HOSTADDR:][HOSTPORT:]GUESTPORT (an IPv6 HOSTADDR
// in brackets). It fills in the defaults and refuses a host port below
// 1024 (ErrPortPrivileged) and anything out of range.
func ParsePortSpec(s string) (PortSpec, error) {
	var p PortSpec
	rest := s
	if strings.HasPrefix(rest, "[") { // [::1]:3000:3000
		end := strings.Index(rest, "]:")
		if end < 0 {
			return p, fmt.Errorf("port %q: use [HOSTADDR:][HOSTPORT:]GUESTPORT, e.g. 3000 or 8080:3000", s)
		}
		p.HostAddr, rest = rest[1:end], rest[end+2:]
		if p.HostAddr == "" {
			return p, fmt.Errorf("port %q: the brackets hold no address; leave them out to listen on %s", s, DefaultPortAddr)
		}
	}
	parts := strings.Split(rest, ":")
	switch {
	case len(parts) <= 2:
	case p.HostAddr == "" && len(parts) == 3:
		p.HostAddr, parts = parts[0], parts[1:]
	default:
		return p, fmt.Errorf("port %q: use [HOSTADDR:][HOSTPORT:]GUESTPORT, e.g. 3000 or 8080:3000", s)
	}
	num := func(t string) (int, error) {
		n, err := strconv.Atoi(t)
		if err != nil || n < 1 || n > 65535 {
			return 0, fmt.Errorf("port %q: %q is not a port number (1–65535)", s, t)
		}
		return n, nil
	}
	var err error
	if p.GuestPort, err = num(parts[len(parts)-1]); err != nil {
		return p, err
	}
	p.HostPort = p.GuestPort
	if len(parts) == 2 {
		if p.HostPort, err = num(parts[0]); err != nil {
			return p, err
		}
	}
	if p.HostAddr == "" {
		p.HostAddr = DefaultPortAddr
	} else if ip := net.ParseIP(p.HostAddr); ip == nil && p.HostAddr != "localhost" {
		return p, fmt.Errorf("port %q: %q is not an IP address to listen on", s, p.HostAddr)
	}
	if p.HostPort < 1024 {
		hint := p.GuestPort
		if hint < 1024 {
			hint = 8000 + p.GuestPort
		}
		return p, fmt.Errorf("%w: host port %d needs root; publish on a higher one, e.g. -p %d:%d", ErrPortPrivileged, p.HostPort, hint, p.GuestPort)
	}
	return p, nil
}

// checkPorts checks specs that did not come from ParsePortSpec (the
// detached host's options file) as ParsePortSpec would.
func checkPorts(ps []PortSpec) error {
	for _, p := range ps {
		q, err := ParsePortSpec(fmt.Sprintf("[%s]:%d:%d", p.HostAddr, p.HostPort, p.GuestPort))
		if err != nil {
			return err
		}
		if q != p {
			return fmt.Errorf("port %s: not a port spec as parsed", p)
		}
	}
	return nil
}

// Host is the address the host listens on.
func (p PortSpec) Host() string { return net.JoinHostPort(p.HostAddr, strconv.Itoa(p.HostPort)) }

// String is HOSTADDR:HOSTPORT->GUESTPORT.
func (p PortSpec) String() string { return fmt.Sprintf("%s->%d", p.Host(), p.GuestPort) }

// Exposed says the port listens beyond this machine's loopback: other
// machines may reach the guest's server through it.
func (p PortSpec) Exposed() bool {
	if p.HostAddr == "localhost" {
		return false
	}
	ip := net.ParseIP(p.HostAddr)
	return ip == nil || !ip.IsLoopback()
}

// PortRequest is a control request on published ports (OpPort).
type PortRequest struct {
	Action string `json:"action"` // PortAdd, PortRm or PortList
	// Spec is what to add ([HOSTADDR:][HOSTPORT:]GUESTPORT) or remove (the
	// same, or the host port alone).
	Spec string `json:"spec,omitempty"`
}

// PortInfo is one published port as `status` and `port list` show it.
type PortInfo struct {
	Host  string `json:"host"`  // HOSTADDR:HOSTPORT the host listens on
	Guest int    `json:"guest"` // the guest's port
	Open  int    `json:"open"`  // connections open now
}

// portTable is a session host's published ports.
type portTable struct {
	mu     sync.Mutex
	ports  []*published
	closed bool
	log    *slog.Logger
	// dial connects to a guest port; nil until the guest is up, and the
	// connections that arrive before wait for ready.
	dial  func(context.Context, int) (net.Conn, error)
	ready chan struct{}
	ctx   context.Context
	stop  context.CancelFunc
	// maxConns bounds each port's open connections (MaxPortConns).
	maxConns int
}

func newPortTable() *portTable {
	ctx, stop := context.WithCancel(context.Background())
	return &portTable{ready: make(chan struct{}), ctx: ctx, stop: stop, log: slog.New(slog.DiscardHandler), maxConns: MaxPortConns}
}

// published is one port: its listener and the connections through it.
type published struct {
	spec  PortSpec
	ln    net.Listener
	slots chan struct{}
	mu    sync.Mutex
	open  map[net.Conn]struct{}
	gone  bool
}

// start lets the waiting and future connections through to the guest.
func (t *portTable) start(dial func(context.Context, int) (net.Conn, error), log *slog.Logger) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dial != nil {
		return
	}
	t.dial = dial
	if log != nil {
		t.log = log
	}
	close(t.ready)
}

// add listens on p's host address and serves it.
func (t *portTable) add(p PortSpec) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("the session is ending: no more ports")
	}
	for _, q := range t.ports {
		if q.spec.Host() == p.Host() {
			return fmt.Errorf("%s is already published (to guest port %d)", p.Host(), q.spec.GuestPort)
		}
	}
	ln, err := net.Listen("tcp", p.Host())
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w: %s is taken (another session or program): publish on another, e.g. -p %d:%d", ErrPortInUse, p.Host(), p.HostPort+1, p.GuestPort)
		}
		if errors.Is(err, syscall.EACCES) {
			return fmt.Errorf("%w: listening on %s is not allowed here", ErrPortPrivileged, p.Host())
		}
		return fmt.Errorf("publish %s: %w", p.Host(), err)
	}
	pp := &published{spec: p, ln: ln, slots: make(chan struct{}, t.maxConns), open: map[net.Conn]struct{}{}}
	t.ports = append(t.ports, pp)
	t.log.Info("port published", "port", p.String(), "exposed", p.Exposed())
	go t.accept(pp)
	return nil
}

// rm stops publishing the port whose spec or host port is given, and
// closes its connections.
func (t *portTable) rm(spec string) (PortSpec, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// The host port alone, a spec as add took it, or the host address as
	// list shows it (HOSTADDR:HOSTPORT, or the whole HOST->GUEST line).
	match := func(q PortSpec) bool {
		return strconv.Itoa(q.HostPort) == spec || q.Host() == spec || q.String() == spec
	}
	if p, err := ParsePortSpec(spec); err == nil && strings.Contains(spec, ":") {
		match = func(q PortSpec) bool { return q.Host() == p.Host() || q.Host() == spec }
	}
	for i, q := range t.ports {
		if match(q.spec) {
			t.ports = slices.Delete(t.ports, i, i+1)
			q.close()
			t.log.Info("port unpublished", "port", q.spec.String())
			return q.spec, nil
		}
	}
	return PortSpec{}, fmt.Errorf("no published port %s: `vibedom port NAME list` shows them", spec)
}

// list reports the ports, by host port.
func (t *portTable) list() []PortInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]PortInfo, 0, len(t.ports))
	for _, q := range t.ports {
		out = append(out, PortInfo{Host: q.spec.Host(), Guest: q.spec.GuestPort, Open: len(q.slots)})
	}
	slices.SortFunc(out, func(a, b PortInfo) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// closeAll ends every port and connection; later adds are refused.
func (t *portTable) closeAll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.stop()
	for _, q := range t.ports {
		q.close()
	}
	t.ports = nil
	return nil
}

func (q *published) close() {
	q.ln.Close()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.gone = true
	for c := range q.open {
		c.Close()
	}
}

// track records c as open through q (false when q is closed: c is closed).
func (q *published) track(c net.Conn) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		c.Close()
		return false
	}
	q.open[c] = struct{}{}
	return true
}

func (q *published) untrack(c net.Conn) {
	q.mu.Lock()
	delete(q.open, c)
	q.mu.Unlock()
	c.Close()
}

func (t *portTable) accept(q *published) {
	for {
		c, err := q.ln.Accept()
		if err != nil {
			return
		}
		select {
		case q.slots <- struct{}{}:
		default:
			t.log.Warn("published port: too many connections, one refused", "port", q.spec.String(), "max", cap(q.slots))
			c.Close()
			continue
		}
		go func() {
			defer func() { <-q.slots }()
			t.forward(q, c)
		}()
	}
}

// forward carries one host connection to the guest port.
func (t *portTable) forward(q *published, c net.Conn) {
	if !q.track(c) {
		return
	}
	defer q.untrack(c)
	select {
	case <-t.ready:
	case <-t.ctx.Done():
		return
	}
	dctx, cancel := context.WithTimeout(t.ctx, portDialMax)
	g, err := t.dial(dctx, q.spec.GuestPort)
	cancel()
	if err != nil {
		if errors.Is(err, guestlink.ErrPortClosed) {
			t.log.Info("published port: nothing listens in the guest", "port", q.spec.String())
		} else {
			t.log.Warn("published port: connect to the guest", "port", q.spec.String(), "err", err)
		}
		return
	}
	if !q.track(g) {
		return
	}
	defer q.untrack(g)
	gw, ok1 := g.(halfCloser)
	hw, ok2 := c.(halfCloser)
	if !ok1 || !ok2 {
		return
	}
	splice(hw, gw, func() { c.Close(); g.Close() })
}

// halfCloser is a connection whose write side can be closed alone.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// splice copies a to b and b to a until both directions ended, passing each
// end of input on as a half close; a failing direction calls closeAll
// (which closes both, so the other direction ends too).
func splice(a, b halfCloser, closeAll func()) {
	done := make(chan struct{}, 2)
	pipe := func(dst, src halfCloser) {
		if _, err := copyConn(dst, src); err != nil {
			closeAll()
		}
		_ = dst.CloseWrite()
		done <- struct{}{}
	}
	go pipe(a, b)
	go pipe(b, a)
	<-done
	<-done
}

// copyConn is io.Copy with a 32 KiB buffer.
func copyConn(dst, src net.Conn) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			w, werr := dst.Write(buf[:k])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
}

// servePort answers an OpPort control request.
func (s *sess) servePort(req *PortRequest) ControlReply {
	if req == nil {
		return ControlReply{Error: "port: no request"}
	}
	t := s.ctl.ports
	switch req.Action {
	case PortAdd:
		if err := s.checkRunning(); err != nil {
			return ControlReply{Error: err.Error()}
		}
		p, err := ParsePortSpec(req.Spec)
		if err != nil {
			return ControlReply{Error: err.Error()}
		}
		if err := t.add(p); err != nil {
			return ControlReply{Error: err.Error()}
		}
	case PortRm:
		if _, err := t.rm(req.Spec); err != nil {
			return ControlReply{Error: err.Error()}
		}
	case PortList:
	default:
		return ControlReply{Error: fmt.Sprintf("port: unknown action %q (add, rm or list)", req.Action)}
	}
	return ControlReply{OK: true, Ports: t.list()}
}

// openPorts publishes the ports of Options.Ports before anything boots, so
// a taken port fails the start at once; connections wait for the guest.
func (s *sess) openPorts() error {
	s.cleanup.add("close published ports", s.ctl.ports.closeAll)
	for _, p := range s.opts.Ports {
		if err := s.ctl.ports.add(p); err != nil {
			return err
		}
	}
	return nil
}

// startPorts lets the published ports' connections through once the
// guest's control connection is up.
func (s *sess) startPorts() {
	s.ctl.ports.start(s.client.DialPort, s.log)
}
