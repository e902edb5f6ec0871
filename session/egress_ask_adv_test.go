package session

import (
	"testing"
	"time"

	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// TestAskRecheckPortAdv (adversarial): the recheck a once answer's
// connection passes (the mitmproxy engine's upstream dial) holds for the
// port that connection was admitted on only: the same name on another
// port within the 10 s is not let through by it.
func TestAskRecheckPortAdv(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	ch := decideAsync(l, "o.example", 443)
	answer(t, s, waitPending(t, l.ask, "o.example").ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Fatalf("once: %+v", d)
	}
	if d := nfegress.Recheck(nfegress.LimitWildcards(l), "o.example", 443); !d.Allow {
		t.Errorf("recheck on the admitted port: %+v", d)
	}
	for _, port := range []uint16{22, 80, 8443} {
		if d := nfegress.Recheck(nfegress.LimitWildcards(l), "o.example", port); d.Allow {
			t.Errorf("recheck on port %d after a once answer for 443: %+v", port, d)
		}
	}
	// A DNS question's once pass, taken by a web connection on port 80.
	l.ask.dnsHold = 10 * time.Second
	ch = decideAsync(l, "dns.example", 0)
	answer(t, s, waitPending(t, l.ask, "dns.example").ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Fatalf("lookup after once: %+v", d)
	}
	if d := l.Decide("dns.example", 80); !d.Allow {
		t.Fatalf("the connection after the lookup: %+v", d)
	}
	if d := nfegress.Recheck(nfegress.LimitWildcards(l), "dns.example", 22); d.Allow {
		t.Errorf("recheck on port 22 after the pass went to port 80: %+v", d)
	}
}
