package session

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/netfilter"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// Live egress rules: `vibedom allow|deny SESSION RULE…` and `vibedom policy
// show|check` reach a running session's host over the control socket
// (OpEgress). The host keeps the policy as an immutable snapshot that every
// new connection and DNS question reads; a change builds a new snapshot
// and swaps it in, so a decision never sees half a change. Live rules are
// session scope, or user scope with --save (also appended to
// ~/.vibedom/trusted_domains.txt). No live rule reaches what the dial guard
// refuses: an IP rule naming such an address, a local name, or an
// allow-private rule is refused before anything changes.

// Egress actions of an OpEgress request.
const (
	EgressAllow  = "allow"
	EgressDeny   = "deny"
	EgressShow   = "show"
	EgressCheck  = "check"
	EgressAnswer = "answer" // an open question of ask mode
)

// EgressRequest is an OpEgress request.
type EgressRequest struct {
	Action string `json:"action"`
	// Rules are allow's or deny's rules, as written on the command line
	// (deny's may omit the "!").
	Rules []string `json:"rules,omitempty"`
	// Save also appends the rules to the user's rule file (user scope).
	Save bool `json:"save,omitempty"`
	// Name and Port are check's destination.
	Name string `json:"name,omitempty"`
	Port uint16 `json:"port,omitempty"`
	// ID and Answer answer a question of ask mode.
	ID     int    `json:"id,omitempty"`
	Answer string `json:"answer,omitempty"`
	// Ports are the question's ports the user was shown: the answer
	// covers only those (a port the guest asked for since is not
	// answered). Empty: all of them.
	Ports []uint16 `json:"ports,omitempty"`
}

// EgressRule is one rule in effect in a running session.
type EgressRule struct {
	Rule   string `json:"rule"`
	Source string `json:"source"`
	// Scope is builtin, user, workspace or session.
	Scope string `json:"scope"`
	Deny  bool   `json:"deny,omitempty"`
	// Live is true for a rule added while the session ran.
	Live bool `json:"live,omitempty"`
	// Since is when the rule took effect.
	Since time.Time `json:"since"`
}

// EgressDecision is check's answer.
type EgressDecision struct {
	Name string `json:"name"`
	Port uint16 `json:"port"`
	nfegress.Decision
	// Scope and Since describe the deciding rule (empty when none did).
	Scope string    `json:"scope,omitempty"`
	Since time.Time `json:"since,omitzero"`
}

// EgressReply is the host's answer to OpEgress.
type EgressReply struct {
	Session string `json:"session"`
	// Rules: show's rules in effect, lowest scope first; allow's and
	// deny's rules added.
	Rules []EgressRule `json:"rules,omitempty"`
	// Closed counts the connections a deny closed.
	Closed int `json:"closed,omitempty"`
	// Saved is the user rule file the rules were appended to.
	Saved string          `json:"saved,omitempty"`
	Check *EgressDecision `json:"check,omitempty"`
	// Answered is the question an answer closed.
	Answered *Question `json:"answered,omitempty"`
}

// Scopes of EgressRule.
const (
	scopeBuiltin   = "builtin"
	scopeUser      = "user"
	scopeWorkspace = "workspace"
	scopeSession   = "session"
)

// livePolicy is the session's egress policy as it stands now. It
// implements nfegress.StackPolicy for the stack and the proxy (through the
// wildcard guard, so live wildcards keep the new-name budget).
type livePolicy struct {
	cur     atomic.Pointer[policySnap]
	mu      sync.Mutex // serialises changes
	since   time.Time  // when the loaded rules took effect
	home    home.Home
	private []netip.Prefix // the loaded user scope's allow-private ranges
	ask     *asker         // nil unless the session runs in ask mode
}

// policySnap is one immutable state of the policy.
type policySnap struct {
	p     *nfegress.Policy
	live  map[string]liveRule // by rule Source
	rules []nfegress.Rule     // p's rules
}

type liveRule struct {
	scope string
	added time.Time
}

var _ nfegress.StackPolicy = (*livePolicy)(nil)

func newLivePolicy(h home.Home, p *nfegress.Policy, since time.Time) *livePolicy {
	l := &livePolicy{since: since, home: h, private: p.PrivateRanges()}
	l.cur.Store(&policySnap{p: p, live: map[string]liveRule{}, rules: p.Rules()})
	return l
}

// setAsk turns ask mode on with a.
func (l *livePolicy) setAsk(a *asker) {
	a.decided = func(name string, port uint16) bool {
		p := l.cur.Load().p
		if port == 0 {
			return !undecided(p.DecideName(name))
		}
		return !undecided(p.Decide(name, port))
	}
	l.ask = a
}

// Decide implements nfegress.StackPolicy. In ask mode a name no rule
// decides is held until the user answers or the question times out.
func (l *livePolicy) Decide(name string, port uint16) nfegress.Decision {
	d := l.cur.Load().p.Decide(name, port)
	if l.ask == nil || !undecided(d) {
		return d
	}
	n, ok := askable(name)
	if !ok {
		return d
	}
	// A once answer to a lookup names no port: it lets the next web
	// connection through, and any other port is asked about anew.
	if (port == 443 || port == 80) && l.ask.takePass(n) {
		l.ask.noteOnce(n, port)
		return onceDecision(n)
	}
	return l.afterAnswer(n, port, l.ask.ask(n, port, 0))
}

// DecideName implements nfegress.StackPolicy. In ask mode a name no rule
// decides is held at most dnsHold; still open, it is answered as pending
// (a temporary failure the guest's resolver retries).
func (l *livePolicy) DecideName(name string) nfegress.Decision {
	d := l.cur.Load().p.DecideName(name)
	if l.ask == nil || !undecided(d) {
		return d
	}
	n, ok := askable(name)
	if !ok {
		return d
	}
	if l.ask.hasPass(n) {
		return onceDecision(n)
	}
	return l.afterAnswer(n, 0, l.ask.ask(n, 0, l.ask.dnsHold))
}

// askable returns the normalised name when ask mode may ask about it:
// names only (not IP literals), never host-local ones.
func askable(name string) (string, bool) {
	if _, ok := nfegress.ParseAddr(name); ok {
		return "", false
	}
	n, err := nfegress.NormalizeName(name)
	if err != nil || nfegress.LocalName(n) {
		return "", false
	}
	return n, true
}

func onceDecision(n string) nfegress.Decision {
	return nfegress.Decision{Allow: true, Rule: n, Source: "answered once by the user", Reason: "the user allowed it once (ask mode)"}
}

// Recheck implements nfegress.Rechecker: for a connection already
// admitted (the mitmproxy engine's upstream dial), a name a once answer
// let through in the last passTTL stays allowed, and nobody is asked.
func (l *livePolicy) Recheck(name string, port uint16) nfegress.Decision {
	d := l.cur.Load().p.Decide(name, port)
	if l.ask == nil || !undecided(d) {
		return d
	}
	if n, ok := askable(name); ok && l.ask.admittedOnce(n, port) {
		return onceDecision(n)
	}
	return d
}

// afterAnswer turns the answer to n's question into the decision for the
// request that waited (port 0: a DNS question).
func (l *livePolicy) afterAnswer(n string, port uint16, ans string) nfegress.Decision {
	switch ans {
	case AnswerOnce:
		if port != 0 {
			l.ask.noteOnce(n, port)
		}
		return onceDecision(n)
	case answerTimeout:
		return nfegress.Decision{Source: "ask mode", Reason: fmt.Sprintf("the user was asked and did not answer within %v", l.ask.timeout)}
	case answerTooMany:
		return nfegress.Decision{Source: "ask mode", Reason: fmt.Sprintf("not asked: %d other names wait for the user's answer already", maxPending)}
	case answerPorts:
		return nfegress.Decision{Source: "ask mode", Reason: fmt.Sprintf("not asked: the user is asked about %s on %d ports already", n, maxQuestionPorts)}
	case "":
		return nfegress.Decision{Source: "ask mode", Reason: "waiting for the user's answer (ask mode): retry in a moment", Pending: true}
	}
	// session, always and deny answers added live rules.
	if port == 0 {
		return l.cur.Load().p.DecideName(n)
	}
	return l.cur.Load().p.Decide(n, port)
}

// scopeOf says which scope a loaded or live rule source belongs to.
func (l *livePolicy) scopeOf(snap *policySnap, source string) (string, time.Time, bool) {
	if lr, ok := snap.live[source]; ok {
		return lr.scope, lr.added, true
	}
	switch source {
	case nfegress.SourceBuiltin:
		return scopeBuiltin, l.since, false
	case nfegress.SourceFlag:
		return scopeSession, l.since, false
	}
	file := source
	if i := strings.LastIndexByte(file, ':'); i >= 0 {
		file = file[:i]
	}
	if rest, ok := strings.CutPrefix(file, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			file = filepath.Join(home, rest)
		}
	}
	if file == l.home.TrustedDomains() {
		return scopeUser, l.since, false
	}
	return scopeWorkspace, l.since, false
}

// show lists the rules in effect, lowest scope first.
func (l *livePolicy) show() []EgressRule {
	snap := l.cur.Load()
	out := make([]EgressRule, 0, len(snap.rules))
	for _, r := range snap.rules {
		scope, since, live := l.scopeOf(snap, r.Source)
		out = append(out, EgressRule{Rule: r.Text, Source: r.Source, Scope: scope, Deny: r.Deny, Live: live, Since: since})
	}
	return out
}

// check decides name:port as a new connection would, without spending
// the wildcard guard's budget.
func (l *livePolicy) check(name string, port uint16) *EgressDecision {
	snap := l.cur.Load()
	n := name
	if ip, ok := nfegress.ParseAddr(name); ok {
		n = ip.String()
	} else if nn, err := nfegress.NormalizeName(name); err == nil {
		n = nn
	}
	c := &EgressDecision{Name: n, Port: port, Decision: snap.p.Decide(name, port)}
	if c.Rule != "" {
		c.Scope, c.Since, _ = l.scopeOf(snap, c.Source)
	}
	return c
}

// liveSource names a live rule: unique per rule, so the wildcard guard
// keeps a bucket for each.
func liveSource(action, scope string, at time.Time, i int) string {
	return fmt.Sprintf("vibedom %s, %s scope, %s #%d", action, scope, at.UTC().Format("15:04:05Z"), i+1)
}

// parseLive parses and checks the rules of an allow or deny: every rule
// must parse, and an allow rule must not name what the dial guard never
// dials. All problems are reported at once.
func (l *livePolicy) parseLive(action string, texts []string, scope string, at time.Time) ([]nfegress.Rule, error) {
	if len(texts) == 0 {
		return nil, fmt.Errorf("no rule given: `vibedom %s SESSION RULE…` (e.g. example.com, *.example.com, example.com:8443)", action)
	}
	var rules []nfegress.Rule
	var errs []string
	for i, text := range texts {
		text = strings.TrimSpace(text)
		if action == EgressDeny && !strings.HasPrefix(text, "!") {
			text = "!" + text
		}
		if action == EgressAllow && strings.HasPrefix(text, "!") {
			errs = append(errs, fmt.Sprintf("%q is a deny rule: use `vibedom deny SESSION %s`", text, text[1:]))
			continue
		}
		r, err := nfegress.ParseRule(text, liveSource(action, scope, at, i))
		if err != nil {
			var re *nfegress.RuleError
			if errors.As(err, &re) {
				err = fmt.Errorf("%q: %s", re.Text, re.Reason)
			}
			errs = append(errs, err.Error())
			continue
		}
		if r.AllowPrivate() || r.NoMITM() != "" {
			errs = append(errs, fmt.Sprintf("%q is not taken live: add it to %s and start a new session", text, l.home.TrustedDomains()))
			continue
		}
		if !r.Deny {
			if a, ok := r.Addr(); ok {
				if err := nfegress.GuardedAddr(a, l.private); err != nil {
					errs = append(errs, fmt.Sprintf("%q names an address vibedom never connects to: %s", text, strings.TrimPrefix(err.Error(), nfegress.ErrUpstreamAddress.Error()+": ")))
					continue
				}
			} else if nfegress.LocalName(r.Host()) {
				errs = append(errs, fmt.Sprintf("%q names a host-local name (localhost, .local, .internal …), which vibedom never connects to", text))
				continue
			}
		}
		rules = append(rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: nothing changed", strings.Join(errs, "; "))
	}
	return rules, nil
}

// change adds rules to the policy (after save, when the user asked to
// keep them) and swaps the new snapshot in. An allow rule that a deny rule
// still beats is refused, with nothing changed.
func (l *livePolicy) change(action string, rules []nfegress.Rule, scope string, at time.Time, save func() error) (*policySnap, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.cur.Load()
	all := append(append([]nfegress.Rule{}, old.rules...), rules...)
	p := nfegress.NewPolicy(all)
	if action == EgressAllow {
		for _, r := range rules {
			name, port := r.Example()
			if d := p.Decide(name, port); !d.Allow {
				return nil, fmt.Errorf("%q would still be denied: %s (rule %q from %s beats any allow rule); nothing changed", r.Text, d.Reason, d.Rule, d.Source)
			}
		}
	}
	if save != nil {
		if err := save(); err != nil {
			return nil, err
		}
	}
	live := make(map[string]liveRule, len(old.live)+len(rules))
	for k, v := range old.live {
		live[k] = v
	}
	for _, r := range rules {
		live[r.Source] = liveRule{scope: scope, added: at}
	}
	snap := &policySnap{p: p, live: live, rules: p.Rules()}
	l.cur.Store(snap)
	return snap, nil
}

// saveUserRules appends rules to the user's rule file, keeping what it
// holds (comments included), atomically. The result must still parse.
func saveUserRules(h home.Home, texts []string, action, sessName string, at time.Time) (string, error) {
	path := h.TrustedDomains()
	var old []byte
	perm := fs.FileMode(0o600)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("--save: %w", err)
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("--save: %s is not a regular file: nothing changed", path)
	default:
		perm = fi.Mode().Perm()
		if old, err = atomicfile.ReadLimited(path, 1<<20); err != nil {
			return "", fmt.Errorf("--save: %w: nothing changed", err)
		}
	}
	var b bytes.Buffer
	b.Write(old)
	if len(old) > 0 && old[len(old)-1] != '\n' {
		b.WriteByte('\n')
	}
	for _, t := range texts {
		fmt.Fprintf(&b, "%s  # added by `vibedom %s --save` in session %s, %s\n", t, action, sessName, at.UTC().Format(time.RFC3339))
	}
	if _, err := nfegress.ParseRules(bytes.NewReader(b.Bytes()), path); err != nil {
		return "", fmt.Errorf("--save: %s would not load any more (fix it first): %w; nothing changed", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("--save: %w", err)
	}
	if err := atomicfile.WriteFile(path, b.Bytes(), perm); err != nil {
		return "", fmt.Errorf("--save: %w: nothing changed", err)
	}
	return path, nil
}

// connSet tracks the guest connections the engine serves, with the
// destination each was admitted for, so that a new deny rule closes the
// ones it covers.
type connSet struct {
	mu   sync.Mutex
	next int
	m    map[int]trackedConn
}

type trackedConn struct {
	t netfilter.Target
	c io.Closer
}

func newConnSet() *connSet { return &connSet{m: map[int]trackedConn{}} }

// add tracks c, admitted for t, until the returned function is called.
func (s *connSet) add(t netfilter.Target, c io.Closer) func() {
	s.mu.Lock()
	id := s.next
	s.next++
	s.m[id] = trackedConn{t: t, c: c}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.m, id)
		s.mu.Unlock()
	}
}

// closeMatching closes every tracked connection whose destination match
// covers and returns how many.
func (s *connSet) closeMatching(match func(name string, port uint16) bool) int {
	s.mu.Lock()
	var hit []io.Closer
	for id, tc := range s.m {
		if match(tc.t.Name, tc.t.Port) {
			hit = append(hit, tc.c)
			delete(s.m, id)
		}
	}
	s.mu.Unlock()
	for _, c := range hit {
		c.Close()
	}
	return len(hit)
}

// serveEgress answers an OpEgress request.
func (s *sess) serveEgress(req *EgressRequest) ControlReply {
	e := s.egress
	if e == nil || e.live == nil {
		return ControlReply{Error: fmt.Sprintf("session %s has no network (it runs with --no-network): no egress policy to change", s.name)}
	}
	if req == nil {
		return ControlReply{Error: "egress: empty request"}
	}
	rep := &EgressReply{Session: s.name}
	switch req.Action {
	case EgressShow:
		rep.Rules = e.live.show()
	case EgressCheck:
		if req.Name == "" || req.Port == 0 {
			return ControlReply{Error: "policy check: give HOST[:PORT]"}
		}
		rep.Check = e.live.check(req.Name, req.Port)
	case EgressAllow, EgressDeny:
		var err error
		if rep, err = s.addLiveRules(req.Action, req.Rules, req.Save, ""); err != nil {
			return ControlReply{Error: err.Error()}
		}
	case EgressAnswer:
		var err error
		if rep, err = s.answerQuestion(req.ID, req.Answer, req.Ports); err != nil {
			return ControlReply{Error: err.Error()}
		}
	default:
		return ControlReply{Error: fmt.Sprintf("egress: unknown action %q", req.Action)}
	}
	return ControlReply{OK: true, Egress: rep}
}

// addLiveRules adds allow or deny rules to the running policy (and to the
// user's file with save), logs each, answers the open questions they
// cover and, for deny, closes the connections they cover. why, when not
// empty, says what asked for the change (an answer to a question).
func (s *sess) addLiveRules(action string, texts []string, save bool, why string) (*EgressReply, error) {
	e := s.egress
	rep := &EgressReply{Session: s.name}
	at := time.Now()
	scope := scopeSession
	if save {
		scope = scopeUser
	}
	rules, err := e.live.parseLive(action, texts, scope, at)
	if err != nil {
		return nil, err
	}
	var saveFn func() error
	if save {
		texts := make([]string, len(rules))
		for i, r := range rules {
			texts[i] = r.Text
		}
		saveFn = func() error {
			var err error
			rep.Saved, err = saveUserRules(s.opts.Home, texts, action, s.name, at)
			return err
		}
	}
	snap, err := e.live.change(action, rules, scope, at, saveFn)
	if err != nil {
		return nil, err
	}
	if why == "" {
		why = "`vibedom " + action + "`"
	}
	for _, r := range rules {
		sc, since, _ := e.live.scopeOf(snap, r.Source)
		rep.Rules = append(rep.Rules, EgressRule{Rule: r.Text, Source: r.Source, Scope: sc, Deny: r.Deny, Live: true, Since: since})
		s.log.Info("egress: live rule added", "action", action, "rule", r.Text, "scope", sc, "by", why, "saved", rep.Saved)
		dec := "allow"
		if r.Deny {
			dec = "deny"
		}
		e.events.Record(nfegress.Event{Time: at, Kind: "policy", Decision: dec, Rule: r.Text,
			Reason: fmt.Sprintf("live rule added by %s (%s scope)", why, sc)})
	}
	covers := func(name string, port uint16) bool {
		for _, r := range rules {
			if r.Matches(name, port) {
				return true
			}
		}
		return false
	}
	if a := e.live.ask; a != nil {
		ans := AnswerSession
		if action == EgressDeny {
			ans = AnswerDeny
		}
		for _, q := range a.covered(covers) {
			if _, err := a.answer(q.ID, ans, nil, nil); err == nil {
				s.log.Info("egress: question answered by a live rule", "name", q.Name, "answer", ans)
			}
		}
	}
	if action == EgressDeny {
		rep.Closed = e.conns.closeMatching(covers)
		if rep.Closed > 0 {
			s.log.Info("egress: connections closed by a live deny", "count", rep.Closed)
		}
	}
	return rep, nil
}

// answerQuestion answers an open question: once lets the held requests
// through; session, always and deny add the live rules rulesFor gives.
// ports, when not empty, are the ports the user was shown: the answer
// covers only those.
func (s *sess) answerQuestion(id int, ans string, ports []uint16) (*EgressReply, error) {
	a := s.egress.live.ask
	if a == nil {
		return nil, fmt.Errorf("session %s does not ask (it runs with --egress deny): use `vibedom allow %s RULE`", s.name, s.name)
	}
	rep := &EgressReply{Session: s.name}
	var apply func(q Question) error
	switch ans {
	case AnswerOnce:
	case AnswerSession, AnswerAlways, AnswerDeny:
		apply = func(q Question) error {
			action := EgressAllow
			if ans == AnswerDeny {
				action = EgressDeny
			}
			r, err := s.addLiveRules(action, rulesFor(q, ans == AnswerDeny), ans == AnswerAlways, "the user's answer "+strconv.Quote(ans)+" to the question about "+q.Name)
			if r != nil {
				rep.Rules, rep.Saved, rep.Closed = r.Rules, r.Saved, r.Closed
			}
			return err
		}
	default:
		return nil, fmt.Errorf("answer %q: want once, session, always or deny", ans)
	}
	q, err := a.answer(id, ans, ports, apply)
	if err != nil {
		// A rule an answer added closed the question already.
		if q.Name == "" || rep.Rules == nil {
			return nil, err
		}
	}
	s.log.Info("egress: question answered", "name", q.Name, "ports", q.Ports, "answer", ans)
	s.egress.events.Record(nfegress.Event{Time: time.Now(), Kind: "policy", Name: q.Name, Decision: map[bool]string{true: "deny", false: "allow"}[ans == AnswerDeny],
		Reason: "the user answered " + strconv.Quote(ans) + " (ask mode)"})
	rep.Answered = &q
	return rep, nil
}

// checkNoMITM normalises the --no-mitm names and refuses what must stay
// inspected: the model providers' hosts and every host a credential
// placeholder is swapped for (the swap needs the MITM, and a tunnel there
// would carry the placeholder out unswapped and unscrubbed), IP literals,
// wildcards and host-local names.
func (s *sess) checkNoMITM(names []string) ([]string, error) {
	kept := map[string]bool{}
	for _, p := range credentials.Providers {
		kept[p.Host] = true
	}
	for _, k := range credentials.LoginKinds {
		kept[k.APIHost], kept[k.TokenHost] = true, true
	}
	if s.creds != nil {
		for _, sw := range s.creds.Swaps() {
			kept[sw.Host] = true
		}
	}
	var out []string
	for _, raw := range names {
		n, err := nfegress.NormalizeName(strings.TrimSpace(raw))
		switch {
		case strings.Contains(raw, "*"):
			return nil, fmt.Errorf("no-mitm %s: name one host, not a wildcard", raw)
		case err != nil:
			return nil, fmt.Errorf("no-mitm %s: a host name, without port or scheme: %v", raw, err)
		case kept[n]:
			return nil, fmt.Errorf("no-mitm %s: refused: vibedom must inspect a model provider's host and every host it swaps a credential for", raw)
		case nfegress.LocalName(n):
			return nil, fmt.Errorf("no-mitm %s: a host-local name vibedom never connects to", raw)
		}
		s.log.Warn("egress: TLS to this name passes through uninspected (--no-mitm): the DLP sees none of it", "name", n)
		out = append(out, n)
	}
	return out, nil
}
