package credentials

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

func TestImportLogin(t *testing.T) {
	claude, _ := LookupLogin("claude")
	codex, _ := LookupLogin("codex")
	access, refresh := randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95)
	cAccess := fakeJWT(t, codexClaims(time.Now().Add(time.Hour)))
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for _, c := range []struct {
		name  string
		kind  LoginKind
		file  []byte // nil: no file
		dir   bool   // the file is a folder
		want  error
		check func(t *testing.T, l *Login)
	}{
		{name: "claude", kind: claude, file: claudeDoc(access, refresh, exp), check: func(t *testing.T, l *Login) {
			if l.access != access || l.refresh != refresh || !l.Expires.Equal(exp) || l.Plan != "max" || l.AccountID != "acc-uuid-1" {
				t.Errorf("parsed %+v", l)
			}
		}},
		{name: "codex", kind: codex, file: codexDoc(t, cAccess, randTok("rt_", 60)), check: func(t *testing.T, l *Login) {
			if l.access != cAccess || l.Plan != "pro" || l.AccountID != "acct-123" || l.Email != "dev@example.com" || l.Expires.IsZero() {
				t.Errorf("parsed %+v", l)
			}
		}},
		{name: "no file", kind: claude, want: ErrNoLogin},
		{name: "folder", kind: claude, dir: true, want: ErrDamaged},
		{name: "not JSON", kind: claude, file: []byte("{\"claudeAiOauth\": {"), want: ErrDamaged},
		{name: "API-key login", kind: claude, file: []byte(`{"other":1}`), want: ErrDamaged},
		{name: "no refresh token", kind: claude, file: claudeDoc(access, "", exp), want: ErrDamaged},
		{name: "no expiry", kind: claude, file: bytes.Replace(claudeDoc(access, refresh, exp), []byte(`"expiresAt"`), []byte(`"x"`), 1), want: ErrDamaged},
		{name: "token with a newline", kind: claude, file: claudeDoc(access+"\n", refresh, exp), want: ErrDamaged},
		{name: "codex id_token not a JWT", kind: codex, file: bytes.Replace(codexDoc(t, cAccess, randTok("rt_", 60)), []byte(`"id_token":"`), []byte(`"id_token":"a.b.c.d`), 1), want: ErrDamaged},
		{name: "codex API key only", kind: codex, file: []byte(`{"OPENAI_API_KEY":"sk-x","tokens":null}`), want: ErrDamaged},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := t.TempDir()
			p := filepath.Join(home, filepath.FromSlash(c.kind.File))
			os.MkdirAll(filepath.Dir(p), 0o700)
			if c.dir {
				os.Mkdir(p, 0o700)
			}
			if c.file != nil {
				os.WriteFile(p, c.file, 0o600)
			}
			l, err := ImportLogin(c.kind, home, noEnv)
			if c.want != nil {
				if !errors.Is(err, c.want) {
					t.Fatalf("err %v, want %v", err, c.want)
				}
				msg := err.Error()
				if strings.Contains(msg, "\n") || !strings.Contains(msg, "vibedom auth login "+c.kind.Name) && !strings.Contains(msg, c.kind.Name+" auth login") && !strings.Contains(msg, p) {
					t.Errorf("the error does not say what to do: %q", msg)
				}
				for _, v := range []string{access, refresh, cAccess} {
					if strings.Contains(msg, v[20:]) {
						t.Errorf("the error holds a token: %q", msg)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, l)
			if s := l.String() + " " + l.LogValue().String(); strings.Contains(s, l.access) || strings.Contains(s, l.refresh) {
				t.Errorf("String/LogValue show a token: %s", s)
			}
		})
	}
}

func TestImportLoginConfigDir(t *testing.T) {
	claude, _ := LookupLogin("claude")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ".credentials.json"), claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now()), 0o600)
	env := func(k string) string {
		if k == "CLAUDE_CONFIG_DIR" {
			return dir
		}
		return ""
	}
	if _, err := ImportLogin(claude, t.TempDir(), env); err != nil {
		t.Fatal(err)
	}
}

func TestLoginStore(t *testing.T) {
	claude, _ := LookupLogin("claude")
	home := t.TempDir()
	if _, err := LoadLogin(home, claude); !errors.Is(err, ErrNoLogin) || !strings.Contains(err.Error(), "vibedom auth import claude") {
		t.Fatalf("no login: %v", err)
	}
	l, err := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now().Add(time.Hour)), "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := SaveLogin(home, l); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(Dir(home), "claude.login")
	if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored file: %v %v", fi, err)
	}
	got, err := LoadLogin(home, claude)
	if err != nil || got.access != l.access || got.refresh != l.refresh || got.Plan != "max" || !got.Expires.Equal(l.Expires) {
		t.Fatalf("loaded %+v %v", got, err)
	}
	ls, err := LoadLogins(home)
	if err != nil || len(ls) != 1 {
		t.Fatalf("LoadLogins %v %v", ls, err)
	}
	os.Chmod(f, 0o644)
	if _, err := LoadLogin(home, claude); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a readable file: %v", err)
	}
	os.Chmod(f, 0o600)
	os.WriteFile(f, []byte("{\"version\":1,"), 0o600)
	_, err = LoadLogin(home, claude)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "vibedom auth import claude") || strings.Contains(err.Error(), "\n") {
		t.Errorf("a damaged record: %v", err)
	}
	if err := RemoveLogin(home, claude); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadLogin(home, claude); !errors.Is(err, ErrNoLogin) {
		t.Errorf("after rm: %v", err)
	}
	if err := RemoveLogin(home, claude); err != nil {
		t.Errorf("rm twice: %v", err)
	}
}

// TestLoginPlaceholders: the guest's file has the CLI's own shape (it
// parses as the CLI's document), holds placeholders of the real tokens'
// prefix, length and alphabet, JWTs stay JWTs with the claims the CLI
// reads and no real signature, and nothing real is in it.
func TestLoginPlaceholders(t *testing.T) {
	claude, _ := LookupLogin("claude")
	codex, _ := LookupLogin("codex")
	cAccess := fakeJWT(t, map[string]any{"exp": time.Now().Add(time.Hour).Unix(), "https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-123"}})
	for _, c := range []struct {
		kind LoginKind
		doc  []byte
	}{
		{claude, claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now().Add(time.Minute))},
		{codex, codexDoc(t, cAccess, randTok("rt_", 60)+".x")},
	} {
		t.Run(c.kind.Name, func(t *testing.T) {
			l, err := ParseLogin(c.kind, c.doc, "test")
			if err != nil {
				t.Fatal(err)
			}
			s, err := NewLoginSession(t.TempDir(), l, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			rel, b := s.GuestFile()
			if rel != c.kind.File {
				t.Fatalf("%s", rel)
			}
			for _, v := range l.Secrets() {
				secret := v[min(len(v), 13):] // past any public prefix
				if parts := strings.Split(v, "."); len(parts) == 3 {
					secret = parts[2] // a JWT's claims are copied on purpose; its signature never
				}
				if bytes.Contains(b, []byte(v)) || sharesRun(string(b), secret, 12) {
					t.Fatalf("the guest's file holds a real token: %s", b)
				}
			}
			// The CLI's own reader (vibedom's parser of its format) takes it.
			g, err := ParseLogin(c.kind, b, "guest file")
			if err != nil {
				t.Fatalf("the guest's file does not parse as the CLI's: %v\n%s", err, b)
			}
			if g.Plan != l.Plan || g.AccountID != l.AccountID || time.Until(g.Expires) < 10*time.Hour {
				t.Errorf("guest login %+v, host %+v", g, l)
			}
			pairs := [][2]string{{l.access, g.access}, {l.refresh, g.refresh}, {l.id, g.id}}
			for _, p := range pairs {
				real, ph := p[0], p[1]
				if real == "" {
					continue
				}
				if _, err := jwtClaims(real); err == nil {
					claims, err := jwtClaims(ph)
					if err != nil {
						t.Fatalf("a JWT's placeholder is no JWT: %v", err)
					}
					if strings.Split(ph, ".")[2] == strings.Split(real, ".")[2] {
						t.Errorf("the placeholder has the real signature")
					}
					rc, _ := jwtClaims(real)
					for _, k := range []string{"email", "https://api.openai.com/auth"} {
						if (rc[k] == nil) != (claims[k] == nil) {
							t.Errorf("claim %s: real %v, placeholder %v", k, rc[k], claims[k])
						}
					}
					if exp, err := jwtExpiry(ph); err != nil || time.Until(exp) < 10*time.Hour {
						t.Errorf("placeholder exp %v %v", exp, err)
					}
					continue
				}
				pre := ""
				for _, x := range tokenPrefixes {
					if strings.HasPrefix(real, x) {
						pre = x
						break
					}
				}
				if len(ph) != len(real) || !strings.HasPrefix(ph, pre) || ph == real {
					t.Errorf("placeholder %q for %q", ph, real)
				}
				for _, ch := range ph[len(pre):] {
					if !strings.ContainsRune(real[len(pre):], ch) && !strings.ContainsRune(alphabetOf(real[len(pre):]), ch) {
						t.Errorf("placeholder %q outside the alphabet of %q", ph, real)
					}
				}
				if strings.ContainsAny(real, ".") != strings.ContainsAny(ph, ".") && !strings.Contains(alphabetOf(real[len(pre):]), ".") {
					t.Errorf("alphabet of %q: %q", real, ph)
				}
			}
		})
	}
}

func TestRefreshClient(t *testing.T) {
	claude, _ := LookupLogin("claude")
	codex, _ := LookupLogin("codex")
	t.Run("claude", func(t *testing.T) {
		refresh := randTok("sk-ant-ort01-", 95)
		e := newTokenEndpoint(t, claude, refresh)
		l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), refresh, time.Now()), "test")
		c := &RefreshClient{HTTP: e.client}
		n, err := c.Refresh(t.Context(), l)
		if err != nil {
			t.Fatal(err)
		}
		if n.access != e.access || n.refresh != e.refresh || time.Until(n.Expires) < 50*time.Minute || l.refresh != refresh {
			t.Errorf("refreshed %+v", n)
		}
		b := e.bodies[0]
		if b["grant_type"] != "refresh_token" || b["refresh_token"] != refresh || b["client_id"] != claude.ClientID ||
			b["scope"] != "user:inference user:profile user:sessions:claude_code" {
			t.Errorf("request body %v", b)
		}
		// The old refresh token was used up: a second use is refused.
		_, err = c.Refresh(t.Context(), l)
		if !errors.Is(err, ErrRefreshRefused) || !strings.Contains(err.Error(), "vibedom auth login claude") || strings.Contains(err.Error(), refresh) {
			t.Errorf("reused refresh token: %v", err)
		}
	})
	t.Run("codex", func(t *testing.T) {
		refresh := randTok("rt_", 60)
		e := newTokenEndpoint(t, codex, refresh)
		l, _ := ParseLogin(codex, codexDoc(t, fakeJWT(t, codexClaims(time.Now())), refresh), "test")
		n, err := (&RefreshClient{HTTP: e.client}).Refresh(t.Context(), l)
		if err != nil {
			t.Fatal(err)
		}
		if n.access != e.access || n.refresh != e.refresh || n.id == l.id || time.Until(n.Expires) < 50*time.Minute {
			t.Errorf("refreshed %+v", n)
		}
		if b := e.bodies[0]; b["client_id"] != codex.ClientID || b["refresh_token"] != refresh || b["scope"] != nil {
			t.Errorf("request body %v", b)
		}
	})
	t.Run("expired refresh token", func(t *testing.T) {
		refresh := randTok("sk-ant-ort01-", 95)
		e := newTokenEndpoint(t, claude, refresh)
		l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), refresh, time.Now()), "test")
		l.RefreshExpires = time.Now().Add(-time.Minute)
		_, err := (&RefreshClient{HTTP: e.client}).Refresh(t.Context(), l)
		if !errors.Is(err, ErrRefreshRefused) || !strings.Contains(err.Error(), "vibedom auth login claude") || e.calls() != 0 {
			t.Errorf("expired refresh token: %v (%d calls)", err, e.calls())
		}
	})
}

// TestLoginSessionRefresh: the host refreshes a token due within 5
// minutes, once, saves the new login, keeps every real value it held for
// the scrubbers; the guest's placeholders do not change; a refused
// refresh gives an error that says what to run.
func TestLoginSessionRefresh(t *testing.T) {
	claude, _ := LookupLogin("claude")
	home := t.TempDir()
	refresh, access := randTok("sk-ant-ort01-", 95), randTok("sk-ant-oat01-", 95)
	e := newTokenEndpoint(t, claude, refresh)
	l, _ := ParseLogin(claude, claudeDoc(access, refresh, time.Now().Add(4*time.Minute)), "test")
	s, err := NewLoginSession(home, l, &RefreshClient{HTTP: e.client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, before := s.GuestFile()
	tok, err := s.AccessToken(t.Context())
	if err != nil || tok != e.access || tok == access {
		t.Fatalf("access token %q %v", tok, err)
	}
	tok2, _ := s.AccessToken(t.Context())
	if tok2 != tok || e.calls() != 1 {
		t.Errorf("a fresh token was refreshed again (%d calls)", e.calls())
	}
	if _, after := s.GuestFile(); !bytes.Equal(before, after) {
		t.Errorf("the guest's file changed with the host's refresh")
	}
	saved, err := LoadLogin(home, claude)
	if err != nil || saved.access != tok || saved.refresh != e.refresh {
		t.Errorf("the refreshed login was not saved: %v", err)
	}
	if sec := strings.Join(s.Secrets(), " "); !strings.Contains(sec, access) || !strings.Contains(sec, tok) || !strings.Contains(sec, refresh) {
		t.Errorf("secrets miss a value held this session")
	}
	// Due again, and the vendor refuses.
	s.mu.Lock()
	s.login.Expires = time.Now()
	s.mu.Unlock()
	e.mu.Lock()
	e.refuse = true
	e.mu.Unlock()
	_, err = s.AccessToken(t.Context())
	if !errors.Is(err, ErrLoginUnusable) || !strings.Contains(err.Error(), "vibedom auth login claude") {
		t.Errorf("refused refresh: %v", err)
	}
	body := string(claude.UnusableAnswer(err))
	if !strings.Contains(body, "vibedom auth login claude") || !strings.Contains(body, "authentication_error") {
		t.Errorf("401 body %s", body)
	}
	for _, v := range s.Secrets() {
		if strings.Contains(body, v) {
			t.Errorf("the 401 body holds a token")
		}
	}
}

// TestAnswerTokenRequest: the guest's refresh (its placeholder refresh
// token) gets a new placeholder set and reaches nobody; anything else to
// the token host is refused.
func TestAnswerTokenRequest(t *testing.T) {
	claude, _ := LookupLogin("claude")
	codex, _ := LookupLogin("codex")
	for _, k := range []LoginKind{claude, codex} {
		t.Run(k.Name, func(t *testing.T) {
			var doc []byte
			if k.Name == "claude" {
				doc = claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now().Add(time.Hour))
			} else {
				doc = codexDoc(t, fakeJWT(t, codexClaims(time.Now().Add(time.Hour))), randTok("rt_", 60))
			}
			l, _ := ParseLogin(k, doc, "test")
			e := newTokenEndpoint(t, k, "none")
			s, _ := NewLoginSession(t.TempDir(), l, &RefreshClient{HTTP: e.client}, nil)
			first := s.FirstPlaceholders()
			ask := func(method, path, ctype, body string) (int, map[string]any) {
				r := httptest.NewRequest(method, "https://"+k.TokenHost+path, strings.NewReader(body))
				r.Header.Set("Content-Type", ctype)
				st, b, note := s.AnswerTokenRequest(r)
				var m map[string]any
				if err := jsonUnmarshal(b, &m); err != nil {
					t.Fatalf("answer %s is no JSON", b)
				}
				for _, v := range l.Secrets() {
					if strings.Contains(string(b), v) || strings.Contains(note, v) {
						t.Fatalf("a real token in the answer")
					}
				}
				return st, m
			}
			st, m := ask("POST", k.TokenPath, "application/json", `{"grant_type":"refresh_token","refresh_token":"`+first[1]+`","client_id":"x"}`)
			if st != http.StatusOK || m["access_token"] == first[0] || m["refresh_token"] == first[1] || m["access_token"] == nil {
				t.Fatalf("guest refresh: %d %v", st, m)
			}
			if !s.IsAccessPlaceholder(m["access_token"].(string)) || !s.IsAccessPlaceholder(first[0]) {
				t.Errorf("the new and the old access placeholders are not both swapped")
			}
			if k.Name == "codex" {
				if _, err := jwtClaims(m["id_token"].(string)); err != nil {
					t.Errorf("codex id_token: %v", err)
				}
			}
			// The new refresh placeholder works too, form-encoded.
			st, _ = ask("POST", k.TokenPath, "application/x-www-form-urlencoded", "grant_type=refresh_token&refresh_token="+m["refresh_token"].(string))
			if st != http.StatusOK {
				t.Errorf("second guest refresh: %d", st)
			}
			for _, c := range []struct {
				method, path, body string
				want               int
			}{
				{"POST", k.TokenPath, `{"grant_type":"refresh_token","refresh_token":"` + l.refresh + `"}`, 400},
				{"POST", k.TokenPath, `{"grant_type":"authorization_code","code":"abc"}`, 403},
				{"POST", "/other", `{}`, 403},
				{"GET", k.TokenPath, ``, 405},
				{"POST", k.TokenPath, `not json`, 400},
			} {
				if st, m := ask(c.method, c.path, "application/json", c.body); st != c.want || !strings.Contains(m["error_description"].(string), "vibedom") {
					t.Errorf("%s %s %s: %d %v, want %d", c.method, c.path, c.body, st, m, c.want)
				}
			}
			if e.calls() != 0 {
				t.Errorf("the vendor's endpoint was called %d times for the guest's requests", e.calls())
			}
		})
	}
}

// redactingHandler is a log handler that, as a session's does, runs every
// message through the session's Redact.
type redactingHandler struct {
	slog.Handler
	s   *Session
	out *strings.Builder
	mu  *sync.Mutex
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	line := r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	line = h.s.Redact(line)
	h.mu.Lock()
	h.out.WriteString(line + "\n")
	h.mu.Unlock()
	return nil
}

// TestLoginSessionLogsThroughRedact: the refresh logs through a handler
// that redacts with the session's own tokens (as session.log does) without
// deadlocking, and the log holds no token.
func TestLoginSessionLogsThroughRedact(t *testing.T) {
	claude, _ := LookupLogin("claude")
	refresh := randTok("sk-ant-ort01-", 95)
	e := newTokenEndpoint(t, claude, refresh)
	l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), refresh, time.Now()), "test")
	cs, _ := NewSession(nil)
	var out strings.Builder
	h := redactingHandler{Handler: slog.NewTextHandler(io.Discard, nil), s: cs, out: &out, mu: &sync.Mutex{}}
	s, err := NewLoginSession(t.TempDir(), l, &RefreshClient{HTTP: e.client}, slog.New(h))
	if err != nil {
		t.Fatal(err)
	}
	cs.AddLogin(s)
	done := make(chan error, 1)
	go func() { _, err := s.AccessToken(context.Background()); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the refresh deadlocked on its own log line")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !strings.Contains(out.String(), "refreshed") {
		t.Errorf("no log line: %q", out.String())
	}
	for _, v := range s.Secrets() {
		if strings.Contains(out.String(), v) {
			t.Errorf("the log holds a token")
		}
	}
}

// TestSessionWithLogin: a session with an Anthropic API key and a claude
// login gives the guest the login's placeholder file and no API key
// variable (Claude Code would take the key over its login), knows the
// login's tokens and the file's placeholders as DLP values, allows the
// login's hosts, hands a dynamic swap rule down, and redacts the tokens.
func TestSessionWithLogin(t *testing.T) {
	a, _ := Lookup("anthropic")
	o, _ := Lookup("openai")
	claude, _ := LookupLogin("claude")
	s, err := NewSession([]Key{{Provider: a, value: randTok("sk-ant-api03-", 95), Source: "test"}, {Provider: o, value: randTok("sk-proj-", 120), Source: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now().Add(time.Hour)), "test")
	ls, _ := NewLoginSession(t.TempDir(), l, nil, nil)
	s.AddLogin(ls)
	env := s.GuestEnv()
	if _, ok := env["ANTHROPIC_API_KEY"]; ok || env["OPENAI_API_KEY"] == "" {
		t.Errorf("guest env %v", env)
	}
	files := s.GuestFiles()
	if len(files) != 1 || files[".claude/.credentials.json"] == nil {
		t.Errorf("guest files %v", files)
	}
	known := map[string]bool{}
	for _, k := range s.KnownValues() {
		known[k.Value] = true
	}
	for _, v := range append(l.Secrets(), ls.FirstPlaceholders()...) {
		if !known[v] {
			t.Errorf("%.16s… is no DLP known value", v)
		}
	}
	if r := strings.Join(s.AllowRules(), " "); r != "api.anthropic.com:443 platform.claude.com:443" {
		t.Errorf("allow rules %q", r)
	}
	var dyn int
	for _, sw := range s.Swaps() {
		if sw.Dynamic != nil {
			dyn++
			if sw.Host != "api.anthropic.com" || sw.Header != "authorization" {
				t.Errorf("login swap %+v", sw)
			}
			if ea, ok := sw.Dynamic.(EndpointAnswerer); !ok || ea.AnswersHost() != "platform.claude.com" {
				t.Errorf("the login's swap does not answer its token endpoint")
			}
		}
	}
	if dyn != 1 {
		t.Errorf("%d dynamic swaps", dyn)
	}
	if got := s.Redact("x " + l.access + " y"); strings.Contains(got, l.access) {
		t.Errorf("Redact: %q", got)
	}
}
