package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"context"
	"crypto/rand"
	"encoding/base32"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// upstreamCounter is a fake upstream resolver: every name exists, and
// every name it is asked about is recorded.
type upstreamCounter struct {
	mu    sync.Mutex
	asked map[string]int
}

func (u *upstreamCounter) Exists(_ context.Context, name string) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.asked[name]++
	return true, nil
}

func (u *upstreamCounter) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.asked)
}

// TestDNSWildcardExfiltrationBounded: a guest floods random labels under an
// allowed wildcard. Only a bounded number reach the upstream resolver, the
// rest are refused and alerted, and the names the guest used before keep
// resolving; with time, new names resolve again.
func TestDNSWildcardExfiltrationBounded(t *testing.T) {
	rules, err := egress.ParseRules(strings.NewReader("*.example.test\napi.other.test\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	up := &upstreamCounter{asked: map[string]int{}}
	d, rec := newTestDNS(t, egress.NewPolicy(rules), up)
	var mu sync.Mutex
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d.guard = egress.NewWildcardGuard(func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	guest := netip.MustParseAddrPort("10.254.254.2:5353")
	ask := func(name string) dnsmessage.RCode {
		t.Helper()
		var m dnsmessage.Message
		if err := m.Unpack(d.answer(t.Context(), stacktest.DNSQuery(t, 7, name+".", dnsmessage.TypeA), guest)); err != nil {
			t.Fatal(err)
		}
		return m.RCode
	}

	ordinary := []string{"www.example.test", "cdn.example.test", "api.example.test"}
	for _, n := range ordinary {
		if rc := ask(n); rc != dnsmessage.RCodeSuccess {
			t.Fatalf("%s: %v before the flood", n, rc)
		}
	}
	const flood = 2000
	refused := 0
	enc := base32.StdEncoding.WithPadding(base32.NoPadding)
	for range flood {
		b := make([]byte, 30)
		rand.Read(b)
		if ask(strings.ToLower(enc.EncodeToString(b))+".example.test") == dnsmessage.RCodeRefused {
			refused++
		}
	}
	if got := up.count(); got != egress.WildcardBurst {
		t.Errorf("names that reached the upstream resolver: %d, want the burst of %d", got, egress.WildcardBurst)
	}
	if refused != flood-(egress.WildcardBurst-len(ordinary)) {
		t.Errorf("refused %d of %d flood names, want %d", refused, flood, flood-(egress.WildcardBurst-len(ordinary)))
	}
	for _, n := range append(ordinary, "api.other.test") {
		if rc := ask(n); rc != dnsmessage.RCodeSuccess {
			t.Errorf("%s: %v after the flood, want an answer", n, rc)
		}
	}
	if rc := ask("new.example.test"); rc != dnsmessage.RCodeRefused {
		t.Errorf("a new name during the flood: %v, want REFUSED", rc)
	}
	mu.Lock()
	clock = clock.Add(time.Second)
	mu.Unlock()
	if rc := ask("new.example.test"); rc != dnsmessage.RCodeSuccess {
		t.Errorf("a new name a second later: %v, want an answer", rc)
	}

	var denied, flagged int
	for _, e := range rec.All() {
		switch {
		case e.Decision == "deny" && strings.Contains(e.Reason, "DNS exfiltration"):
			denied++
		case e.Decision == "allow" && len(e.Findings) > 0 && e.Findings[0].Category == "dns_label":
			flagged++
		}
		if egress.IsAlert(e) && e.Findings == nil && e.Decision != "deny" {
			t.Errorf("unexpected alert %+v", e)
		}
	}
	if denied == 0 || flagged == 0 {
		t.Errorf("alerts: %d refusals and %d high-entropy flags, want both", denied, flagged)
	}
}
