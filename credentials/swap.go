package credentials

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/vibedom/vibedom/dlp"
)

// Session is one session's placeholders: for API keys, and for the
// subscription logins it uses (AddLogin).
type Session struct {
	entries []entry
	logins  []*LoginSession
	// redactEng finds the logins' redactFor real tokens in log lines.
	redactMu  sync.Mutex
	redactEng *dlp.Engine
	redactFor int
}

// AddLogin makes the session use a subscription login: the guest gets the
// CLI's credentials file with placeholders (GuestFiles) instead of the
// provider's API key variable, the proxy swaps the real access token in
// and answers the guest's requests to the token endpoint.
func (s *Session) AddLogin(l *LoginSession) { s.logins = append(s.logins, l) }

// Logins are the session's subscription logins.
func (s *Session) Logins() []*LoginSession { return s.logins }

// hasLogin reports whether a login of the session bills provider.
func (s *Session) hasLogin(provider string) bool {
	for _, l := range s.logins {
		if l.kind.Provider == provider {
			return true
		}
	}
	return false
}

// GuestFiles are the credentials files the guest's agent user gets, by
// path relative to its home: placeholders only.
func (s *Session) GuestFiles() map[string][]byte {
	out := map[string][]byte{}
	for _, l := range s.logins {
		rel, b := l.GuestFile()
		out[rel] = b
	}
	return out
}

// AllowRules are the egress rules the session's logins need: the API host
// the access token goes to, and the token endpoint's host, whose requests
// the proxy answers itself (never forwarded).
func (s *Session) AllowRules() []string {
	var out []string
	for _, l := range s.logins {
		out = append(out, l.kind.APIHost+":443", l.kind.TokenHost+":443")
	}
	return out
}

// SetRefreshHTTP sets the client the host's refreshes go through (one
// that honours the session's --resolve and --ca-file).
func (s *Session) SetRefreshHTTP(c *http.Client) {
	for _, l := range s.logins {
		l.client.HTTP = c
	}
}

// RefreshDue refreshes, now, every login whose access token is due.
func (s *Session) RefreshDue(ctx context.Context) error {
	for _, l := range s.logins {
		if err := l.Refresh(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Redact replaces every real token of the session's logins (the ones the
// host refreshed during the session included, which the DLP's known
// values, fixed at the start, do not hold) in a string bound for a log.
func (s *Session) Redact(v string) string {
	var all []dlp.Secret
	for _, l := range s.logins {
		for _, sec := range l.Secrets() {
			v = strings.ReplaceAll(v, sec, RedactedToken)
			all = append(all, dlp.Secret{Value: sec, Source: "the host's " + l.kind.Name + " subscription login"})
		}
	}
	if len(all) == 0 {
		return v
	}
	// The other forms (base64, hex, escapes, another case): a refused
	// request's URL or header name is the guest's to spell.
	s.redactMu.Lock()
	if s.redactFor != len(all) {
		s.redactEng, _ = dlp.New(dlp.Config{Secrets: all})
		s.redactFor = len(all)
	}
	e := s.redactEng
	s.redactMu.Unlock()
	if e == nil {
		return v
	}
	if e.ContainsKnownFold(v) {
		return RedactedToken
	}
	return e.ScrubString(v)
}

// RedactedToken replaces a real token in a log line.
const RedactedToken = "[REDACTED:vibedom credential]"

type entry struct {
	key         Key
	placeholder string
}

// NewSession makes a placeholder for each key.
func NewSession(keys []Key) (*Session, error) {
	s := &Session{}
	for _, k := range keys {
		ph, err := Placeholder(k.Provider, k.value)
		if err != nil {
			return nil, err
		}
		s.entries = append(s.entries, entry{key: k, placeholder: ph})
	}
	return s, nil
}

// GuestEnv is what the guest's environment gets: each provider's variable
// holding its placeholder.
func (s *Session) GuestEnv() map[string]string {
	env := map[string]string{}
	for _, e := range s.entries {
		if s.hasLogin(e.key.Provider.Name) {
			continue // the CLI would take the key over its login
		}
		env[e.key.Provider.Env] = e.placeholder
	}
	return env
}

// KnownValues are the real keys and the placeholders, for the DLP: a real
// key never leaves but through the swap, and a placeholder anywhere the
// swap does not take it (a body, another host) is scrubbed and alerted.
func (s *Session) KnownValues() []dlp.Secret {
	var out []dlp.Secret
	for _, e := range s.entries {
		out = append(out,
			dlp.Secret{Value: e.key.value, Source: "the host's " + e.key.Provider.Name + " API key (" + e.key.Source + ")"},
			dlp.Secret{Value: e.placeholder, Source: "vibedom's placeholder for the " + e.key.Provider.Name + " API key"})
	}
	for _, l := range s.logins {
		for _, v := range l.Secrets() {
			out = append(out, dlp.Secret{Value: v, Source: "the host's " + l.kind.Name + " subscription login"})
		}
		for _, v := range l.FirstPlaceholders() {
			out = append(out, dlp.Secret{Value: v, Source: "vibedom's placeholder for the " + l.kind.Name + " subscription login"})
		}
	}
	return out
}

// Providers lists the providers this session has keys for.
func (s *Session) Providers() []string {
	var out []string
	for _, e := range s.entries {
		out = append(out, e.key.Provider.Name)
	}
	for _, l := range s.logins {
		out = append(out, l.kind.Name+" subscription login")
	}
	return out
}

// Swaps are the session's swap rules, one a key, for the proxy's request
// filter (netfilter.NewSwapFilter wraps the DLP with them).
func (s *Session) Swaps() []Swap {
	var swaps []Swap
	for _, e := range s.entries {
		p := e.key.Provider
		swaps = append(swaps, Swap{Name: p.Name, Host: p.Host, Header: p.Header,
			Placeholder: authValue(p, e.placeholder), Value: authValue(p, e.key.value), Token: e.placeholder})
	}
	for _, l := range s.logins {
		swaps = append(swaps, Swap{Name: l.kind.Name + " login", Host: l.kind.APIHost, Header: "authorization",
			Paths: l.kind.APIPaths, Dynamic: loginCred{l}})
	}
	return swaps
}

// Swap says where one secret the guest only has a placeholder for is put
// in: on requests to Host, port 443, sent upstream over verified TLS
// (netfilter.Destination.SwapAllowed), a Header whose whole value is Placeholder
// becomes Value.
type Swap struct {
	Name        string // for messages ("anthropic")
	Host        string
	Header      string
	Placeholder string // the header value as the guest sends it
	Value       string // the header value upstream gets
	// Token is the placeholder itself: seen anywhere else, the request is
	// refused.
	Token string
	// Paths, when set, are the only request paths the swap happens on
	// (LoginKind.APIPaths: "/a/" allows the paths below it, "/a" only
	// itself); the placeholder on another path is refused. Nil: any path.
	Paths []string
	// Dynamic, when set, stands for Placeholder, Value and Token: a
	// credential whose placeholders and real value change during the
	// session (a subscription login the host refreshes). Header is the
	// header its access placeholders go in, as "Bearer <placeholder>".
	Dynamic DynamicCredential
}

// DynamicCredential is a credential the host refreshes (see Swap).
type DynamicCredential interface {
	// Placeholders are every placeholder handed to the guest so far.
	Placeholders() []string
	// IsAccessPlaceholder reports whether ph is one that gets swapped;
	// the others (refresh tokens) are refused wherever they appear.
	IsAccessPlaceholder(ph string) bool
	// AccessToken is the real value now. An error that is an *Answer is
	// sent to the guest in place of the request; another refuses it.
	AccessToken(ctx context.Context) (string, error)
	// Secrets are every real value held this session, scrubbed from
	// responses.
	Secrets() []string
}

// EndpointAnswerer is an optional capability of a DynamicCredential: a
// host (its token endpoint) whose every request, on any port and path,
// the swap filter answers with Answer, forwarding nothing.
type EndpointAnswerer interface {
	AnswersHost() string
	Answer(r *http.Request) *Answer
}

// Answer is an error a request filter returns to answer a request itself:
// the proxy's engine sends Status, Header and Body to the guest, forwards
// nothing, and logs Decision ("allow" or "deny") with Reason.
type Answer struct {
	Status   int
	Header   http.Header
	Body     []byte
	Decision string
	Reason   string
}

func (a *Answer) Error() string { return "answered by vibedom: " + a.Reason }

// loginCred is a login as the swap filter's dynamic credential: a failed
// refresh answers the agent with a 401 saying what to run on the host.
type loginCred struct{ *LoginSession }

func (c loginCred) AccessToken(ctx context.Context) (string, error) {
	tok, err := c.LoginSession.AccessToken(ctx)
	if err != nil {
		return "", &Answer{Status: http.StatusUnauthorized, Decision: "deny",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: c.kind.UnusableAnswer(err),
			Reason: "the host could not refresh the " + c.kind.Name + " subscription login: run `vibedom auth login " + c.kind.Name + "`"}
	}
	return tok, nil
}

// AnswersHost is the login's token endpoint host: the swap filter
// answers every request to it (AnswerTokenRequest), on any port and path,
// and forwards nothing the guest sends there.
func (c loginCred) AnswersHost() string { return c.kind.TokenHost }

// Answer answers one request to the token endpoint host.
func (c loginCred) Answer(r *http.Request) *Answer {
	status, body, note := c.AnswerTokenRequest(r)
	decision := "allow"
	if status != http.StatusOK {
		decision = "deny"
	}
	return &Answer{Status: status, Header: http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-store"}},
		Body: body, Decision: decision, Reason: note}
}

// authValue is the header value carrying key for p.
func authValue(p Provider, key string) string {
	if p.Header == "authorization" {
		return "Bearer " + key
	}
	return key
}

// PathAllowed reports whether a request to u may have the swap done: true
// when the swap names no Paths; else u's path, exactly as it goes upstream,
// must be one of them (or below one ending in "/"), compared byte for byte.
// A path a server might read as another is never allowed: one with a
// character outside A-Z a-z 0-9 - . _ ~ / (so no percent escape, ";" or
// "\"), an empty segment ("//", a trailing "/") or a "." or ".." segment.
func (s Swap) PathAllowed(u *url.URL) bool {
	if s.Paths == nil {
		return true
	}
	if u == nil || u.Opaque != "" || u.User != nil {
		return false
	}
	p := u.EscapedPath()
	if p != u.Path || !strings.HasPrefix(p, "/") {
		return false
	}
	for _, c := range []byte(p) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~/", c) >= 0) {
			return false
		}
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	for _, a := range s.Paths {
		if p == a || strings.HasSuffix(a, "/") && strings.HasPrefix(p, a) {
			return true
		}
	}
	return false
}
