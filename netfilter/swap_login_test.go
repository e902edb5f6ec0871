package netfilter

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/egress"
)

// fakeLogin is a DynamicCredential as credentials.LoginSession is one: the
// host's real token changes (refresh), the guest's refresh is answered
// with a new access placeholder, a failed refresh answers 401.
type fakeLogin struct {
	mu      sync.Mutex
	real    []string // every real token held; the last is current
	access  []string // access placeholders handed out
	refresh string   // the refresh placeholder
	fail    bool
	answers int
}

func (f *fakeLogin) Placeholders() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(append([]string(nil), f.access...), f.refresh)
}

func (f *fakeLogin) IsAccessPlaceholder(ph string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.access {
		if a == ph {
			return true
		}
	}
	return false
}

func (f *fakeLogin) AccessToken(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return "", &credentials.Answer{Status: http.StatusUnauthorized, Decision: "deny", Reason: "refresh failed",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"error":"run vibedom auth login claude"}`)}
	}
	return f.real[len(f.real)-1], nil
}

func (f *fakeLogin) Secrets() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.real...)
}

func (f *fakeLogin) AnswersHost() string { return "token.wild.test" }

func (f *fakeLogin) Answer(r *http.Request) *credentials.Answer {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers++
	if !strings.Contains(string(b), f.refresh) {
		return &credentials.Answer{Status: http.StatusBadRequest, Decision: "deny", Reason: "unknown refresh token", Body: []byte(`{"error":"invalid_grant"}`)}
	}
	ph := "sk-ant-oat01-" + strings.Repeat("NewP", 20) + "hh" // gitleaks:allow
	f.access = append(f.access, ph)
	body, _ := json.Marshal(map[string]string{"access_token": ph, "refresh_token": f.refresh})
	return &credentials.Answer{Status: http.StatusOK, Decision: "allow", Reason: "guest refresh", Body: body,
		Header: http.Header{"Content-Type": {"application/json"}}}
}

// TestLoginSwap (issue 21): a subscription login's access placeholder is
// swapped for the host's current real token in Authorization to the API
// host only; after the host refreshes, the same placeholder carries the
// new token; the guest's request to the token endpoint host is answered
// by vibedom, never forwarded; a refresh placeholder is refused anywhere;
// a failed host refresh answers 401 with the filter's body; responses
// echoing any real token held (the refreshed-away one included) are
// scrubbed; no log holds a real token. Both engines.
func TestLoginSwap(t *testing.T) {
	t.Parallel()
	real1 := "sk-ant-oat01-" + strings.Repeat("Rea1", 20) + "AA" // gitleaks:allow
	real2 := "sk-ant-oat01-" + strings.Repeat("Rea2", 20) + "AA" // gitleaks:allow
	ph := "sk-ant-oat01-" + strings.Repeat("PhAc", 20) + "BB"    // gitleaks:allow
	rph := "sk-ant-ort01-" + strings.Repeat("PhRe", 20) + "BB"   // gitleaks:allow
	forEngines(t, func(t *testing.T, kind string) {
		cred := &fakeLogin{real: []string{real1}, access: []string{ph}, refresh: rph}
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real1, Source: "login"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "claude login", Host: "api.test", Header: "authorization", Dynamic: cred}})
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		v.log.SetRedactor(func(s string) string {
			for _, r := range []string{real1, real2} {
				s = strings.ReplaceAll(s, r, "[R]")
			}
			return logredact.LogRedactor(eng)(s)
		})
		var mu sync.Mutex
		var seen []string
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/echo" {
				io.WriteString(w, "old "+real1+" new "+real2)
				return
			}
			mu.Lock()
			seen = append(seen, r.Header.Get("Authorization"))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		var tokenHits int
		v.UpstreamTLS("token.wild.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			tokenHits++
			mu.Unlock()
		}))
		c := &http.Client{Transport: v.GuestTransport(false)}
		send := func(url, auth, body string) (int, string) {
			t.Helper()
			req, _ := http.NewRequest("POST", url, strings.NewReader(body))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", url, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		if code, _ := send("https://api.test/v1/messages", "Bearer "+ph, "{}"); code != 200 {
			t.Fatalf("swap: %d", code)
		}
		cred.mu.Lock()
		cred.real = append(cred.real, real2) // the host refreshed
		cred.mu.Unlock()
		if code, _ := send("https://api.test/v1/messages", "Bearer "+ph, "{}"); code != 200 {
			t.Fatalf("swap after refresh: %d", code)
		}
		mu.Lock()
		got := append([]string(nil), seen...)
		mu.Unlock()
		if len(got) != 2 || got[0] != "Bearer "+real1 || got[1] != "Bearer "+real2 {
			t.Fatalf("the API saw %q", got)
		}
		// The guest's refresh: answered, nothing forwarded.
		code, body := send("https://token.wild.test/v1/oauth/token", "", `{"grant_type":"refresh_token","refresh_token":"`+rph+`"}`)
		if code != 200 || !strings.Contains(body, `"access_token":"sk-ant-oat01-NewP`) {
			t.Fatalf("guest refresh: %d %s", code, body)
		}
		var ans map[string]string
		json.Unmarshal([]byte(body), &ans)
		if code, _ := send("https://api.test/v1/messages", "Bearer "+ans["access_token"], "{}"); code != 200 {
			t.Errorf("the new placeholder is not swapped: %d", code)
		}
		if code, _ := send("https://token.wild.test/v1/oauth/token", "", `{"grant_type":"refresh_token","refresh_token":"other"}`); code != 400 {
			t.Errorf("unknown refresh token: %d", code)
		}
		for _, r := range []struct{ name, url, auth string }{
			{"refresh placeholder as a bearer", "https://api.test/v1/messages", "Bearer " + rph},
			{"access placeholder to another host", "https://x.wild.test/v1", "Bearer " + ph},
			{"access placeholder on another port", "https://api.test:8443/v1", "Bearer " + ph},
			{"access placeholder without Bearer", "https://api.test/v1", ph},
		} {
			if code, _ := send(r.url, r.auth, "{}"); code != http.StatusForbidden {
				t.Errorf("%s: %d, want 403", r.name, code)
			}
		}
		// A response echoing real tokens, old and current.
		req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), real1) || strings.Contains(string(b), real2) || !strings.Contains(string(b), RedactedSecret) {
			t.Errorf("echoed tokens reached the guest: %q", b)
		}
		// The host cannot refresh: a 401 saying what to run.
		cred.mu.Lock()
		cred.fail = true
		cred.mu.Unlock()
		code, body = send("https://api.test/v1/messages", "Bearer "+ph, "{}")
		if code != http.StatusUnauthorized || !strings.Contains(body, "vibedom auth login claude") {
			t.Errorf("failed refresh: %d %s", code, body)
		}
		mu.Lock()
		if len(seen) != 3 || tokenHits != 0 {
			t.Errorf("forwarded: API %d (want 3), token endpoint %d (want 0)", len(seen), tokenHits)
		}
		mu.Unlock()
		v.Events.Wait(t, "answered refresh", func(e egress.Event) bool {
			return strings.Contains(e.Reason, "answered by vibedom") && e.Status == 200
		})
		files, _ := filepath.Glob(filepath.Join(v.logDir, "*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			for _, s := range []string{real1, real2, rph} {
				if strings.Contains(string(b), s) {
					t.Errorf("%s holds %.16s…", f, s)
				}
			}
		}
	})
}
