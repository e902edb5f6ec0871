package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// Ask mode (run --egress ask): a connection or DNS question for a name no
// rule decides is held while the user is asked. The answer is once (this
// request, and the connection that follows its DNS answer), session (a
// live session rule), always (a live rule saved to the user's file) or
// deny (a live session deny rule); no answer within the timeout denies the
// request. Many requests for one name are one question. Names only: an IP
// literal no rule names, and host-local names, are denied as before, and
// whatever an answer allows still passes the dial guard.
//
// A DNS question is held at most dnsHold, less than a stub resolver's
// timeout: while the question is open its answer is SERVFAIL, a temporary
// failure the resolver and the client retry, never NXDOMAIN, which
// resolvers and agents take as final.

// Egress modes (run --egress).
const (
	EgressModeDeny = "deny"
	EgressModeAsk  = "ask"
)

// Answers to a question.
const (
	AnswerOnce    = "once"
	AnswerSession = "session"
	AnswerAlways  = "always"
	AnswerDeny    = "deny"
	answerTimeout = "timeout"
	answerTooMany = "too many" // not asked: maxPending questions are open
	answerPorts   = "ports"    // not asked: the name's question has maxQuestionPorts ports
	answerDecided = "decided"  // not asked: a rule decides it now
)

// DefaultAskTimeout is how long a question waits for the user.
const DefaultAskTimeout = 60 * time.Second

const (
	// dnsHold is how long a DNS question is held before it is answered
	// SERVFAIL (the question stays open).
	dnsHold = 3 * time.Second
	// passTTL is how long a once answer given to a DNS question waits for
	// the connection that follows it.
	passTTL = 10 * time.Second
	// maxPending bounds the open questions: a guest asking about name
	// after name must not flood the user (or the host); past it a new
	// name is refused at once.
	maxPending = 32
	// maxQuestionPorts bounds the ports one question asks for: past it a
	// request for another port of the name is refused at once.
	maxQuestionPorts = 8
)

// Question is one name waiting for the user's answer.
type Question struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
	// Ports are the ports asked for (0: a DNS question, any port).
	Ports    []uint16  `json:"ports"`
	Asked    time.Time `json:"asked"`
	Deadline time.Time `json:"deadline"`
	// Answer is set once answered ("timeout" when nobody did).
	Answer string `json:"answer,omitempty"`
}

// FeedLine is one of the guest's requests (or refusals) as `vibedom
// watch` shows it: names and reasons pass the session's log redactor.
type FeedLine struct {
	Seq      uint64    `json:"seq"`
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`
	Name     string    `json:"name,omitempty"`
	Port     uint16    `json:"port,omitempty"`
	Method   string    `json:"method,omitempty"`
	Decision string    `json:"decision"`
	Status   int       `json:"status,omitempty"`
	Reason   string    `json:"reason,omitempty"`
}

// AskState is what `vibedom watch` shows: the open questions, oldest
// first, the latest answers and the latest requests.
type AskState struct {
	Mode     string     `json:"mode"`
	Pending  []Question `json:"pending"`
	Recent   []Question `json:"recent,omitempty"`
	Requests []FeedLine `json:"requests,omitempty"`
	// Seq grows with every change.
	Seq uint64 `json:"seq"`
}

type question struct {
	Question
	done chan struct{}
	// answered are the ports the answer covers: those the user was
	// shown. A request held for another port is decided afresh.
	answered []uint16
}

// asker holds the open questions of a session in ask mode.
type asker struct {
	timeout time.Duration
	dnsHold time.Duration
	notify  func(Question) // a new question (the attached terminal); may be nil
	// decided reports whether a rule decides name:port now (port 0: the
	// name); checked before a new question opens, so a request that
	// missed an answer's new rule is not asked again.
	decided func(name string, port uint16) bool
	onClear func() // no question is open any more; may be nil

	mu      sync.Mutex
	nextID  int
	seq     uint64
	pending map[string]*question // by name
	recent  []Question
	passes  map[string]time.Time // once answers to DNS questions, by name
	// onceAdmitted: connections a once answer admitted, by name:port, for
	// their own upstream dial (Recheck).
	onceAdmitted map[string]time.Time
	changed      chan struct{} // closed and replaced on every change
	feed         []FeedLine    // the latest requests, oldest first
	feedSeq      uint64
}

// maxFeed is how many requests the watch state keeps.
const maxFeed = 20

// record adds a network event to the feed (redact scrubs its strings).
func (a *asker) record(ev nfegress.Event, redact func(string) string) {
	switch ev.Kind {
	case "dns", "connect", "request", "proxy":
	default:
		return
	}
	if ev.Kind == "dns" && ev.Decision == "allow" {
		return // the connection that follows says more
	}
	if redact == nil {
		redact = func(s string) string { return s }
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.feedSeq++
	a.feed = append(a.feed, FeedLine{Seq: a.feedSeq, Time: ev.Time, Kind: ev.Kind, Name: redact(ev.Name), Port: ev.Port,
		Method: ev.Method, Decision: ev.Decision, Status: ev.Status, Reason: redact(ev.Reason)})
	if len(a.feed) > maxFeed {
		a.feed = a.feed[len(a.feed)-maxFeed:]
	}
	a.changedLocked()
}

func newAsker(timeout time.Duration) *asker {
	if timeout <= 0 {
		timeout = DefaultAskTimeout
	}
	return &asker{timeout: timeout, dnsHold: dnsHold, pending: map[string]*question{}, passes: map[string]time.Time{},
		onceAdmitted: map[string]time.Time{}, changed: make(chan struct{})}
}

// changedLocked wakes the watchers.
func (a *asker) changedLocked() {
	a.seq++
	close(a.changed)
	a.changed = make(chan struct{})
}

// state returns the questions now and a channel closed at the next change.
func (a *asker) state() (AskState, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := AskState{Mode: EgressModeAsk, Seq: a.seq, Recent: slices.Clone(a.recent), Requests: slices.Clone(a.feed)}
	for _, q := range a.pending {
		qq := q.Question
		qq.Ports = slices.Clone(q.Ports) // ask sorts q.Ports in place
		st.Pending = append(st.Pending, qq)
	}
	slices.SortFunc(st.Pending, func(x, y Question) int { return x.ID - y.ID })
	return st, a.changed
}

// takePass consumes a once answer's pass for name.
func (a *asker) takePass(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.passes[name]
	if ok {
		delete(a.passes, name)
	}
	return ok && time.Now().Before(exp)
}

// noteOnce records that a connection to name and port was admitted by a
// once answer: its own upstream dial (Recheck) may follow within passTTL,
// to that port only.
func (a *asker) noteOnce(name string, port uint16) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onceAdmitted[nfegress.HostPort(name, port)] = time.Now().Add(passTTL)
}

// admittedOnce reports whether a once answer admitted a connection to
// name and port within passTTL.
func (a *asker) admittedOnce(name string, port uint16) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.onceAdmitted[nfegress.HostPort(name, port)]
	return ok && time.Now().Before(exp)
}

// hasPass reports whether a once answer's pass for name is open.
func (a *asker) hasPass(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	exp, ok := a.passes[name]
	return ok && time.Now().Before(exp)
}

// ask opens (or joins) the question for name and waits for its answer at
// most hold (0: until the question's deadline). It returns the answer, or
// "" when the hold ended first.
func (a *asker) ask(name string, port uint16, hold time.Duration) string {
	a.mu.Lock()
	q := a.pending[name]
	isNew := q == nil
	if isNew && a.decided != nil && a.decided(name, port) {
		a.mu.Unlock()
		return answerDecided
	}
	if isNew && len(a.pending) >= maxPending {
		a.mu.Unlock()
		return answerTooMany
	}
	if isNew {
		a.nextID++
		now := time.Now()
		q = &question{Question: Question{ID: a.nextID, Name: name, Asked: now, Deadline: now.Add(a.timeout)}, done: make(chan struct{})}
		a.pending[name] = q
		time.AfterFunc(a.timeout, func() { a.answer(q.ID, answerTimeout, nil, nil) })
	}
	if !slices.Contains(q.Ports, port) {
		if len(q.Ports) >= maxQuestionPorts {
			a.mu.Unlock()
			return answerPorts
		}
		q.Ports = append(q.Ports, port)
		slices.Sort(q.Ports)
	}
	a.changedLocked()
	notify := a.notify
	a.mu.Unlock()
	if isNew && notify != nil {
		notify(q.Question)
	}
	var expire <-chan time.Time
	if hold > 0 {
		t := time.NewTimer(hold)
		defer t.Stop()
		expire = t.C
	}
	select {
	case <-q.done:
		if q.Answer != answerTimeout && !slices.Contains(q.answered, port) {
			// Asked for after the user saw the question: not answered.
			return answerDecided
		}
		return q.Answer
	case <-expire:
		return ""
	}
}

// answer closes question id with ans; apply, when not nil, runs first
// (the live rule an answer adds) and may refuse the answer. shown, when
// not empty, are the ports the user was shown: the answer covers only
// those. It reports the question (with the ports answered).
func (a *asker) answer(id int, ans string, shown []uint16, apply func(q Question) error) (Question, error) {
	a.mu.Lock()
	var q *question
	for _, p := range a.pending {
		if p.ID == id {
			q = p
		}
	}
	if q == nil {
		a.mu.Unlock()
		return Question{}, fmt.Errorf("no open question %d (answered already, or timed out)", id)
	}
	snap := q.Question
	snap.Ports = slices.Clone(q.Ports)
	if len(shown) > 0 {
		snap.Ports = slices.DeleteFunc(snap.Ports, func(p uint16) bool { return !slices.Contains(shown, p) })
		if len(snap.Ports) == 0 {
			a.mu.Unlock()
			return Question{}, fmt.Errorf("question %d asks for other ports now (%v): answer again", id, q.Ports)
		}
	}
	a.mu.Unlock()
	if apply != nil {
		if err := apply(snap); err != nil {
			return snap, err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending[q.Name] != q {
		return q.Question, fmt.Errorf("question %d was answered meanwhile", id)
	}
	delete(a.pending, q.Name)
	q.Answer, q.answered = ans, snap.Ports
	if ans == AnswerOnce && slices.Contains(snap.Ports, 0) {
		a.passes[q.Name] = time.Now().Add(passTTL)
	}
	a.recent = append(a.recent, q.Question)
	if len(a.recent) > 20 {
		a.recent = a.recent[len(a.recent)-20:]
	}
	close(q.done)
	a.changedLocked()
	if len(a.pending) == 0 && a.onClear != nil {
		go a.onClear()
	}
	return snap, nil
}

// covered returns the open questions match says a new rule covers.
func (a *asker) covered(match func(name string, port uint16) bool) []Question {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Question
	for _, q := range a.pending {
		for _, p := range q.Ports {
			if p == 0 {
				p = 443
			}
			if match(q.Name, p) {
				out = append(out, q.Question)
				break
			}
		}
	}
	return out
}

// rulesFor are the rules a session or always answer to q adds: the name
// on the default ports, plus each other port asked for.
func rulesFor(q Question, deny bool) []string {
	var out []string
	base := q.Name
	if deny {
		return []string{"!" + base}
	}
	def := false
	for _, p := range q.Ports {
		switch p {
		case 0, 80, 443:
			def = true
		default:
			out = append(out, base+":"+strconv.Itoa(int(p)))
		}
	}
	if def || len(out) == 0 {
		out = append([]string{base}, out...)
	}
	return out
}

// undecided reports whether d is the policy's default deny (no rule
// spoke about the name), the only case ask mode asks about.
func undecided(d nfegress.Decision) bool { return !d.Allow && d.Rule == "" }

// watchPace is the most often a watch gets a new state.
const watchPace = 100 * time.Millisecond

// serveWatch streams the ask state to a `vibedom watch` client: one JSON
// line now and one at every change, until the client goes away or the
// session ends.
func (s *sess) serveWatch(c net.Conn) {
	var a *asker
	if s.egress != nil && s.egress.live != nil {
		a = s.egress.live.ask
	}
	if a == nil {
		writeReply(c, ControlReply{Error: fmt.Sprintf("session %s does not ask about names (it runs with --egress deny): `vibedom allow %s RULE` changes its policy", s.name, s.name)})
		return
	}
	writeReply(c, ControlReply{OK: true})
	gone := make(chan struct{})
	go func() { // the client sends nothing more; its close ends the watch
		io.Copy(io.Discard, c)
		close(gone)
	}()
	enc := json.NewEncoder(c)
	for {
		st, changed := a.state()
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if err := enc.Encode(st); err != nil {
			return
		}
		select {
		case <-changed:
		case <-gone:
			return
		case <-s.ctl.stopReq:
			return
		}
		// A guest's burst of requests is one update, not thousands.
		select {
		case <-time.After(watchPace):
		case <-gone:
			return
		}
	}
}

// WatchAsk follows the ask state of a session: fn gets every state until
// it returns false or the connection ends.
func (c *ControlConn) WatchAsk(fn func(AskState) bool) error {
	rep, err := c.Do(ControlRequest{Op: OpWatch}, 30*time.Second)
	if err != nil {
		return err
	}
	_ = rep
	dec := json.NewDecoder(c.r)
	for {
		var st AskState
		if err := dec.Decode(&st); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("the session host went away: %w", err)
		}
		if !fn(st) {
			return nil
		}
	}
}

// notifyQuestion tells the user a new question waits: session.log, and
// the attached terminals (see termNotice), or the desktop when none is.
func (s *sess) notifyQuestion(q Question) {
	s.log.Info("egress: asking the user", "name", q.Name, "ports", q.Ports, "deadline", q.Deadline)
	if s.egress == nil {
		return
	}
	st, _ := s.egress.live.ask.state()
	s.egress.notices.asked(s.name, q, len(st.Pending))
	s.egress.desk.asked(s.name, q.Name, s.egress.notices.terminals())
}
