package credentials

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAnswerTokenRequestAdversarial (issue 21, adversarial): the guest's
// requests to the token endpoint cannot turn vibedom's answer into
// anything but placeholders of this session: a placeholder of another
// session (same host login) is refused and not swapped, a token exchange
// or a grant smuggled past the first field is refused, and a guest
// refreshing in a loop cannot grow the host's memory (the placeholders
// handed out are bounded).
func TestAnswerTokenRequestAdversarial(t *testing.T) {
	t.Parallel()
	claude, _ := LookupLogin("claude")
	l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), time.Now().Add(time.Hour)), "test")
	s1, _ := NewLoginSession(t.TempDir(), l, nil, nil)
	s2, _ := NewLoginSession(t.TempDir(), l, nil, nil)
	ask := func(s *LoginSession, ctype, body string) int {
		r := httptest.NewRequest("POST", "https://"+claude.TokenHost+claude.TokenPath, strings.NewReader(body))
		r.Header.Set("Content-Type", ctype)
		st, b, _ := s.AnswerTokenRequest(r)
		for _, v := range l.Secrets() {
			if strings.Contains(string(b), v) {
				t.Fatalf("a real token in the answer")
			}
		}
		return st
	}
	other := s1.FirstPlaceholders()
	if st := ask(s2, "application/json", `{"grant_type":"refresh_token","refresh_token":"`+other[1]+`"}`); st != http.StatusBadRequest {
		t.Errorf("another session's refresh placeholder: %d", st)
	}
	if s2.IsAccessPlaceholder(other[0]) {
		t.Errorf("another session's access placeholder is swapped")
	}
	mine := s2.FirstPlaceholders()
	for _, c := range []struct{ name, ctype, body string }{
		{"token exchange", "application/json", `{"grant_type":"urn:ietf:params:oauth:grant-type:token-exchange","subject_token":"` + mine[0] + `"}`},
		{"form, sign-in first", "application/x-www-form-urlencoded", "grant_type=authorization_code&grant_type=refresh_token&refresh_token=" + mine[1]},
		{"refresh grant as a number", "application/json", `{"grant_type":1,"refresh_token":"` + mine[1] + `"}`},
	} {
		if st := ask(s2, c.ctype, c.body); st == http.StatusOK {
			t.Errorf("%s: answered with placeholders", c.name)
		}
	}
	ok := 0
	for range 2000 {
		if ask(s2, "application/json", `{"grant_type":"refresh_token","refresh_token":"`+mine[1]+`"}`) == http.StatusOK {
			ok++
		}
	}
	if n := len(s2.Placeholders()); n > 2*(maxGuestRefreshes+1)+1 || ok == 2000 {
		t.Errorf("2000 guest refreshes: %d answered, %d placeholders held", ok, n)
	}
}

// TestSessionRedactEncoded (issue 21, adversarial): a log line holding a
// token the host refreshed during the session (no DLP known value) in
// another form than as is (base64 in a refused request's URL, lower case
// in a header name) is redacted too.
func TestSessionRedactEncoded(t *testing.T) {
	t.Parallel()
	claude, _ := LookupLogin("claude")
	refresh := randTok("sk-ant-ort01-", 95)
	e := newTokenEndpoint(t, claude, refresh)
	l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), refresh, time.Now()), "test")
	cs, _ := NewSession(nil)
	s, err := NewLoginSession(t.TempDir(), l, &RefreshClient{HTTP: e.client}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs.AddLogin(s)
	tok, err := s.AccessToken(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"GET https://x.test/?t=" + base64.StdEncoding.EncodeToString([]byte(tok)),
		"GET https://x.test/" + hex.EncodeToString([]byte(tok)),
		"refused: header x-" + strings.ToLower(tok),
	} {
		out := cs.Redact(line)
		if strings.Contains(strings.ToLower(out), strings.ToLower(tok[13:40])) || out == line {
			t.Errorf("not redacted: %q", out)
		}
	}
}
