package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

// vibedom watch: the questions of a session in ask mode, answered with one
// key.

func init() {
	commands = append(commands, &cli.Command{
		Name:      "watch",
		Usage:     "watch a session's requests and answer its questions about names it wants to reach (run --egress ask), one key each",
		ArgsUsage: "SESSION",
		Description: `Shows the guest's requests as they happen and lists the names it waits for,
oldest first, answering the oldest with one key: o once (this request only), s session (a rule for the
rest of the session), a always (also saved to ~/.vibedom/trusted_domains.txt),
d deny (for the session). q quits. Without a terminal, each line of standard
input is one key. Unanswered questions are denied when they time out. When the oldest
question times out (or is answered elsewhere), the next is announced and keys pressed in
the next 1.5 s are not taken for it, nor for ports just added to it: press again.`,
		Action: watchAction,
	})
}

var watchKeys = map[byte]string{'o': session.AnswerOnce, 's': session.AnswerSession, 'a': session.AnswerAlways, 'd': session.AnswerDeny}

func watchAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() != 1 {
		return fmt.Errorf("watch one session: `vibedom watch SESSION` (`vibedom list` shows them)")
	}
	name := c.Args().First()
	home, err := home.Default()
	if err != nil {
		return err
	}
	info, err := session.FindSession(home, name)
	if err != nil {
		return err
	}
	conn, err := session.DialControl(info)
	if err != nil {
		return err
	}
	defer conn.Close()
	out := cmdOut(c)
	nl := "\n"
	if fd := int(os.Stdin.Fd()); term.IsTerminal(fd) {
		if old, err := term.MakeRaw(fd); err == nil {
			defer term.Restore(fd, old)
			nl = "\r\n"
		}
	}
	w := &watchView{out: out, nl: nl, session: info.Name, seen: map[int]bool{}, shown: map[int][]uint16{}}
	w.printf("watching session %s: o once · s session · a always · d deny (the oldest question) · q quits", termtext.Line(info.Name))
	keys := make(chan byte)
	go readKeys(os.Stdin, keys)
	done := make(chan error, 1)
	go func() { done <- conn.WatchAsk(func(st session.AskState) bool { w.show(st); return true }) }()
	for {
		select {
		case err := <-done:
			if err == nil {
				w.printf("session %s ended", termtext.Line(info.Name))
			}
			return err
		case <-ctx.Done():
			return nil
		case k, ok := <-keys:
			if !ok || k == 'q' || k == 3 || k == 4 {
				return nil
			}
			ans, isAnswer := watchKeys[k]
			if !isAnswer {
				continue
			}
			q, ok, fresh := w.answerable(time.Now())
			if fresh {
				w.printf("%s%s only just became what a key answers: press again to answer it", termtext.Line(q.Name), portList(q.Ports))
				continue
			}
			if !ok {
				w.printf("nothing to answer")
				continue
			}
			rep, err := egressDo(info.Name, session.EgressRequest{Action: session.EgressAnswer, ID: q.ID, Answer: ans, Ports: q.Ports})
			if err != nil {
				w.printf("%s: %v", termtext.Line(q.Name), termtext.Line(err.Error()))
				continue
			}
			if rep.Saved != "" {
				w.printf("saved to %s", termtext.Line(rep.Saved))
			}
		}
	}
}

// readKeys sends each byte of r (a raw terminal: a key; otherwise the
// first byte of each line).
func readKeys(r io.Reader, keys chan<- byte) {
	defer close(keys)
	br := bufio.NewReader(r)
	for {
		b, err := br.ReadByte()
		if err != nil {
			return
		}
		if b == '\n' || b == '\r' || b == ' ' {
			continue
		}
		keys <- b
	}
}

// watchView prints questions once each, and their answers.
type watchView struct {
	mu      sync.Mutex
	out     io.Writer
	nl      string
	session string
	seen    map[int]bool // printed (negative: answer printed)
	pending []session.Question
	feedSeq uint64 // the last request printed
	// shown are the ports printed for each question: an answer covers
	// those only, not a port the guest added since.
	shown map[int][]uint16
	// head is the oldest question, the one a key answers, and since when
	// it is: a key pressed just after another question left the head (it
	// timed out, or was answered elsewhere) was meant for that one.
	head      int
	headSince time.Time
	headLeft  time.Time // when the list last emptied with a head in it
}

// headGrace is how long after a new question became the one a key
// answers keys are not taken for it.
const headGrace = 1500 * time.Millisecond

func (w *watchView) printf(format string, args ...any) {
	fmt.Fprintf(w.out, time.Now().Format("15:04:05")+" "+format+w.nl, args...)
}

func (w *watchView) show(st session.AskState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = st.Pending
	defer func() {
		now := time.Now()
		if len(st.Pending) == 0 {
			if w.head != 0 {
				w.headLeft = now
			}
			w.head = 0
			return
		}
		if id := st.Pending[0].ID; id != w.head {
			// Another question was answered or timed out (the list may
			// have been empty in between: the guest, refused, asks anew
			// at once): guard this one, and say which a key answers now.
			if w.head != 0 || now.Sub(w.headLeft) < headGrace {
				w.headSince = now
				w.printf("  a key now answers %s%s", termtext.Line(st.Pending[0].Name), portList(w.shown[id]))
			}
			w.head = id
		}
	}()
	for _, r := range st.Requests {
		if r.Seq <= w.feedSeq {
			continue
		}
		w.feedSeq = r.Seq
		what := r.Kind
		if r.Method != "" {
			what = r.Method
		}
		target := r.Name
		if r.Port != 0 {
			target += ":" + strconv.Itoa(int(r.Port))
		}
		status := ""
		if r.Status != 0 {
			status = " " + strconv.Itoa(r.Status)
		}
		reason := ""
		if r.Decision != "allow" && r.Reason != "" {
			reason = ": " + r.Reason
		}
		// Names and reasons come from the guest.
		w.printf("  %-5s %s %s%s%s", r.Decision, termtext.Line(what), termtext.Line(target), status, termtext.Line(reason))
	}
	for _, q := range st.Recent {
		if !w.seen[-q.ID] {
			w.seen[-q.ID] = true
			if w.seen[q.ID] || q.Answer != "" {
				w.seen[q.ID] = true
				w.printf("  %s: %s", termtext.Line(q.Name), q.Answer)
			}
		}
	}
	for i, q := range st.Pending {
		if w.seen[q.ID] {
			if !slices.Equal(w.shown[q.ID], q.Ports) {
				w.shown[q.ID] = q.Ports
				if i == 0 && q.ID == w.head {
					// A key now covers ports printed only just now.
					w.headSince = time.Now()
				}
				w.printf("? %s wants %s%s now", termtext.Line(w.session), termtext.Line(q.Name), portList(q.Ports))
			}
			continue
		}
		w.seen[q.ID] = true
		w.shown[q.ID] = q.Ports
		more := ""
		if i > 0 {
			more = fmt.Sprintf(" (%d before it)", i)
		}
		w.printf("? %s wants %s%s, %ds left%s", termtext.Line(w.session), termtext.Line(q.Name), portList(q.Ports),
			int(time.Until(q.Deadline).Seconds()), more)
	}
}

func (w *watchView) oldest() (session.Question, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return session.Question{}, false
	}
	q := w.pending[0]
	q.Ports = w.shown[q.ID]
	return q, true
}

// answerable is oldest, unless it became the oldest under headGrace ago
// while another was (ok false, fresh true): the key was meant for the one
// that left.
func (w *watchView) answerable(now time.Time) (q session.Question, ok, fresh bool) {
	q, ok = w.oldest()
	if !ok {
		return q, false, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.head == q.ID && now.Sub(w.headSince) < headGrace {
		return q, false, true
	}
	return q, true, false
}

func portList(ports []uint16) string {
	var ps []string
	for _, p := range ports {
		if p == 0 {
			ps = append(ps, "DNS")
		} else {
			ps = append(ps, "port "+strconv.Itoa(int(p)))
		}
	}
	return " (" + strings.Join(ps, ", ") + ")"
}
