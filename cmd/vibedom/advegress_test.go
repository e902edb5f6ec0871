package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/session"
)

// TestWatchAnswersShownPorts: a port the guest adds to an open question
// is printed again, and a key answers only the ports printed when the
// state was shown.
func TestWatchAnswersShownPorts(t *testing.T) {
	var out bytes.Buffer
	w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
	q := session.Question{ID: 1, Name: "sneaky.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Minute)}
	w.show(session.AskState{Pending: []session.Question{q}})
	q.Ports = []uint16{22, 443}
	w.show(session.AskState{Pending: []session.Question{q}})
	got, ok := w.oldest()
	if !ok || !slices.Equal(got.Ports, []uint16{22, 443}) {
		t.Errorf("oldest after the reprint: %+v", got)
	}
	if !strings.Contains(out.String(), "sneaky.example (port 22, port 443) now") {
		t.Errorf("the added port was not printed:\n%s", out.String())
	}
}

// TestWatchKeyAfterHeadChange: when the oldest question times out, a key
// pressed at that moment was meant for it: it does not answer the next
// question, which a key answers only after headGrace.
func TestWatchKeyAfterHeadChange(t *testing.T) {
	var out bytes.Buffer
	w := &watchView{out: &out, nl: "\n", session: "s", seen: map[int]bool{}, shown: map[int][]uint16{}}
	x := session.Question{ID: 1, Name: "asked.example", Ports: []uint16{443}, Deadline: time.Now().Add(time.Second)}
	y := session.Question{ID: 2, Name: "other.example", Ports: []uint16{22}, Deadline: time.Now().Add(time.Minute)}
	w.show(session.AskState{Pending: []session.Question{x, y}})
	if q, ok, _ := w.answerable(time.Now()); !ok || q.ID != x.ID {
		t.Fatalf("first question: %+v %v, want %s answerable at once", q, ok, x.Name)
	}
	x.Answer = "timeout"
	w.show(session.AskState{Pending: []session.Question{y}, Recent: []session.Question{x}})
	if q, ok, fresh := w.answerable(time.Now()); ok || !fresh {
		t.Errorf("a key just after %s left answers %+v (ok %v, fresh %v)", x.Name, q, ok, fresh)
	}
	if q, ok, _ := w.answerable(time.Now().Add(headGrace)); !ok || q.ID != y.ID {
		t.Errorf("after the grace: %+v %v, want %s", q, ok, y.Name)
	}
	if !strings.Contains(out.String(), "a key now answers other.example (port 22)") {
		t.Errorf("the new head was not announced:\n%s", out.String())
	}
}
