package credentials

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// refreshRetry is how long after a failed refresh the host answers with
// the failure instead of trying again.
const refreshRetry = 30 * time.Second

// refreshMargin is how long before its expiry the host refreshes an
// access token (the CLIs use the same 5 minutes).
const refreshMargin = 5 * time.Minute

// LoginSession is one session's use of a subscription login: the real
// tokens, which only the host holds and refreshes, and the placeholders
// the guest has been given. Safe for concurrent use.
type LoginSession struct {
	kind     LoginKind
	home     string
	client   *RefreshClient
	log      *slog.Logger
	mu       sync.Mutex
	login    *Login
	failed   error           // the last refresh's failure, until one succeeds
	failedAt time.Time       // when; answered with until refreshRetry has passed
	access   map[string]bool // access-token placeholders handed out
	others   map[string]bool // refresh and id-token placeholders handed out
	refresh  map[string]bool // refresh placeholders handed out
	first    guestTokens     // the set in the guest's file
	// heldMu guards held apart from mu: the session's log redactor reads
	// it (Secrets), and may run while mu is held elsewhere.
	heldMu sync.Mutex
	held   []string // every real value held this session
	file   []byte   // the guest's file, made once
}

// NewLoginSession makes the session's first placeholders for l. home is
// where a refreshed login is saved (vibedom's store); client sends the
// host's refreshes; log may be nil.
func NewLoginSession(home string, l *Login, client *RefreshClient, log *slog.Logger) (*LoginSession, error) {
	if client == nil {
		client = &RefreshClient{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &LoginSession{kind: l.Kind, home: home, client: client, log: log, login: l,
		access: map[string]bool{}, others: map[string]bool{}, refresh: map[string]bool{}, held: l.Secrets()}
	g, err := s.issue()
	if err != nil {
		return nil, err
	}
	s.first = g
	if s.file, err = guestFile(l, g, s.client.now()); err != nil {
		return nil, err
	}
	return s, nil
}

// Kind is the login's kind.
func (s *LoginSession) Kind() LoginKind { return s.kind }

// issue makes and records a new placeholder set; s.mu held or s not yet
// shared.
func (s *LoginSession) issue() (guestTokens, error) {
	g, err := newGuestTokens(s.login, s.client.now())
	if err != nil {
		return g, err
	}
	s.access[g.access] = true
	s.others[g.refresh] = true
	s.refresh[g.refresh] = true
	if g.id != "" {
		s.others[g.id] = true
	}
	return g, nil
}

// GuestFile is the CLI's credentials file for the guest, relative to the
// agent's home, holding only placeholders.
func (s *LoginSession) GuestFile() (rel string, content []byte) {
	return s.kind.File, s.file
}

// FirstPlaceholders are the placeholders of the guest's file (tests, and
// the DLP's known values).
func (s *LoginSession) FirstPlaceholders() []string {
	out := []string{s.first.access, s.first.refresh}
	if s.first.id != "" {
		out = append(out, s.first.id)
	}
	return out
}

// Placeholders are every placeholder handed to the guest so far.
func (s *LoginSession) Placeholders() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for p := range s.access {
		out = append(out, p)
	}
	for p := range s.others {
		out = append(out, p)
	}
	return out
}

// IsAccessPlaceholder reports whether ph is an access-token placeholder
// handed to the guest.
func (s *LoginSession) IsAccessPlaceholder(ph string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.access[ph]
}

// Secrets are every real token value the host held this session (the
// ones it refreshed away included): scrubbed from responses and logs.
func (s *LoginSession) Secrets() []string {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	return append([]string(nil), s.held...)
}

// ErrLoginUnusable wraps why the host has no usable access token.
var ErrLoginUnusable = errors.New("the subscription login cannot be used")

// AccessToken is the real access token to put in place of a placeholder
// now: refreshed first, with the host's own request, when it expires
// within refreshMargin. An error (ErrLoginUnusable) says what to run on
// the host.
func (s *LoginSession) AccessToken(ctx context.Context) (string, error) {
	tok, n, saveErr, err := s.accessToken(ctx)
	// Logged with mu released: the log's redactor reads Secrets.
	switch {
	case err != nil:
		s.log.Warn("the host could not refresh the subscription login", "login", s.kind.Name, "err", err)
	case n != nil:
		s.log.Info("the host refreshed the subscription login", "login", n)
	}
	if saveErr != nil {
		// The session goes on with the new tokens; the next one needs a
		// new login if the vendor made the old refresh token single-use.
		s.log.Error("the refreshed login could not be saved", "login", s.kind.Name, "err", saveErr)
	}
	return tok, err
}

// accessToken is AccessToken; n is the refreshed login when it
// refreshed, saveErr why it could not be stored.
func (s *LoginSession) accessToken(ctx context.Context) (tok string, n *Login, saveErr, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.login
	now := s.client.now()
	if l.Expires.IsZero() || now.Add(refreshMargin).Before(l.Expires) {
		return l.access, nil, nil, nil
	}
	if s.failed != nil && now.Before(s.failedAt.Add(refreshRetry)) {
		return "", nil, nil, s.failed
	}
	n, err = s.client.Refresh(ctx, l)
	if err != nil {
		if errors.Is(err, ErrRefreshRefused) {
			err = fmt.Errorf("%w: %w", ErrLoginUnusable, err)
		} else {
			err = fmt.Errorf("%w: %v; if it persists, run `vibedom auth login %s` on the host", ErrLoginUnusable, err, s.kind.Name)
		}
		s.failed, s.failedAt = err, now
		return "", nil, nil, err
	}
	s.failed = nil
	s.login = n
	s.heldMu.Lock()
	for _, v := range n.Secrets() {
		if !contains(s.held, v) {
			s.held = append(s.held, v)
		}
	}
	s.heldMu.Unlock()
	return n.access, n, SaveLogin(s.home, n), nil
}

// Refresh refreshes now when the access token is due (session start).
func (s *LoginSession) Refresh(ctx context.Context) error {
	_, err := s.AccessToken(ctx)
	return err
}

func contains(l []string, v string) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
}

// maxGuestRefreshes bounds the placeholder sets a session hands out on
// the guest's refreshes (the CLI refreshes about twice a day): each is
// remembered, and checked on every request, for the whole session.
const maxGuestRefreshes = 100

// maxGuestRefresh bounds the body of a guest's request to the token
// endpoint.
const maxGuestRefresh = 64 << 10

// AnswerTokenRequest answers a guest's request to the vendor's token
// endpoint host, which is never forwarded: a refresh with a refresh
// placeholder this session handed out gets a new placeholder set (the
// host keeps, and refreshes, the real tokens); a revocation is
// acknowledged; anything else (a sign-in, a refresh token vibedom did not
// hand out, another path) is refused. It returns the status and JSON body
// for the guest, and a line for the log (never a token).
func (s *LoginSession) AnswerTokenRequest(r *http.Request) (status int, body []byte, note string) {
	k := s.kind
	refuse := func(status int, code, why string) (int, []byte, string) {
		b, _ := json.Marshal(map[string]string{"error": code,
			"error_description": "vibedom: " + why + " (the host holds the " + k.Name + " login; the token endpoint is answered by vibedom, never reached from the VM)"})
		return status, b, why
	}
	path := r.URL.Path
	if r.Method != http.MethodPost {
		return refuse(http.StatusMethodNotAllowed, "invalid_request", "only a refresh is answered here")
	}
	if strings.HasSuffix(path, "/revoke") {
		return http.StatusOK, []byte("{}"), "a revocation from the guest, acknowledged and not forwarded"
	}
	if path != k.TokenPath {
		return refuse(http.StatusForbidden, "invalid_request", "only a refresh is answered here")
	}
	form, err := readTokenForm(r)
	if err != nil {
		return refuse(http.StatusBadRequest, "invalid_request", err.Error())
	}
	if form["grant_type"] != "refresh_token" {
		return refuse(http.StatusForbidden, "unsupported_grant_type", "a sign-in from the VM is not forwarded: run `vibedom auth login "+k.Name+"` on the host")
	}
	s.mu.Lock()
	ok := s.refresh[form["refresh_token"]]
	s.mu.Unlock()
	if !ok {
		return refuse(http.StatusBadRequest, "invalid_grant", "this refresh token was not handed out by vibedom in this session")
	}
	// The guest gets placeholders that last as its placeholder access
	// token says, whatever the real token's state; a host refresh that
	// fails shows on the next API call as a 401 saying what to run.
	s.mu.Lock()
	if len(s.refresh) > maxGuestRefreshes {
		s.mu.Unlock()
		return refuse(http.StatusTooManyRequests, "invalid_request", "too many refreshes from the VM in one session: the placeholders it holds keep working")
	}
	g, err := s.issue()
	l := s.login
	s.mu.Unlock()
	if err != nil {
		return refuse(http.StatusInternalServerError, "server_error", "making placeholders failed")
	}
	resp := map[string]any{"access_token": g.access, "refresh_token": g.refresh, "token_type": "Bearer",
		"expires_in": int64(time.Until(g.expires) / time.Second)}
	switch k.Name {
	case "claude":
		if len(l.Scopes) > 0 {
			resp["scope"] = strings.Join(l.Scopes, " ")
		}
	case "codex":
		if g.id != "" {
			resp["id_token"] = g.id
		}
	}
	b, _ := json.Marshal(resp)
	return http.StatusOK, b, "the guest's refresh answered with new placeholders, nothing forwarded"
}

// readTokenForm reads a token request's fields, JSON or form-encoded.
func readTokenForm(r *http.Request) (map[string]string, error) {
	if r.Body == nil {
		return nil, errors.New("no body")
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxGuestRefresh+1))
	if err != nil {
		return nil, errors.New("the body could not be read")
	}
	if len(b) > maxGuestRefresh {
		return nil, errors.New("the body is too long")
	}
	out := map[string]string{}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "application/x-www-form-urlencoded" {
		v, err := url.ParseQuery(string(b))
		if err != nil {
			return nil, errors.New("the form does not parse")
		}
		for k := range v {
			out[k] = v.Get(k)
		}
		return out, nil
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.New("the body is neither JSON nor a form")
	}
	for k, v := range m {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out, nil
}

// UnusableAnswer is the body of the 401 an agent gets when the host has no
// usable access token, in the shape the vendor's API uses for errors, so
// the CLI shows its message.
func (k LoginKind) UnusableAnswer(err error) []byte {
	msg := fmt.Sprintf("vibedom: the host could not refresh the %s subscription login: run `vibedom auth login %s` on the host, then retry (%v)", k.Name, k.Name, err)
	var v any
	switch k.Name {
	case "claude":
		v = map[string]any{"type": "error", "error": map[string]string{"type": "authentication_error", "message": msg}}
	default:
		v = map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": "vibedom_login_refresh_failed"}}
	}
	b, _ := json.Marshal(v)
	return b
}
