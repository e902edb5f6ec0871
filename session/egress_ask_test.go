package session

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// askHost is liveHost in ask mode.
func askHost(t *testing.T, timeout time.Duration) *sess {
	t.Helper()
	s := liveHost(t, "")
	s.egress.live.setAsk(newAsker(timeout))
	return s
}

// waitPending waits until name is asked about and returns its question.
func waitPending(t *testing.T, a *asker, name string) Question {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		st, changed := a.state()
		for _, q := range st.Pending {
			if q.Name == name {
				return q
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s was never asked about (pending %+v)", name, st.Pending)
		}
	}
}

// decideAsync runs Decide (port > 0) or DecideName (port 0) in the
// background.
func decideAsync(l *livePolicy, name string, port uint16) <-chan nfegress.Decision {
	ch := make(chan nfegress.Decision, 1)
	go func() {
		if port == 0 {
			ch <- l.DecideName(name)
		} else {
			ch <- l.Decide(name, port)
		}
	}()
	return ch
}

func answer(t *testing.T, s *sess, id int, ans string) {
	t.Helper()
	if _, err := egressAsk(t, s, EgressRequest{Action: EgressAnswer, ID: id, Answer: ans}); err != nil {
		t.Fatalf("answer %s: %v", ans, err)
	}
}

func got(t *testing.T, ch <-chan nfegress.Decision) nfegress.Decision {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not released")
	}
	return nfegress.Decision{}
}

func TestAskSessionAnswer(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	first := decideAsync(l, "q.example", 443)
	second := decideAsync(l, "Q.example.", 443) // the same name: one question
	q := waitPending(t, l.ask, "q.example")
	if st, _ := l.ask.state(); len(st.Pending) != 1 {
		t.Errorf("one name asked twice is %d questions", len(st.Pending))
	}
	select {
	case d := <-first:
		t.Fatalf("not held: %+v", d)
	default:
	}
	answer(t, s, q.ID, AnswerSession)
	for _, ch := range []<-chan nfegress.Decision{first, second} {
		if d := got(t, ch); !d.Allow || d.Rule != "q.example" {
			t.Errorf("after session: %+v", d)
		}
	}
	// Decided now by a live session rule: no new question.
	if d := l.Decide("q.example", 443); !d.Allow {
		t.Errorf("second request: %+v", d)
	}
	if c := l.check("q.example", 443); c.Scope != scopeSession {
		t.Errorf("check after the answer: %+v", c)
	}
}

func TestAskOnceAsksAgain(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	ch := decideAsync(l, "o.example", 443)
	answer(t, s, waitPending(t, l.ask, "o.example").ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Fatalf("once: %+v", d)
	}
	ch = decideAsync(l, "o.example", 443)
	q := waitPending(t, l.ask, "o.example") // asked again
	answer(t, s, q.ID, AnswerDeny)
	if d := got(t, ch); d.Allow || d.Rule != "!o.example" {
		t.Errorf("deny: %+v", d)
	}
	if d := l.Decide("o.example", 80); d.Allow || d.Rule != "!o.example" {
		t.Errorf("after deny: %+v", d)
	}
}

// TestAskDNS: a held DNS question is answered "pending" (SERVFAIL) after
// the hold, never "no such name", while the question stays open; a once
// answer lets the lookup and the connection that follows through.
func TestAskDNS(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	l.ask.dnsHold = 50 * time.Millisecond
	d := l.DecideName("dns.example")
	if d.Allow || !d.Pending {
		t.Fatalf("a held lookup after the hold: %+v", d)
	}
	q := waitPending(t, l.ask, "dns.example")
	if d := l.DecideName("dns.example"); !d.Pending { // a retry joins the question
		t.Fatalf("retry: %+v", d)
	}
	if st, _ := l.ask.state(); len(st.Pending) != 1 || st.Pending[0].ID != q.ID {
		t.Errorf("retries made more questions: %+v", st.Pending)
	}
	l.ask.dnsHold = 10 * time.Second
	ch := decideAsync(l, "dns.example", 0)
	waitPending(t, l.ask, "dns.example")
	answer(t, s, q.ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Fatalf("lookup after once: %+v", d)
	}
	if d := l.DecideName("dns.example"); !d.Allow { // the resolver's other query (AAAA)
		t.Errorf("second lookup within the pass: %+v", d)
	}
	// The pass is for a web port: another port is asked about anew, and
	// leaves the pass to the web connection.
	ch = decideAsync(l, "dns.example", 22)
	q22 := waitPending(t, l.ask, "dns.example")
	if !slices.Contains(q22.Ports, 22) {
		t.Errorf("the question for port 22 shows ports %v", q22.Ports)
	}
	answer(t, s, q22.ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Errorf("port 22 after its own once answer: %+v", d)
	}
	if d := l.Decide("dns.example", 443); !d.Allow {
		t.Errorf("the connection after the lookup: %+v", d)
	}
	l.ask.dnsHold = 50 * time.Millisecond
	if d := l.DecideName("dns.example"); !d.Pending {
		t.Errorf("the next lookup is not asked again: %+v", d)
	}
}

func TestAskTimeoutDenies(t *testing.T) {
	s := askHost(t, 100*time.Millisecond)
	d := s.egress.live.Decide("late.example", 443)
	if d.Allow || !strings.Contains(d.Reason, "did not answer") {
		t.Errorf("timeout: %+v", d)
	}
	if st, _ := s.egress.live.ask.state(); len(st.Pending) != 0 || len(st.Recent) != 1 || st.Recent[0].Answer != answerTimeout {
		t.Errorf("after the timeout: %+v", st)
	}
}

// TestAskNeverGuarded: IP literals, host-local names and names a rule
// decides are never asked about.
func TestAskNeverGuarded(t *testing.T) {
	s := askHost(t, 200*time.Millisecond)
	s.egress.live.ask.dnsHold = 50 * time.Millisecond
	l := s.egress.live
	for _, c := range []struct {
		name string
		port uint16
	}{{"127.0.0.1", 80}, {"169.254.169.254", 80}, {"10.0.0.1", 443}, {"localhost", 80}, {"x.localhost", 443}, {"metadata.google.internal", 80}, {"bad_name", 443}} {
		if d := l.Decide(c.name, c.port); d.Allow || d.Pending {
			t.Errorf("%s: %+v", c.name, d)
		}
		if d := l.DecideName(c.name); d.Allow || d.Pending {
			t.Errorf("DNS %s: %+v", c.name, d)
		}
	}
	if d := l.Decide("flag.example", 443); !d.Allow {
		t.Errorf("a name a rule allows: %+v", d)
	}
	if st, _ := l.ask.state(); len(st.Pending)+len(st.Recent) != 0 {
		t.Errorf("asked: %+v", st)
	}
}

// TestAskAnsweredByAllow: vibedom allow answers the open questions its
// rule covers; several open questions are listed together.
func TestAskAnsweredByAllow(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	a := decideAsync(l, "a.w.example", 443)
	b := decideAsync(l, "other.example", 443)
	waitPending(t, l.ask, "a.w.example")
	waitPending(t, l.ask, "other.example")
	if st, _ := l.ask.state(); len(st.Pending) != 2 {
		t.Errorf("pending: %+v", st.Pending)
	}
	if _, err := egressAsk(t, s, EgressRequest{Action: EgressAllow, Rules: []string{"*.w.example"}}); err != nil {
		t.Fatal(err)
	}
	if d := got(t, a); !d.Allow || d.Rule != "*.w.example" {
		t.Errorf("covered question: %+v", d)
	}
	if _, err := egressAsk(t, s, EgressRequest{Action: EgressDeny, Rules: []string{"other.example"}}); err != nil {
		t.Fatal(err)
	}
	if d := got(t, b); d.Allow {
		t.Errorf("denied question: %+v", d)
	}
}

// TestNoticeBetweenSequences: a notice waits until the agent's output
// leaves an escape sequence, and says nothing on the screen.
func TestNoticeBetweenSequences(t *testing.T) {
	var out bytes.Buffer
	nt := newNoticeTerm(&out)
	nt.Write([]byte("text \x1b[31"))
	nt.notice("vibedom: asks")
	if strings.Contains(out.String(), "asks") {
		t.Fatalf("notice written inside a CSI sequence: %q", out.String())
	}
	nt.Write([]byte("mred"))
	nt.Write([]byte("\x1b]0;agent title"))
	if !strings.Contains(out.String(), "\x1b[31mred\a\x1b[22;0t\x1b]2;vibedom: asks\a\x1b]0;agent title") {
		t.Fatalf("notice not written right after the sequence: %q", out.String())
	}
	nt.notice("two")
	if strings.Contains(out.String(), "two") {
		t.Fatalf("notice written inside an OSC string: %q", out.String())
	}
	nt.Write([]byte("\x1b\\é"[:len("\x1b\\é")-1])) // ST, then half a UTF-8 character
	if strings.Contains(out.String(), "two") {
		t.Fatalf("notice written inside a UTF-8 character: %q", out.String())
	}
	nt.Write([]byte("\xa9"))
	if !strings.HasSuffix(out.String(), "\xa9\a\x1b]2;two\a") {
		t.Fatalf("second notice: %q", out.String())
	}
	nt.clear()
	if !strings.HasSuffix(out.String(), "\x1b[23;0t") {
		t.Fatalf("title not given back: %q", out.String())
	}
}

// BenchmarkAskAnswerToRelease measures how long a held request waits after
// the user's answer (docs/policy.md: the answer releases it at once).
func BenchmarkAskAnswerToRelease(b *testing.B) {
	a := newAsker(time.Minute)
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		name := "b" + strconv.Itoa(i) + ".example"
		done := make(chan time.Time, 1)
		_, changed := a.state()
		go func() { a.ask(name, 443, 0); done <- time.Now() }()
		for {
			<-changed
			var st AskState
			st, changed = a.state()
			if len(st.Pending) > 0 {
				break
			}
		}
		st, _ := a.state()
		t0 := time.Now()
		if _, err := a.answer(st.Pending[0].ID, AnswerOnce, nil, nil); err != nil {
			b.Fatal(err)
		}
		total += (<-done).Sub(t0)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-answer-to-release")
}

// TestAskBounded: a guest asking about name after name gets at most
// maxPending open questions; the next names are refused at once.
func TestAskBounded(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	for i := range maxPending {
		decideAsync(l, "n"+strconv.Itoa(i)+".example", 443)
	}
	for {
		st, changed := l.ask.state()
		if len(st.Pending) == maxPending {
			break
		}
		<-changed
	}
	if d := l.Decide("one-more.example", 443); d.Allow || d.Pending || !strings.Contains(d.Reason, "not asked") {
		t.Errorf("past the bound: %+v", d)
	}
}

// TestAskFeedRedacted: the watch's request feed keeps the latest requests,
// their strings through the session's log redactor.
func TestAskFeedRedacted(t *testing.T) {
	a := newAsker(time.Minute)
	redact := func(s string) string { return strings.ReplaceAll(s, "s3cr3t", "[REDACTED:SECRET]") }
	for i := range maxFeed + 5 {
		a.record(nfegress.Event{Kind: "request", Name: "s3cr3t.example", Port: 443, Method: "GET", Decision: "deny",
			Status: 403, Reason: "no rule " + strconv.Itoa(i)}, redact)
	}
	a.record(nfegress.Event{Kind: "udp", Decision: "deny"}, redact)
	st, _ := a.state()
	if len(st.Requests) != maxFeed || st.Requests[maxFeed-1].Reason != "no rule "+strconv.Itoa(maxFeed+4) {
		t.Fatalf("feed: %d lines, last %+v", len(st.Requests), st.Requests[len(st.Requests)-1])
	}
	for _, r := range st.Requests {
		if strings.Contains(r.Name, "s3cr3t") || r.Kind == "udp" {
			t.Errorf("feed line %+v", r)
		}
	}
}

// TestAskRecheck: the recheck of an admitted connection (the mitmproxy
// engine's upstream dial) never asks; a once answer's connection passes
// it.
func TestAskRecheck(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	if d := nfegress.Recheck(nfegress.LimitWildcards(l), "never-asked.example", 443); d.Allow || d.Pending {
		t.Errorf("recheck of an undecided name: %+v", d)
	}
	ch := decideAsync(l, "o.example", 443)
	answer(t, s, waitPending(t, l.ask, "o.example").ID, AnswerOnce)
	if d := got(t, ch); !d.Allow {
		t.Fatalf("once: %+v", d)
	}
	if d := nfegress.Recheck(nfegress.LimitWildcards(l), "o.example", 443); !d.Allow {
		t.Errorf("recheck after once: %+v", d)
	}
	if st, _ := l.ask.state(); len(st.Pending) != 0 {
		t.Errorf("a recheck asked: %+v", st.Pending)
	}
}
