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
