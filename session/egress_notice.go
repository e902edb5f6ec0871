package session

import (
	"fmt"
	"io"
	"sync"

	"github.com/vibedom/vibedom/termtext"
)

// Telling an attached terminal that ask mode waits for an answer, without
// touching what a full-screen agent drew: a bell and the terminal's title
// (xterm's title stack saves the user's own title and brings it back once
// nothing is asked any more). Nothing is written into the screen. A notice
// is written only between escape sequences of the agent's output, never
// inside one.

// noticeHub is the set of terminals that show notices.
type noticeHub struct {
	mu    sync.Mutex
	terms map[*noticeTerm]struct{}
}

func (h *noticeHub) add(t *noticeTerm) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.terms == nil {
		h.terms = map[*noticeTerm]struct{}{}
	}
	h.terms[t] = struct{}{}
	return func() {
		h.mu.Lock()
		delete(h.terms, t)
		h.mu.Unlock()
	}
}

// asked shows a new question on every terminal; pending is how many are
// open now.
func (h *noticeHub) asked(session string, q Question, pending int) {
	more := ""
	if pending > 1 {
		more = fmt.Sprintf(" (+%d more)", pending-1)
	}
	title := fmt.Sprintf("vibedom: %s asks to reach %s%s: answer with vibedom watch %s", session, q.Name, more, session)
	h.each(func(t *noticeTerm) { t.notice(title) })
}

// cleared gives the terminals their titles back.
func (h *noticeHub) cleared() { h.each(func(t *noticeTerm) { t.clear() }) }

func (h *noticeHub) each(fn func(*noticeTerm)) {
	if h == nil {
		return
	}
	h.mu.Lock()
	ts := make([]*noticeTerm, 0, len(h.terms))
	for t := range h.terms {
		ts = append(ts, t)
	}
	h.mu.Unlock()
	for _, t := range ts {
		fn(t)
	}
}

// noticeTerm is an agent's output on its way to a terminal, with notices
// slipped in between escape sequences.
type noticeTerm struct {
	mu      sync.Mutex
	w       io.Writer
	esc     escState
	pending []byte // a notice waiting for the output to leave a sequence
	pushed  bool   // the user's title is on the terminal's title stack
}

func newNoticeTerm(w io.Writer) *noticeTerm { return &noticeTerm{w: w} }

func (t *noticeTerm) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.w.Write(p)
	t.esc.feed(p[:n])
	if err == nil && len(t.pending) > 0 && t.esc.ground() {
		_, err = t.w.Write(t.pending)
		t.pending = nil
	}
	return n, err
}

// notice sets the title (saving the user's first) and rings the bell.
func (t *noticeTerm) notice(title string) {
	seq := "\a"
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.pushed {
		seq += "\x1b[22;0t"
		t.pushed = true
	}
	seq += "\x1b]2;" + termtext.Line(title) + "\a"
	t.emitLocked(seq)
}

// clear brings the user's title back.
func (t *noticeTerm) clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pushed {
		t.pushed = false
		t.emitLocked("\x1b[23;0t")
	}
}

func (t *noticeTerm) emitLocked(seq string) {
	if t.esc.ground() {
		_, _ = io.WriteString(t.w, seq)
		return
	}
	t.pending = append(t.pending, seq...)
}

// escState follows a terminal output stream far enough to know whether it
// is between escape sequences (ground) or inside one: ESC, CSI, OSC, DCS
// and the like, and a UTF-8 character cut between writes.
type escState struct {
	st   byte // 0 ground, 'e' after ESC, '[' CSI, ']' string (OSC/DCS/SOS/PM/APC), 's' ESC inside a string, 'i' ESC intermediate
	utf8 int  // continuation bytes still due
}

func (e *escState) ground() bool { return e.st == 0 && e.utf8 == 0 }

func (e *escState) feed(p []byte) {
	for _, c := range p {
		switch e.st {
		case 0:
			switch {
			case e.utf8 > 0 && c&0xc0 == 0x80:
				e.utf8--
			case c == 0x1b:
				e.st, e.utf8 = 'e', 0
			case c == 0x9b:
				e.st, e.utf8 = '[', 0
			case c >= 0xc0 && c < 0xf8:
				e.utf8 = map[bool]int{true: 1, false: 2}[c < 0xe0]
				if c >= 0xf0 {
					e.utf8 = 3
				}
			default:
				e.utf8 = 0
			}
		case 'e':
			switch {
			case c == '[':
				e.st = '['
			case c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_':
				e.st = ']'
			case c >= 0x20 && c <= 0x2f:
				e.st = 'i'
			case c == 0x1b:
			default:
				e.st = 0
			}
		case 'i':
			if c < 0x20 || c > 0x2f {
				e.st = 0
			}
		case '[':
			if c >= 0x40 && c <= 0x7e {
				e.st = 0
			} else if c == 0x1b {
				e.st = 'e'
			}
		case ']':
			switch c {
			case 0x07, 0x9c:
				e.st = 0
			case 0x1b:
				e.st = 's'
			}
		case 's':
			if c == '\\' {
				e.st = 0
			} else {
				e.st = ']'
			}
		}
	}
}

// noticeOut returns w with ask mode's notices slipped in, until done is
// called.
func (s *sess) noticeOut(w io.Writer) (out io.Writer, done func()) {
	if s.egress == nil || s.egress.live == nil || s.egress.live.ask == nil {
		return w, func() {}
	}
	t := newNoticeTerm(w)
	return t, s.egress.notices.add(t)
}
