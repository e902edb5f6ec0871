package netstack

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"fmt"
	"sync"
	"time"
)

// Rate limits for the events the network stack records itself (DNS
// answers, refused connections, dropped UDP and ICMP). Each kind and
// decision has its own token bucket: a burst of eventBurst, refilled at
// eventRate per second. What the bucket refuses is counted and reported as
// one summary event when the next event of that kind passes, and at Close,
// so a packet flood from the guest costs a few lines a second, not a
// full disk.
const (
	eventBurst = 64
	eventRate  = 16.0
)

// eventLimiter records events to a sink through per-kind token buckets.
type eventLimiter struct {
	sink egress.EventSink
	now  func() time.Time

	mu      sync.Mutex
	buckets map[string]*eventBucket
}

type eventBucket struct {
	kind, decision string
	tokens         float64
	last           time.Time
	suppressed     int64
	since          time.Time
}

func newEventLimiter(sink egress.EventSink) *eventLimiter {
	if sink == nil {
		sink = egress.DiscardEvents{}
	}
	return &eventLimiter{sink: sink, now: time.Now, buckets: map[string]*eventBucket{}}
}

// record records e unless its bucket is empty. It reports whether e was
// recorded, so the caller can rate-limit its log lines the same way.
func (l *eventLimiter) record(e egress.Event) bool {
	now := l.now()
	if e.Time.IsZero() {
		e.Time = now
	}
	key := e.Kind + "/" + e.Decision
	l.mu.Lock()
	b := l.buckets[key]
	if b == nil {
		b = &eventBucket{kind: e.Kind, decision: e.Decision, tokens: eventBurst, last: now}
		l.buckets[key] = b
	}
	b.tokens = min(eventBurst, b.tokens+now.Sub(b.last).Seconds()*eventRate)
	b.last = now
	if b.tokens < 1 {
		if b.suppressed == 0 {
			b.since = now
		}
		b.suppressed++
		l.mu.Unlock()
		return false
	}
	b.tokens--
	summary, ok := b.takeSummary(now)
	l.mu.Unlock()
	if ok {
		l.sink.Record(summary)
	}
	l.sink.Record(e)
	return true
}

// takeSummary returns the summary event for what b suppressed, if
// anything, and resets the count. Callers hold the limiter's lock.
func (b *eventBucket) takeSummary(now time.Time) (egress.Event, bool) {
	if b.suppressed == 0 {
		return egress.Event{}, false
	}
	e := egress.Event{
		Time:     now,
		Kind:     b.kind,
		Decision: b.decision,
		Reason: fmt.Sprintf("%d more %q events (decision %q) were not logged one by one: rate limit, since %s",
			b.suppressed, b.kind, b.decision, b.since.UTC().Format(time.RFC3339)),
	}
	b.suppressed = 0
	return e, true
}

// flush records the summaries of everything suppressed so far.
func (l *eventLimiter) flush() {
	now := l.now()
	var out []egress.Event
	l.mu.Lock()
	for _, b := range l.buckets {
		if e, ok := b.takeSummary(now); ok {
			out = append(out, e)
		}
	}
	l.mu.Unlock()
	for _, e := range out {
		l.sink.Record(e)
	}
}
