package dlp

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Allowlist exempts values and categories from scrubbing.
type Allowlist struct {
	// Values are never redacted when a finding's value equals one of them
	// (--allow-pattern, <workspace>/.vibedom/dlp_allowlist.txt).
	Values []string
	// Patterns are never redacted when a finding's whole value matches one
	// (entries written "re:<regexp>").
	Patterns []*regexp.Regexp
	// Categories are let through to every destination (--allow-context).
	Categories []Category
}

// Config configures an Engine.
type Config struct {
	// Secrets are the known values: preflight findings and .env secrets.
	Secrets []Secret
	// ClassRules assign destination classes; they are consulted before
	// DefaultClassRules (the most specific match wins; on a tie these).
	ClassRules []ClassRule
	// Allow exempts values and categories.
	Allow Allowlist
}

// Engine finds and scrubs sensitive values. It is immutable once built and
// safe for concurrent use.
type Engine struct {
	known    *knownSet
	anchors  *anchorIndex
	rules    []ClassRule
	allowVal map[string]bool
	allowRE  []*regexp.Regexp
	allowCat [numCategories]bool
	// holdBack is how many decoded bytes a segment keeps unemitted at the
	// end of a window so a match starting before the cut is complete.
	holdBack int
	window   int
	// inTurn: no pipeline, each segment scanned and settled in turn
	// (tests compare the two).
	inTurn bool
}

var anchorsOnce = sync.OnceValue(newAnchorIndex)

// New builds an engine. Known values equal to an allowlisted value are
// dropped; values shorter than MinSecretLen are ignored.
func New(cfg Config) (*Engine, error) {
	e := &Engine{anchors: anchorsOnce(), allowVal: map[string]bool{}}
	for _, v := range cfg.Allow.Values {
		if v != "" {
			e.allowVal[v] = true
		}
	}
	e.allowRE = cfg.Allow.Patterns
	for _, c := range cfg.Allow.Categories {
		if c >= numCategories {
			return nil, fmt.Errorf("dlp: unknown category %d", c)
		}
		e.allowCat[c] = true
	}
	var secrets []Secret
	for _, s := range cfg.Secrets {
		if !e.allowedValue(s.Value) {
			secrets = append(secrets, s)
		}
	}
	e.known = newKnownSet(secrets)
	for _, r := range cfg.ClassRules {
		if err := checkClassPattern(r.Pattern); err != nil {
			return nil, fmt.Errorf("dlp: class rule from %s: %w", r.Source, err)
		}
	}
	e.rules = append(slices.Clone(cfg.ClassRules), DefaultClassRules...)
	e.holdBack = max(e.known.maxLen, maxJWTLen, maxTokenLen+64) + 80
	e.window = max(64<<10, 4*e.holdBack)
	return e, nil
}

// ContainsKnownFold reports whether s holds a known value, ignoring case
// (for header names, whose case the protocol does not keep).
func (e *Engine) ContainsKnownFold(s string) bool {
	if len(s) < MinSecretLen {
		return false
	}
	l := strings.ToLower(s)
	for _, v := range e.known.lower {
		if strings.Contains(l, v) {
			return true
		}
	}
	return false
}

// KnownValues is the number of distinct known values the engine matches.
func (e *Engine) KnownValues() int { return len(e.known.secrets) }

// Patterns is the number of encoded forms of known values it matches.
func (e *Engine) Patterns() int { return len(e.known.pats) }

// ClassOf returns the class of a destination name (or IP literal) and the
// source of the rule that decided it ("" when no rule matched: public).
func (e *Engine) ClassOf(name string) (Class, string) { return classOf(e.rules, name) }

// PolicyFor is the policy for a destination: its class's DefaultPolicy
// with the allowlisted categories let through.
func (e *Engine) PolicyFor(name string) Policy {
	c, _ := e.ClassOf(name)
	return e.PolicyForClass(c)
}

// PolicyForClass is DefaultPolicy(c) with the allowlisted categories let
// through.
func (e *Engine) PolicyForClass(c Class) Policy {
	p := DefaultPolicy(c)
	for i, a := range e.allowCat {
		if a {
			p.act[i] = Pass
		}
	}
	return p
}

func (e *Engine) allowedValue(v string) bool {
	if e.allowVal[v] {
		return true
	}
	for _, re := range e.allowRE {
		if loc := re.FindStringIndex(v); loc != nil && loc[0] == 0 && loc[1] == len(v) {
			return true
		}
	}
	return false
}

// Finding is one value the engine redacted or logged. Its value is kept
// for the encrypted audit log only: String, LogValue and JSON never show
// more than Prefix and Length.
type Finding struct {
	Category Category `json:"category"`
	Action   Action   `json:"action"`
	// Where is "body", "url", "header:<Name>" …
	Where string `json:"where"`
	// Form is the encoding a known value was found in ("raw", "base64",
	// "hex", "url", "json"); empty for recognizers.
	Form string `json:"form,omitempty"`
	// Source is where a known value came from (".env:3 API_KEY").
	Source string `json:"source,omitempty"`
	// Prefix is the value's first 4 characters when it has 12 or more,
	// else empty (so a short secret is not half shown).
	Prefix string `json:"prefix"`
	// Length is the value's length in characters.
	Length int `json:"length"`

	value string
}

// Value is the original value, for the encrypted audit log. Callers must
// not log it.
func (f Finding) Value() string { return f.value }

func (f Finding) String() string {
	return fmt.Sprintf("%s %s in %s (%q…, %d chars)", f.Action, f.Category, f.Where, f.Prefix, f.Length)
}

// GoString keeps %#v from printing the value.
func (f Finding) GoString() string { return "dlp.Finding{" + f.String() + "}" }

// LogValue logs the finding without its value.
func (f Finding) LogValue() slog.Value {
	return slog.GroupValue(slog.String("category", f.Category.String()), slog.String("action", f.Action.String()),
		slog.String("where", f.Where), slog.Int("length", f.Length))
}

// NewFinding makes a finding for a value a caller acted on itself (e.g. a
// header dropped for its name).
func NewFinding(c Category, a Action, where, value string) Finding {
	return newFinding(c, a, where, value)
}

func newFinding(c Category, a Action, where string, value string) Finding {
	f := Finding{Category: c, Action: a, Where: where, Length: utf8.RuneCountInString(value), value: value}
	if f.Length >= 12 {
		r := []rune(value)
		f.Prefix = string(r[:4])
	}
	return f
}

// maxFindings bounds the findings one report keeps; the rest are counted.
const maxFindings = 1000

// Report collects the findings of one request or stream. It is safe for
// concurrent use.
type Report struct {
	mu       sync.Mutex
	findings []Finding
	dropped  int
}

// Add records a finding (to merge reports).
func (r *Report) Add(f Finding) { r.add(f) }

func (r *Report) add(f Finding) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.findings) >= maxFindings {
		r.dropped++
		return
	}
	r.findings = append(r.findings, f)
}

// merge adds o's findings and dropped count to r.
func (r *Report) merge(o *Report) {
	if r == nil {
		return
	}
	fs, dropped := o.Findings(), o.Dropped()
	for _, f := range fs {
		r.add(f)
	}
	r.mu.Lock()
	r.dropped += dropped
	r.mu.Unlock()
}

// Findings returns a copy of the findings so far.
func (r *Report) Findings() []Finding {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.findings)
}

// Dropped is the number of findings beyond the report's bound.
func (r *Report) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Redacted counts the redactions in the report.
func (r *Report) Redacted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.dropped
	for _, f := range r.findings {
		if f.Action == Redact {
			n++
		}
	}
	return n
}

// Summary describes the report in one line, e.g. "2 redacted (SECRET,
// EMAIL), 1 logged", or "1 refused (CLOUD_KEY), 0 redacted" when a
// finding refused the request.
func (r *Report) Summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var red, logged int
	cats := map[string]bool{}
	var refused []string
	for _, f := range r.findings {
		switch f.Action {
		case Redact:
			red++
			cats[f.Category.String()] = true
		case Refuse:
			if c := f.Category.String(); !slices.Contains(refused, c) {
				refused = append(refused, c)
			}
		default:
			logged++
		}
	}
	pre := ""
	if len(refused) > 0 {
		n := 0
		for _, f := range r.findings {
			if f.Action == Refuse {
				n++
			}
		}
		slices.Sort(refused)
		pre = fmt.Sprintf("%d refused (%s), ", n, strings.Join(refused, ", "))
	} else if red+logged == 0 {
		return "nothing found"
	}
	names := make([]string, 0, len(cats))
	for c := range cats {
		names = append(names, c)
	}
	slices.Sort(names)
	s := pre + fmt.Sprintf("%d redacted", red+r.dropped)
	if len(names) > 0 {
		s += " (" + strings.Join(names, ", ") + ")"
	}
	if logged > 0 {
		s += fmt.Sprintf(", %d logged", logged)
	}
	return s
}

// ErrEncoding means a body could not be decoded, so it could not be
// scanned; the request must not be sent.
var ErrEncoding = errors.New("body cannot be decoded for scanning")

// knownOnlyPolicy redacts known values and nothing else.
var knownOnlyPolicy = Policy{}.With(CatSecret, Redact)

// ScrubString replaces each known value in s (in every form Scrub finds
// it in) with [REDACTED:SECRET], and returns s itself when there is none.
// It acts on known values only, not on recognizers: it is for strings that
// are logged (a refused request's path, host or DNS name), where a
// placeholder for every e-mail address would hide what happened.
func (e *Engine) ScrubString(s string) string {
	if e == nil || len(e.known.pats) == 0 || len(s) < MinSecretLen {
		return s
	}
	pol := knownOnlyPolicy
	out := e.ScrubText(&pol, []byte(s), "log", nil)
	return string(out)
}
