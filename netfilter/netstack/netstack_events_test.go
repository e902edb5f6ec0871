package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/stacktest"

	"strings"
	"testing"
	"time"
)

func TestEventLimiter(t *testing.T) {
	rec := &stacktest.Events{}
	l := newEventLimiter(rec)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	deny := egress.Event{Kind: "udp", Decision: "deny", Dst: "8.8.8.8:53"}

	for range 100 {
		l.record(deny)
	}
	if got := len(rec.All()); got != eventBurst {
		t.Fatalf("after a burst of 100: got %d events, want %d", got, eventBurst)
	}
	// Another kind has its own bucket.
	if !l.record(egress.Event{Kind: "dns", Decision: "deny"}) {
		t.Errorf("a dns event was suppressed by the udp bucket")
	}
	// A second later the bucket has refilled a little: the next event
	// passes, preceded by a summary of what was suppressed.
	now = now.Add(time.Second)
	before := len(rec.All())
	if !l.record(deny) {
		t.Fatal("event suppressed after the refill")
	}
	evs := rec.All()[before:]
	if len(evs) != 2 || !strings.Contains(evs[0].Reason, "36 more") || evs[0].Kind != "udp" || evs[0].Decision != "deny" {
		t.Fatalf("got %+v, want a summary of 36 suppressed events, then the event", evs)
	}
	// Suppress some more, then flush: one summary.
	for range 100 {
		l.record(deny)
	}
	before = len(rec.All())
	l.flush()
	evs = rec.All()[before:]
	if len(evs) != 1 || !strings.Contains(evs[0].Reason, "more") {
		t.Fatalf("flush: got %+v, want one summary", evs)
	}
	l.flush()
	if got := len(rec.All()); got != before+1 {
		t.Errorf("a second flush recorded %d events", got-before-1)
	}
}
