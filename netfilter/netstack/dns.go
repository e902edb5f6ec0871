package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Resolver tells the DNS server whether an allowed name exists in the real
// DNS, so that a misspelt name fails as it would outside the VM instead of
// being handed an address. It is only ever asked about names the policy
// allows.
type Resolver interface {
	// Exists reports whether name (normalised, no trailing dot) has an
	// address. (false, nil) means it does not (the guest gets NXDOMAIN); an
	// error means the answer is unknown (the guest gets SERVFAIL).
	Exists(ctx context.Context, name string) (bool, error)
}

// SystemResolver is the Resolver that asks the host's resolver (Resolver,
// or net.DefaultResolver when nil).
type SystemResolver struct {
	Resolver *net.Resolver
}

// Exists implements Resolver.
func (r SystemResolver) Exists(ctx context.Context, name string) (bool, error) {
	res := r.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	addrs, err := res.LookupNetIP(ctx, "ip", name)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %q: %w", name, err)
	}
	return len(addrs) > 0, nil
}

// DNS wire constants.
const (
	dnsHeaderLen = 12
	dnsMaxName   = 255 // wire length, RFC 1035 §3.1
	dnsMaxTCPMsg = 4096

	dnsTypeA    = 1
	dnsTypeAAAA = 28
	dnsClassIN  = 1

	rcodeNoError  = 0
	rcodeFormErr  = 1
	rcodeServFail = 2
	rcodeNXDomain = 3
	rcodeNotImp   = 4
	rcodeRefused  = 5
)

// DNS tuning.
const (
	dnsAnswerTTL      = 60 // seconds, for synthetic A records
	dnsPositiveCache  = 5 * time.Minute
	dnsNegativeCache  = 30 * time.Second
	dnsCacheEntries   = 8192
	dnsUpstreamLimit  = 16 // concurrent upstream lookups
	dnsUpstreamTime   = 5 * time.Second
	dnsHandlerLimit   = 64 // concurrent queries being answered
	dnsTCPConnLimit   = 16
	dnsTCPIdle        = 10 * time.Second
	dnsMaxQueriesConn = 256
)

// dnsQuery is the parsed question of a query.
type dnsQuery struct {
	id       uint16
	rd       bool
	question []byte // wire bytes of the question, echoed in the answer
	name     string // lower case, no trailing dot; "" for the root
	valid    bool   // every label is letters, digits, '-' or '_'
	qtype    uint16
	qclass   uint16
}

// errDNSDrop marks a message that gets no answer at all: too short for a
// header, or itself a response (answering responses invites loops).
var errDNSDrop = errors.New("not a DNS query")

// parseDNSQuery parses a query. It accepts exactly one question whose name
// uses no compression (a query has nothing to point back to), and no
// answer or authority records; additional records (EDNS) are ignored. On
// a malformed query it returns the rcode to answer with, or errDNSDrop.
func parseDNSQuery(msg []byte) (dnsQuery, int, error) {
	var q dnsQuery
	if len(msg) < dnsHeaderLen {
		return q, 0, errDNSDrop
	}
	q.id = binary.BigEndian.Uint16(msg[0:])
	flags := binary.BigEndian.Uint16(msg[2:])
	if flags&0x8000 != 0 {
		return q, 0, errDNSDrop
	}
	q.rd = flags&0x0100 != 0
	if opcode := (flags >> 11) & 0xf; opcode != 0 {
		return q, rcodeNotImp, fmt.Errorf("opcode %d not implemented", opcode)
	}
	qd := binary.BigEndian.Uint16(msg[4:])
	an := binary.BigEndian.Uint16(msg[6:])
	ns := binary.BigEndian.Uint16(msg[8:])
	if qd != 1 || an != 0 || ns != 0 {
		return q, rcodeFormErr, fmt.Errorf("%d questions, %d answers, %d authority records: want exactly one question", qd, an, ns)
	}
	off := dnsHeaderLen
	var name strings.Builder
	q.valid = true
	for {
		if off >= len(msg) {
			return q, rcodeFormErr, errors.New("question name truncated")
		}
		l := int(msg[off])
		if l == 0 {
			off++
			break
		}
		if l&0xc0 != 0 {
			return q, rcodeFormErr, errors.New("compressed or extended label in a question")
		}
		if off+1+l > len(msg) {
			return q, rcodeFormErr, errors.New("question name truncated")
		}
		if off+1+l+1-dnsHeaderLen > dnsMaxName {
			return q, rcodeFormErr, errors.New("question name longer than 255 bytes")
		}
		if name.Len() > 0 {
			name.WriteByte('.')
		}
		for _, c := range msg[off+1 : off+1+l] {
			switch {
			case 'A' <= c && c <= 'Z':
				name.WriteByte(c + 'a' - 'A')
			case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '_':
				name.WriteByte(c)
			default:
				q.valid = false
				fmt.Fprintf(&name, "\\%03d", c)
			}
		}
		off += 1 + l
	}
	if off+4 > len(msg) {
		return q, rcodeFormErr, errors.New("question truncated")
	}
	q.qtype = binary.BigEndian.Uint16(msg[off:])
	q.qclass = binary.BigEndian.Uint16(msg[off+2:])
	q.question = msg[dnsHeaderLen : off+4]
	q.name = name.String()
	return q, 0, nil
}

// dnsReply builds a response to q with rcode and, when a is valid, one A
// record for it.
func dnsReply(q dnsQuery, rcode int, a netip.Addr) []byte {
	b := make([]byte, dnsHeaderLen, dnsHeaderLen+len(q.question)+16)
	binary.BigEndian.PutUint16(b[0:], q.id)
	flags := uint16(0x8000) | uint16(0x0080) | uint16(rcode&0xf) // QR, RA
	if q.rd {
		flags |= 0x0100
	}
	binary.BigEndian.PutUint16(b[2:], flags)
	if q.question == nil {
		return b
	}
	binary.BigEndian.PutUint16(b[4:], 1)
	b = append(b, q.question...)
	if a.Is4() {
		binary.BigEndian.PutUint16(b[6:], 1)
		ip := a.As4()
		b = append(b,
			0xc0, dnsHeaderLen, // the name: a pointer to the question's
			0, dnsTypeA, 0, dnsClassIN,
			0, 0, 0, dnsAnswerTTL,
			0, 4, ip[0], ip[1], ip[2], ip[3])
	}
	return b
}

// synthPool hands out one synthetic address per name from a private range
// and remembers which name each address stands for. Addresses are handed
// out in order; when the range is used up, allocation wraps around and the
// oldest name loses its address (a guest that still uses the old address
// is then matched to the new name, and the engine's SNI/Host check refuses
// the mismatch).
type synthPool struct {
	prefix netip.Prefix
	first  netip.Addr
	size   uint32

	mu     sync.Mutex
	next   uint32
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
}

func newSynthPool(p netip.Prefix) (*synthPool, error) {
	p = p.Masked()
	if !p.Addr().Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return nil, fmt.Errorf("synthetic address range %s: want an IPv4 prefix between /8 and /30", p)
	}
	return &synthPool{
		prefix: p,
		first:  p.Addr().Next(),
		size:   uint32(1)<<(32-p.Bits()) - 2, // neither the network nor the broadcast address
		byName: map[string]netip.Addr{},
		byAddr: map[netip.Addr]string{},
	}, nil
}

// addr returns name's address, assigning one if needed; fresh tells
// whether it was just assigned.
func (p *synthPool) addr(name string) (a netip.Addr, fresh bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.byName[name]; ok {
		return a, false
	}
	a = addAddr(p.first, p.next)
	p.next = (p.next + 1) % p.size
	if old, ok := p.byAddr[a]; ok {
		delete(p.byName, old)
	}
	p.byName[name] = a
	p.byAddr[a] = name
	return a, true
}

// name returns the name a was handed out for.
func (p *synthPool) name(a netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.byAddr[a]
	return n, ok
}

func addAddr(a netip.Addr, n uint32) netip.Addr {
	b := a.As4()
	v := binary.BigEndian.Uint32(b[:]) + n
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// existence caches Resolver answers and merges concurrent lookups of one
// name, with at most dnsUpstreamLimit lookups at a time.
type existence struct {
	r   Resolver
	now func() time.Time
	sem chan struct{}

	mu       sync.Mutex
	cache    map[string]existenceEntry
	inflight map[string]*existenceCall
}

type existenceEntry struct {
	exists  bool
	expires time.Time
}

type existenceCall struct {
	done   chan struct{}
	exists bool
	err    error
}

func newExistence(r Resolver) *existence {
	return &existence{
		r: r, now: time.Now, sem: make(chan struct{}, dnsUpstreamLimit),
		cache: map[string]existenceEntry{}, inflight: map[string]*existenceCall{},
	}
}

// check reports whether name exists; asked tells whether the upstream
// resolver was consulted for this call (not answered from the cache).
func (e *existence) check(ctx context.Context, name string) (exists, asked bool, err error) {
	now := e.now()
	e.mu.Lock()
	if c, ok := e.cache[name]; ok && now.Before(c.expires) {
		e.mu.Unlock()
		return c.exists, false, nil
	}
	if call, ok := e.inflight[name]; ok {
		e.mu.Unlock()
		select {
		case <-call.done:
			return call.exists, false, call.err
		case <-ctx.Done():
			return false, false, ctx.Err()
		}
	}
	call := &existenceCall{done: make(chan struct{})}
	e.inflight[name] = call
	e.mu.Unlock()

	call.exists, call.err = e.lookup(ctx, name)

	e.mu.Lock()
	delete(e.inflight, name)
	if call.err == nil {
		if len(e.cache) >= dnsCacheEntries {
			for k, c := range e.cache {
				if !now.Before(c.expires) {
					delete(e.cache, k)
				}
			}
			if len(e.cache) >= dnsCacheEntries {
				clear(e.cache)
			}
		}
		ttl := dnsPositiveCache
		if !call.exists {
			ttl = dnsNegativeCache
		}
		e.cache[name] = existenceEntry{exists: call.exists, expires: now.Add(ttl)}
	}
	e.mu.Unlock()
	close(call.done)
	return call.exists, true, call.err
}

func (e *existence) lookup(ctx context.Context, name string) (bool, error) {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-e.sem }()
	ctx, cancel := context.WithTimeout(ctx, dnsUpstreamTime)
	defer cancel()
	return e.r.Exists(ctx, name)
}

// dnsServer answers the guest's queries on the gateway. It answers only
// names the policy allows on some port, each with a synthetic address;
// it never recurses and never forwards a query anywhere.
type dnsServer struct {
	policy egress.StackPolicy
	exist  *existence // nil: no upstream check
	pool   *synthPool
	events *eventLimiter
	log    *slog.Logger

	guardOnce sync.Once
	guard     *egress.WildcardGuard // new names under wildcards; made on first use unless set
}

// answer returns the reply to msg, a query from src, or nil when msg gets
// no reply.
func (d *dnsServer) answer(ctx context.Context, msg []byte, src netip.AddrPort) []byte {
	q, rcode, err := parseDNSQuery(msg)
	if errors.Is(err, errDNSDrop) {
		return nil
	}
	if err != nil {
		d.record(egress.Event{Kind: "dns", Src: apString(src), Decision: "deny", Reason: "malformed query: " + err.Error()})
		return dnsReply(dnsQuery{id: q.id, rd: q.rd}, rcode, netip.Addr{})
	}
	ev := egress.Event{Kind: "dns", Name: q.name, Src: apString(src)}
	if q.qclass != dnsClassIN {
		ev.Decision, ev.Reason = "deny", fmt.Sprintf("query class %d refused (only IN is served)", q.qclass)
		d.record(ev)
		return dnsReply(q, rcodeRefused, netip.Addr{})
	}
	if !q.valid {
		ev.Decision, ev.Reason = "deny", "not a valid host name"
		d.record(ev)
		return dnsReply(q, rcodeNXDomain, netip.Addr{})
	}
	dec := d.policy.DecideName(q.name)
	ev.Rule = dec.Rule
	if !dec.Allow {
		ev.Decision, ev.Reason = "deny", dec.Reason
		d.record(ev)
		if dec.Pending {
			// The user is being asked: a temporary failure the resolver
			// retries, never NXDOMAIN, which it takes as final.
			return dnsReply(q, rcodeServFail, netip.Addr{})
		}
		return dnsReply(q, rcodeNXDomain, netip.Addr{})
	}
	if _, limited := d.policy.(*egress.WildcardLimited); !limited && strings.HasPrefix(dec.Rule, "*.") {
		d.guardOnce.Do(func() {
			if d.guard == nil {
				d.guard = egress.NewWildcardGuard(nil)
			}
		})
		if !d.guard.Admit(dec, q.name) {
			ev.Decision, ev.Reason = "deny", egress.WildcardRefusal(dec.Rule)
			d.record(ev)
			return dnsReply(q, rcodeRefused, netip.Addr{})
		}
	}
	if part := egress.WildcardPart(dec.Rule, q.name); strings.HasPrefix(dec.Rule, "*.") && egress.SuspiciousLabels(part) {
		ev.Findings = []egress.Finding{{Category: "dns_label", Prefix: firstN(part, 4), Length: len(part), Where: "dns", Action: "log"}}
	}
	asked := false
	if d.exist != nil {
		var exists bool
		exists, asked, err = d.exist.check(ctx, q.name)
		switch {
		case err != nil:
			ev.Decision, ev.Reason = "error", "upstream lookup failed: "+err.Error()
			d.record(ev)
			return dnsReply(q, rcodeServFail, netip.Addr{})
		case !exists:
			if asked {
				ev.Decision, ev.Reason = "error", "allowed, but the name does not exist upstream (NXDOMAIN)"
				d.record(ev)
			}
			return dnsReply(q, rcodeNXDomain, netip.Addr{})
		}
	}
	a, fresh := d.pool.addr(q.name)
	if fresh || asked || len(ev.Findings) > 0 {
		ev.Decision, ev.Dst, ev.Reason = "allow", a.String(), dec.Reason
		if len(ev.Findings) > 0 {
			ev.Reason += "; the labels under the wildcard look like encoded data (high entropy or a long label)"
		}
		d.record(ev)
	}
	if q.qtype != dnsTypeA {
		// AAAA: there is no IPv6 egress. Anything else (MX, TXT, SRV,
		// HTTPS, ANY …): no data. The name exists, so NOERROR.
		return dnsReply(q, rcodeNoError, netip.Addr{})
	}
	return dnsReply(q, rcodeNoError, a)
}

func (d *dnsServer) record(e egress.Event) {
	if d.events.record(e) && e.Decision != "allow" {
		d.log.Debug("dns query refused", "name", e.Name, "src", e.Src, "reason", e.Reason)
	}
}

// serveUDP answers queries arriving on pc until it is closed.
func (d *dnsServer) serveUDP(ctx context.Context, pc net.PacketConn, wg *sync.WaitGroup) {
	sem := make(chan struct{}, dnsHandlerLimit)
	for {
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		src, _ := netip.ParseAddrPort(from.String())
		select {
		case sem <- struct{}{}:
		default:
			continue // too many queries in flight: drop, the client retries
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if reply := d.answer(ctx, buf[:n], src); reply != nil {
				_, _ = pc.WriteTo(reply, from)
			}
		}()
	}
}

// serveTCP answers DNS over TCP (RFC 7766) on ln until it is closed.
func (d *dnsServer) serveTCP(ctx context.Context, ln net.Listener, wg *sync.WaitGroup) {
	sem := make(chan struct{}, dnsTCPConnLimit)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			src, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			var lenBuf [2]byte
			buf := make([]byte, dnsMaxTCPMsg)
			for range dnsMaxQueriesConn {
				_ = c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
					return
				}
				n := int(binary.BigEndian.Uint16(lenBuf[:]))
				if n > dnsMaxTCPMsg {
					return
				}
				if _, err := io.ReadFull(c, buf[:n]); err != nil {
					return
				}
				reply := d.answer(ctx, buf[:n], src)
				if reply == nil {
					return
				}
				out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reply)), uint16(len(reply)))
				_ = c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := c.Write(append(out, reply...)); err != nil {
					return
				}
			}
		}()
	}
}

// firstN is at most the first n bytes of s.
func firstN(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
