package egress

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Limits of the wildcard guard. Under an allowed wildcard ("*.example.com")
// the guest chooses the labels, and every new name is a question the host's
// resolver forwards upstream: a channel out of the VM that no DLP sees.
// Each allowing wildcard rule therefore has a bucket of wildBurst new
// distinct names, refilled at wildRate a second; names already answered
// cost nothing. Past it, new names are refused (REFUSED) and alerted.
const (
	WildcardBurst = 32
	wildRate      = 2.0
	// wildSeen bounds the names remembered per rule; when full the set is
	// forgotten and names cost a token again.
	wildSeen = 4096
	// A guest-chosen part of at least highEntropyLen bytes whose Shannon
	// entropy is at least highEntropyBits a byte, or any label of
	// longLabel bytes or more, is answered but alerted.
	highEntropyLen  = 20
	highEntropyBits = 3.9
	longLabel       = 32
)

// WildcardGuard rate-limits new names under each allowing wildcard rule.
// Its zero value is not usable; newWildcardGuard makes one.
type WildcardGuard struct {
	now func() time.Time

	mu    sync.Mutex
	rules map[string]*wildBucket
}

type wildBucket struct {
	tokens float64
	last   time.Time
	seen   map[string]struct{}
}

// NewWildcardGuard makes a guard with its own buckets; now nil is time.Now.
func NewWildcardGuard(now func() time.Time) *WildcardGuard {
	if now == nil {
		now = time.Now
	}
	return &WildcardGuard{now: now, rules: map[string]*wildBucket{}}
}

// Admit reports whether name (allowed by the wildcard rule d) may be
// looked up: a name seen before always, a new one while the rule's bucket
// has a token. Decisions by a rule that is no wildcard are always admitted.
func (g *WildcardGuard) Admit(d Decision, name string) bool {
	if !strings.HasPrefix(d.Rule, "*.") {
		return true
	}
	key := d.Source + "\x00" + d.Rule
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.rules[key]
	if b == nil {
		b = &wildBucket{tokens: WildcardBurst, last: now, seen: map[string]struct{}{}}
		g.rules[key] = b
	}
	if _, ok := b.seen[name]; ok {
		return true
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(WildcardBurst, b.tokens+dt*wildRate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	if len(b.seen) >= wildSeen {
		clear(b.seen)
	}
	b.seen[name] = struct{}{}
	return true
}

// WildcardPart is the part of name the guest chose under the wildcard rule
// text (e.g. "a.b" of "a.b.example.com" under "*.example.com:443").
func WildcardPart(rule, name string) string {
	base := strings.TrimPrefix(rule, "*.")
	if i := strings.LastIndexByte(base, ':'); i >= 0 && !strings.Contains(base, "]") {
		base = base[:i]
	}
	return strings.TrimSuffix(strings.TrimSuffix(name, base), ".")
}

// SuspiciousLabels reports whether the guest-chosen part p looks like
// encoded data rather than a host name: a label of longLabel bytes or
// more, or a long run of near-random characters.
func SuspiciousLabels(p string) bool {
	for _, l := range strings.Split(p, ".") {
		if len(l) >= longLabel {
			return true
		}
	}
	s := strings.ReplaceAll(p, ".", "")
	return len(s) >= highEntropyLen && shannon(s) >= highEntropyBits
}

// shannon is the Shannon entropy of s in bits a byte.
func shannon(s string) float64 {
	var n [256]int
	for i := 0; i < len(s); i++ {
		n[s[i]]++
	}
	h := 0.0
	for _, c := range n {
		if c > 0 {
			p := float64(c) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h
}

// WildcardLimited is a policy whose wildcard rules admit new names only as
// fast as the wildcard guard's bucket allows, on every path that asks it:
// the DNS server (DecideName) and the explicit proxy's CONNECT and
// absolute-URI targets (Decide), which the proxy then resolves through the
// host's resolver. Names it admitted once stay admitted. A refusal is a
// deny Decision that names the guard.
type WildcardLimited struct {
	p interface {
		Decide(name string, port uint16) Decision
		DecideName(name string) Decision
	}
	g *WildcardGuard
}

// LimitWildcards wraps p (usually a *Policy) with one wildcard guard.
func LimitWildcards(p StackPolicy) *WildcardLimited {
	return LimitWildcardsClock(p, nil)
}

// LimitWildcardsClock is LimitWildcards with the guard's clock (nil:
// time.Now); tests pass their own.
func LimitWildcardsClock(p StackPolicy, now func() time.Time) *WildcardLimited {
	return &WildcardLimited{p: p, g: NewWildcardGuard(now)}
}

var (
	_ StackPolicy = (*WildcardLimited)(nil)
	_ Decider     = (*WildcardLimited)(nil)
)

// Decide implements Decider.
func (w *WildcardLimited) Decide(name string, port uint16) Decision {
	return w.limit(name, w.p.Decide(name, port))
}

// DecideName implements StackPolicy.
func (w *WildcardLimited) DecideName(name string) Decision {
	return w.limit(name, w.p.DecideName(name))
}

func (w *WildcardLimited) limit(name string, d Decision) Decision {
	if !d.Allow || !strings.HasPrefix(d.Rule, "*.") {
		return d
	}
	n, err := NormalizeName(name)
	if err != nil {
		return d
	}
	if !w.g.Admit(d, n) {
		return Decision{Rule: d.Rule, Source: d.Source, Reason: WildcardRefusal(d.Rule)}
	}
	return d
}

// WildcardRefusal is the reason a deny names when the guard refused a new
// name under rule.
func WildcardRefusal(rule string) string {
	return fmt.Sprintf("more than %d new names a burst (%g a second) under wildcard %s: refused, as DNS exfiltration", WildcardBurst, wildRate, rule)
}
