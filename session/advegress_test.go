package session

import (
	"strings"
	"testing"
	"time"
)

// waitPorts waits until name's question asks for n ports.
func waitPorts(t *testing.T, a *asker, name string, n int) Question {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		st, changed := a.state()
		for _, q := range st.Pending {
			if q.Name == name && len(q.Ports) == n {
				return q
			}
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s never asked for %d ports (pending %+v)", name, n, st.Pending)
		}
	}
}

// TestAskAnswerCoversShownPorts: the guest asks about a name on 443, the
// user is shown that question, and the guest then adds port 22 to it. The
// user's answer covers what they were shown: neither a session rule nor
// the held connection reaches port 22.
func TestAskAnswerCoversShownPorts(t *testing.T) {
	for _, ans := range []string{AnswerSession, AnswerOnce} {
		t.Run(ans, func(t *testing.T) {
			s := askHost(t, time.Minute)
			l := s.egress.live
			web := decideAsync(l, "sneaky.example", 443)
			q := waitPending(t, l.ask, "sneaky.example") // what the user is shown
			ssh := decideAsync(l, "sneaky.example", 22)
			waitPorts(t, l.ask, "sneaky.example", 2)
			if _, err := egressAsk(t, s, EgressRequest{Action: EgressAnswer, ID: q.ID, Answer: ans, Ports: q.Ports}); err != nil {
				t.Fatal(err)
			}
			if d := got(t, web); !d.Allow {
				t.Errorf("port 443, shown and answered %s: %+v", ans, d)
			}
			if d := got(t, ssh); d.Allow {
				t.Errorf("port 22, never shown to the user, let through by the answer %s: %+v", ans, d)
			}
			if d := l.cur.Load().p.Decide("sneaky.example", 22); d.Allow {
				t.Errorf("port 22 allowed by a rule after the answer %s: %+v", ans, d)
			}
		})
	}
}

// TestAskPortsBounded: one name's question takes at most maxQuestionPorts
// ports; a guest joining it port after port is refused at once past that,
// so neither the user's screen nor the rules an answer adds grow without
// bound.
func TestAskPortsBounded(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	for i := range maxQuestionPorts {
		decideAsync(l, "ports.example", uint16(1000+i))
	}
	waitPorts(t, l.ask, "ports.example", maxQuestionPorts)
	if d := got(t, decideAsync(l, "ports.example", 2000)); d.Allow || d.Pending || !strings.Contains(d.Reason, "not asked") {
		t.Errorf("a port past the bound: %+v", d)
	}
}
