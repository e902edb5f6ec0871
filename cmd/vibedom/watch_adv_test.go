package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/session"
)

// TestWatchKeyAfterHeadLeftAdv (adversarial): the guest learns the moment
// its question times out (its connection is refused) and can ask about
// another name at once. The watch view sees the list empty, then the new
// question: a key pressed then was meant for the one that left, and must
// not answer the new one (say "always" for a name the user never read).
// Likewise when the ports of the question a key answers grow just before
// the key: the key does not cover ports printed a moment ago.
func TestWatchKeyAfterHeadLeftAdv(t *testing.T) {
	t.Run("list emptied in between", func(t *testing.T) {
		var out bytes.Buffer
		w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
		x := session.Question{ID: 1, Name: "asked.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Second)}
		y := session.Question{ID: 2, Name: "exfil.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Minute)}
		w.show(session.AskState{Pending: []session.Question{x}})
		if _, ok, _ := w.answerable(time.Now()); !ok {
			t.Fatalf("first question not answerable")
		}
		x.Answer = "timeout"
		w.show(session.AskState{Recent: []session.Question{x}})
		w.show(session.AskState{Pending: []session.Question{y}, Recent: []session.Question{x}})
		if q, ok, fresh := w.answerable(time.Now()); ok || !fresh {
			t.Errorf("a key just after %s left answers %+v (ok %v, fresh %v)", x.Name, q, ok, fresh)
		}
		if q, ok, _ := w.answerable(time.Now().Add(headGrace)); !ok || q.ID != y.ID {
			t.Errorf("after the grace: %+v %v, want %s", q, ok, y.Name)
		}
		if !strings.Contains(out.String(), "a key now answers exfil.example (port 443)") {
			t.Errorf("the new head was not announced:\n%s", out.String())
		}
	})
	t.Run("head ports grew", func(t *testing.T) {
		var out bytes.Buffer
		w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
		x := session.Question{ID: 1, Name: "asked.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Minute)}
		w.show(session.AskState{Pending: []session.Question{x}})
		x.Ports = []uint16{22, 443}
		w.show(session.AskState{Pending: []session.Question{x}})
		if q, ok, fresh := w.answerable(time.Now()); ok || !fresh {
			t.Errorf("a key just after port 22 was added answers %+v (ok %v, fresh %v)", q, ok, fresh)
		}
		if q, ok, _ := w.answerable(time.Now().Add(headGrace)); !ok || len(q.Ports) != 2 {
			t.Errorf("after the grace: %+v %v, want both ports", q, ok)
		}
	})
	t.Run("first question after a quiet time", func(t *testing.T) {
		var out bytes.Buffer
		w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
		x := session.Question{ID: 1, Name: "asked.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Minute)}
		w.show(session.AskState{Pending: []session.Question{x}})
		if _, ok, _ := w.answerable(time.Now()); !ok {
			t.Errorf("the first question of a session is not answerable at once")
		}
	})
}

// TestWatchEscapesGuestTextAdv (adversarial): names, methods, URLs and
// reasons in the watch view come from the guest: terminal control
// sequences, C1 controls and bidi overrides in any of them reach the
// terminal escaped, never raw.
func TestWatchEscapesGuestTextAdv(t *testing.T) {
	var out bytes.Buffer
	w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
	evil := "a\x1b]2;pwned\x07\x1b[2J\u009b31m\u202egpj.exe\r\nb"
	q := session.Question{ID: 1, Name: evil, Ports: []uint16{443}, Deadline: time.Now().Add(time.Minute)}
	w.show(session.AskState{
		Pending:  []session.Question{q},
		Requests: []session.FeedLine{{Seq: 1, Kind: "request", Method: evil, Name: evil, Port: 443, Decision: "deny", Reason: evil}},
	})
	q.Answer = "deny"
	w.show(session.AskState{Recent: []session.Question{q}})
	s := out.String()
	for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e", "\r"} {
		if strings.Contains(s, bad) {
			t.Errorf("the watch view printed %q raw:\n%q", bad, s)
		}
	}
}
