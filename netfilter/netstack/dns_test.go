package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// nsRawQuery builds a DNS message by hand: a header with the given counts
// and flags, then body.
func nsRawQuery(flags, qd, an, ns, ar uint16, body ...[]byte) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint16(b[0:], 0xbeef)
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], qd)
	binary.BigEndian.PutUint16(b[6:], an)
	binary.BigEndian.PutUint16(b[8:], ns)
	binary.BigEndian.PutUint16(b[10:], ar)
	for _, p := range body {
		b = append(b, p...)
	}
	return b
}

// nsWireName encodes labels without compression.
func nsWireName(labels ...string) []byte {
	var b []byte
	for _, l := range labels {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

var typeAClassIN = []byte{0, dnsTypeA, 0, dnsClassIN}

func TestParseDNSQuery(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		name      string
		msg       []byte
		wantDrop  bool
		wantRCode int // when an error is expected
		wantErr   bool
		wantName  string
		wantValid bool
	}{
		{name: "plain A query", msg: nsRawQuery(0x0100, 1, 0, 0, 0, nsWireName("api", "example", "com"), typeAClassIN),
			wantName: "api.example.com", wantValid: true},
		{name: "mixed case is lowered", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("API", "Example", "COM"), typeAClassIN),
			wantName: "api.example.com", wantValid: true},
		{name: "EDNS additional record is ignored", msg: nsRawQuery(0, 1, 0, 0, 1, nsWireName("a", "com"), typeAClassIN,
			[]byte{0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0}), wantName: "a.com", wantValid: true},
		{name: "root", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{0}, typeAClassIN), wantName: "", wantValid: true},
		{name: "dot inside a label", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("api.example", "com"), typeAClassIN),
			wantName: `api\046example.com`, wantValid: false},
		{name: "NUL inside a label", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("a\x00b", "com"), typeAClassIN),
			wantName: `a\000b.com`, wantValid: false},
		{name: "too short", msg: []byte{1, 2, 3}, wantDrop: true},
		{name: "a response", msg: nsRawQuery(0x8000, 1, 0, 0, 0, nsWireName("a", "com"), typeAClassIN), wantDrop: true},
		{name: "opcode STATUS", msg: nsRawQuery(2<<11, 1, 0, 0, 0, nsWireName("a", "com"), typeAClassIN), wantErr: true, wantRCode: rcodeNotImp},
		{name: "no question", msg: nsRawQuery(0, 0, 0, 0, 0), wantErr: true, wantRCode: rcodeFormErr},
		{name: "two questions", msg: nsRawQuery(0, 2, 0, 0, 0, nsWireName("a", "com"), typeAClassIN, nsWireName("b", "com"), typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "65535 questions claimed", msg: nsRawQuery(0, 0xffff, 0, 0, 0, nsWireName("a", "com"), typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "answers in a query", msg: nsRawQuery(0, 1, 1, 0, 0, nsWireName("a", "com"), typeAClassIN), wantErr: true, wantRCode: rcodeFormErr},
		{name: "compression pointer to itself", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{0xc0, 12}, typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "compression loop between labels", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{1, 'a', 0xc0, 12}, typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "extended label type", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{0x41, 'a', 0}, typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "name over 255 bytes", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName(long, long, long, long, "com"), typeAClassIN),
			wantErr: true, wantRCode: rcodeFormErr},
		{name: "name of exactly 255 bytes", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName(long, long, long, strings.Repeat("b", 61)), typeAClassIN),
			wantName: strings.Join([]string{long, long, long, strings.Repeat("b", 61)}, "."), wantValid: true},
		{name: "label past the end", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{10, 'a', 'b'}), wantErr: true, wantRCode: rcodeFormErr},
		{name: "name without terminator", msg: nsRawQuery(0, 1, 0, 0, 0, []byte{1, 'a'}), wantErr: true, wantRCode: rcodeFormErr},
		{name: "no type and class", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("a", "com"), []byte{0, 1}), wantErr: true, wantRCode: rcodeFormErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, rcode, err := parseDNSQuery(tt.msg)
			switch {
			case tt.wantDrop:
				if !errors.Is(err, errDNSDrop) {
					t.Fatalf("got %v, want errDNSDrop", err)
				}
			case tt.wantErr:
				if err == nil || errors.Is(err, errDNSDrop) || rcode != tt.wantRCode {
					t.Fatalf("got rcode %d, %v; want rcode %d and an error", rcode, err, tt.wantRCode)
				}
			default:
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				if q.name != tt.wantName || q.valid != tt.wantValid || q.qtype != dnsTypeA || q.qclass != dnsClassIN {
					t.Errorf("got name %q valid %v type %d class %d, want %q valid %v", q.name, q.valid, q.qtype, q.qclass, tt.wantName, tt.wantValid)
				}
			}
		})
	}
}

// newTestDNS is a dnsServer without a network around it.
func newTestDNS(t testing.TB, pol egress.StackPolicy, r Resolver) (*dnsServer, *stacktest.Events) {
	t.Helper()
	pool, err := newSynthPool(DefaultSyntheticRange)
	if err != nil {
		t.Fatal(err)
	}
	rec := &stacktest.Events{}
	d := &dnsServer{policy: pol, pool: pool, events: newEventLimiter(rec), log: stacktest.DiscardLogger()}
	if r != nil {
		d.exist = newExistence(r)
	}
	return d, rec
}

func TestDNSAnswer(t *testing.T) {
	res := &stacktest.Resolver{Known: map[string]bool{"api.example.com": true}}
	d, rec := newTestDNS(t, testPolicyAllow(), res)
	src := netip.MustParseAddrPort("10.254.254.2:5353")
	tests := []struct {
		name      string
		msg       []byte
		wantNil   bool
		wantRCode dnsmessage.RCode
		wantAns   int
		wantEvent string
		oddName   bool // dnsmessage cannot parse the echoed question
	}{
		{name: "allowed A", msg: stacktest.DNSQuery(t, 1, "api.example.com.", dnsmessage.TypeA), wantRCode: dnsmessage.RCodeSuccess, wantAns: 1},
		{name: "class CHAOS refused", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("version", "bind"), []byte{0, 16, 0, 3}),
			wantRCode: dnsmessage.RCodeRefused, wantEvent: "deny"},
		{name: "invalid characters", msg: nsRawQuery(0, 1, 0, 0, 0, nsWireName("api.example", "com"), typeAClassIN),
			wantRCode: dnsmessage.RCodeNameError, wantEvent: "deny", oddName: true},
		{name: "malformed gets FORMERR", msg: nsRawQuery(0, 2, 0, 0, 0, nsWireName("a", "com"), typeAClassIN),
			wantRCode: dnsmessage.RCodeFormatError, wantEvent: "deny"},
		{name: "ANY gets no data", msg: stacktest.DNSQuery(t, 2, "api.example.com.", dnsmessage.TypeALL), wantRCode: dnsmessage.RCodeSuccess},
		{name: "responses get nothing", msg: nsRawQuery(0x8000, 1, 0, 0, 0, nsWireName("a", "com"), typeAClassIN), wantNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(rec.All())
			reply := d.answer(t.Context(), tt.msg, src)
			if tt.wantNil {
				if reply != nil {
					t.Fatalf("got a reply %x, want none", reply)
				}
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(reply)
			if err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if !h.Response || h.ID != binary.BigEndian.Uint16(tt.msg) || h.RCode != tt.wantRCode {
				t.Errorf("header: got %+v, want a response with id %#x and rcode %v", h, binary.BigEndian.Uint16(tt.msg), tt.wantRCode)
			}
			if tt.wantEvent != "" {
				evs := rec.All()[before:]
				if len(evs) == 0 || evs[len(evs)-1].Decision != tt.wantEvent || evs[len(evs)-1].Kind != "dns" {
					t.Errorf("events: got %+v, want a dns %s", evs, tt.wantEvent)
				}
			}
			if tt.oddName {
				if h.RCode != tt.wantRCode {
					t.Errorf("rcode: got %v", h.RCode)
				}
				return
			}
			if _, err := p.AllQuestions(); err != nil {
				t.Fatalf("questions: %v", err)
			}
			ans, err := p.AllAnswers()
			if err != nil || len(ans) != tt.wantAns {
				t.Errorf("answers: got %d (%v), want %d", len(ans), err, tt.wantAns)
			}
		})
	}
	if got := res.Calls(); len(got) != 1 || got[0] != "api.example.com" {
		t.Errorf("resolver calls: got %v, want only api.example.com", got)
	}
}

// FuzzDNSAnswer feeds arbitrary messages to the DNS server. Whatever comes
// in, a reply is nil or a well-formed response no larger than 512 bytes
// with the query's ID, and the resolver hears only of allowed names.
func FuzzDNSAnswer(f *testing.F) {
	f.Add(nsRawQuery(0x0100, 1, 0, 0, 0, nsWireName("api", "example", "com"), typeAClassIN))
	f.Add(nsRawQuery(0, 1, 0, 0, 0, []byte{0xc0, 12}, typeAClassIN))
	f.Add(nsRawQuery(0, 1, 0, 0, 0, []byte{1, 'a', 0xc0, 12}, typeAClassIN))
	f.Add(nsRawQuery(0, 0xffff, 0xffff, 0xffff, 0xffff))
	f.Add(nsRawQuery(0, 1, 0, 0, 0, nsWireName(strings.Repeat("x", 63), strings.Repeat("y", 63), "evil", "net"), []byte{0, 16, 0, 1}))
	res := &stacktest.Resolver{Known: map[string]bool{"api.example.com": true}}
	pol := testPolicyAllow()
	d, _ := newTestDNS(f, pol, res)
	src := netip.MustParseAddrPort("10.254.254.2:5353")
	f.Fuzz(func(t *testing.T, msg []byte) {
		reply := d.answer(context.Background(), msg, src)
		if reply != nil {
			if len(reply) > 512 || len(reply) < dnsHeaderLen {
				t.Fatalf("reply of %d bytes", len(reply))
			}
			var p dnsmessage.Parser
			h, err := p.Start(reply)
			if err != nil || !h.Response || h.ID != binary.BigEndian.Uint16(msg) {
				t.Fatalf("bad reply header %+v, %v", h, err)
			}
			// The question is echoed as it came (dnsmessage refuses some
			// names a client may send), so only the header is checked.
		}
		for _, name := range res.Calls() {
			if !pol.DecideName(name).Allow {
				t.Fatalf("resolver asked about a denied name %q", name)
			}
		}
	})
}

func TestSynthPool(t *testing.T) {
	t.Run("stable and distinct", func(t *testing.T) {
		p, err := newSynthPool(DefaultSyntheticRange)
		if err != nil {
			t.Fatal(err)
		}
		a1, fresh1 := p.addr("a.example.com")
		b1, _ := p.addr("b.example.com")
		a2, fresh2 := p.addr("a.example.com")
		if a1 != a2 || !fresh1 || fresh2 {
			t.Errorf("a.example.com: got %v (fresh %v) then %v (fresh %v)", a1, fresh1, a2, fresh2)
		}
		if a1 == b1 {
			t.Errorf("two names share %v", a1)
		}
		if a1 != netip.MustParseAddr("198.18.0.1") {
			t.Errorf("first address: got %v, want 198.18.0.1", a1)
		}
		if n, ok := p.name(b1); !ok || n != "b.example.com" {
			t.Errorf("name(%v): got %q, %v", b1, n, ok)
		}
		if _, ok := p.name(netip.MustParseAddr("198.19.255.254")); ok {
			t.Errorf("an address never handed out has a name")
		}
	})
	t.Run("wraps around, the oldest name loses its address", func(t *testing.T) {
		p, err := newSynthPool(netip.MustParsePrefix("198.18.0.0/30")) // two usable addresses
		if err != nil {
			t.Fatal(err)
		}
		a, _ := p.addr("a")
		b, _ := p.addr("b")
		c, _ := p.addr("c")
		if c != a || a == b {
			t.Errorf("got a=%v b=%v c=%v, want c to reuse a's address", a, b, c)
		}
		if n, _ := p.name(a); n != "c" {
			t.Errorf("name(%v): got %q, want c", a, n)
		}
		if a2, fresh := p.addr("a"); !fresh || a2 != b {
			t.Errorf("a again: got %v fresh %v, want %v fresh", a2, fresh, b)
		}
		for _, x := range []netip.Addr{a, b} {
			if x == netip.MustParseAddr("198.18.0.0") || x == netip.MustParseAddr("198.18.0.3") {
				t.Errorf("handed out the network or broadcast address %v", x)
			}
		}
	})
	t.Run("bad ranges", func(t *testing.T) {
		for _, s := range []string{"2001:db8::/64", "198.18.0.0/31", "0.0.0.0/4"} {
			if _, err := newSynthPool(netip.MustParsePrefix(s)); err == nil {
				t.Errorf("%s nsAccepted", s)
			}
		}
	})
}

// countingResolver blocks each lookup until release is closed.
type countingResolver struct {
	mu      sync.Mutex
	n       map[string]int
	release chan struct{}
	err     error
}

func (r *countingResolver) Exists(ctx context.Context, name string) (bool, error) {
	r.mu.Lock()
	r.n[name]++
	r.mu.Unlock()
	if r.release != nil {
		<-r.release
	}
	return !strings.HasPrefix(name, "missing"), r.err
}

func (r *countingResolver) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[name]
}

func TestExistenceCache(t *testing.T) {
	t.Run("concurrent lookups of one name are merged", func(t *testing.T) {
		r := &countingResolver{n: map[string]int{}, release: make(chan struct{})}
		e := newExistence(r)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				if ok, _, err := e.check(t.Context(), "a.example.com"); !ok || err != nil {
					t.Errorf("check: got %v, %v", ok, err)
				}
			})
		}
		for r.count("a.example.com") == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
		close(r.release)
		wg.Wait()
		if got := r.count("a.example.com"); got != 1 {
			t.Errorf("resolver calls: got %d, want 1", got)
		}
	})
	t.Run("answers are cached, negative ones for less time", func(t *testing.T) {
		r := &countingResolver{n: map[string]int{}}
		e := newExistence(r)
		now := time.Unix(1000, 0)
		e.now = func() time.Time { return now }
		for _, name := range []string{"a", "missing-b"} {
			e.check(t.Context(), name)
			e.check(t.Context(), name)
		}
		if r.count("a") != 1 || r.count("missing-b") != 1 {
			t.Fatalf("calls: got %d and %d, want 1 each", r.count("a"), r.count("missing-b"))
		}
		now = now.Add(dnsNegativeCache + time.Second)
		e.check(t.Context(), "a")
		e.check(t.Context(), "missing-b")
		if r.count("a") != 1 || r.count("missing-b") != 2 {
			t.Errorf("after the negative TTL: got %d and %d calls, want 1 and 2", r.count("a"), r.count("missing-b"))
		}
	})
	t.Run("errors are not cached", func(t *testing.T) {
		r := &countingResolver{n: map[string]int{}, err: errors.New("timeout")}
		e := newExistence(r)
		for range 2 {
			if _, _, err := e.check(t.Context(), "a"); err == nil {
				t.Fatal("error swallowed")
			}
		}
		if got := r.count("a"); got != 2 {
			t.Errorf("calls: got %d, want 2", got)
		}
	})
	t.Run("the cache is bounded", func(t *testing.T) {
		r := &countingResolver{n: map[string]int{}}
		e := newExistence(r)
		for i := range dnsCacheEntries + 10 {
			e.check(t.Context(), fmt.Sprintf("n%d", i))
		}
		if got := len(e.cache); got > dnsCacheEntries {
			t.Errorf("cache holds %d entries, limit %d", got, dnsCacheEntries)
		}
	})
}

func TestDNSReplyEchoesQuestion(t *testing.T) {
	q, _, err := parseDNSQuery(nsRawQuery(0x0100, 1, 0, 0, 0, nsWireName("ApI", "Example", "com"), typeAClassIN))
	if err != nil {
		t.Fatal(err)
	}
	r := dnsReply(q, rcodeNoError, netip.MustParseAddr("198.18.0.9"))
	if !bytes.Contains(r, nsWireName("ApI", "Example", "com")) {
		t.Errorf("the question's case was not preserved: %x", r)
	}
	var m dnsmessage.Message
	if err := m.Unpack(r); err != nil {
		t.Fatal(err)
	}
	a, ok := stacktest.AnswerA(m)
	if !ok || a != netip.MustParseAddr("198.18.0.9") || !m.RecursionDesired || m.Answers[0].Header.TTL != dnsAnswerTTL {
		t.Errorf("reply: got %+v", m)
	}
}

// pendingPolicy answers every question as pending (ask mode, the user not
// answered yet) or as denied.
type pendingPolicy struct{ pending bool }

func (p pendingPolicy) Decide(string, uint16) egress.Decision { return p.decision() }
func (p pendingPolicy) DecideName(string) egress.Decision     { return p.decision() }
func (p pendingPolicy) decision() egress.Decision {
	return egress.Decision{Reason: "waiting for the user's answer", Pending: p.pending}
}

// TestDNSPendingIsTemporary: a name the user is being asked about gets
// SERVFAIL, which resolvers retry, not NXDOMAIN, which they take as final.
func TestDNSPendingIsTemporary(t *testing.T) {
	src := netip.MustParseAddrPort("10.254.254.2:5353")
	for _, c := range []struct {
		pending bool
		want    dnsmessage.RCode
	}{{true, dnsmessage.RCodeServerFailure}, {false, dnsmessage.RCodeNameError}} {
		d, _ := newTestDNS(t, pendingPolicy{c.pending}, nil)
		reply := d.answer(t.Context(), stacktest.DNSQuery(t, 7, "asked.example.com.", dnsmessage.TypeA), src)
		var p dnsmessage.Parser
		h, err := p.Start(reply)
		if err != nil || h.RCode != c.want {
			t.Errorf("pending=%v: rcode %v (%v), want %v", c.pending, h.RCode, err, c.want)
		}
	}
}
