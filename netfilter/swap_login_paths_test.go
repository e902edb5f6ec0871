package netfilter

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter/egress"
)

// TestLoginSwapPaths (issue 21, adversarial): a subscription login's
// access placeholder is swapped only on the paths its CLI uses
// (credentials.Swap.Paths, as codex's row: "/backend-api/codex/" and
// below, "/backend-api/wham/usage" exactly). On any other path of the API
// host (the user's ChatGPT conversations, an API-key minting endpoint) the
// guest gets a 403 saying so, an alert is logged, and nothing is
// forwarded; no spelling of the path (dot segments, percent escapes, "//",
// ";", "\", another case, a query string, an absolute-form request line)
// gets past the prefix. Both engines, HTTP/1.1 request lines sent raw over
// the guest's TLS, and HTTP/2.
func TestLoginSwapPaths(t *testing.T) {
	t.Parallel()
	real1 := "eyJhbGciOiJSUzI1NiJ9." + strings.Repeat("UmVhbDE", 12) + ".c2ln" // gitleaks:allow
	ph := "eyJhbGciOiJSUzI1NiJ9." + strings.Repeat("UGhBY2M", 12) + ".cGhz"    // gitleaks:allow
	rph := "rt_" + strings.Repeat("PhRe", 16)                                  // gitleaks:allow
	forEngines(t, func(t *testing.T, kind string) {
		cred := &fakeLogin{real: []string{real1}, access: []string{ph}, refresh: rph}
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real1, Source: "login"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "codex login", Host: "api.test",
			Header: "authorization", Paths: []string{"/backend-api/codex/", "/backend-api/wham/usage"}, Dynamic: cred}})
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		var mu sync.Mutex
		var hits []string
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, r.RequestURI+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		raw := func(target string) (int, string) {
			t.Helper()
			tc := tls.Client(v.GuestConn("api.test", 443), &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
			defer tc.Close()
			io.WriteString(tc, "POST "+target+" HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph+
				"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil {
				t.Fatalf("%s: %v", target, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		allowed := []string{
			"/backend-api/codex/responses",
			"/backend-api/codex/models?client_version=0.169.0",
			"/backend-api/wham/usage",
			"/backend-api/wham/usage?x=/../conversations",
		}
		for _, p := range allowed {
			if code, body := raw(p); code != 200 {
				t.Errorf("allowed %s: %d %s", p, code, body)
			}
		}
		h2 := &http.Client{Transport: v.GuestTransport(true)}
		req, _ := http.NewRequest("POST", "https://api.test/backend-api/codex/responses", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err := h2.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			t.Errorf("allowed over HTTP/2: %d %s", resp.StatusCode, resp.Proto)
		}
		mu.Lock()
		if len(hits) != len(allowed)+1 {
			t.Fatalf("upstream saw %d requests, want %d: %q", len(hits), len(allowed)+1, hits)
		}
		for _, h := range hits {
			if !strings.HasSuffix(h, " Bearer "+real1) {
				t.Errorf("not swapped: %.60q", h)
			}
		}
		hits = nil
		mu.Unlock()

		refused := []string{
			"/backend-api/conversations",
			"/backend-api/conversations?next=/backend-api/codex/",
			"/backend-api/codex",
			"/backend-api/codex/",
			"/backend-api/wham/usagex",
			"/backend-api/wham/usage/",
			"/backend-api/wham/tasks/list",
			"/backend-api/codex/../conversations",
			"/backend-api/codex/./../conversations",
			"/backend-api/wham/usage/../../conversations",
			"/backend-api/codex/%2e%2e/conversations",
			"/backend-api/codex/%2E%2E/conversations",
			"/backend-api/codex/..%2fconversations",
			"/backend-api/codex%2f..%2f..%2fconversations",
			"/backend-api/%63odex/responses",
			"//backend-api/codex/responses",
			"/backend-api//codex/responses",
			"/backend-api/codex//../../conversations",
			"/backend-api/codex;/../conversations",
			"/backend-api/codex/responses;x=/../../conversations",
			"/backend-api/codex/..\\conversations",
			"/Backend-API/codex/responses",
			"/backend-api/CODEX/responses",
			"/backend-api/codex/responses/..",
			"https://api.test/backend-api/conversations",
			"https://api.test/backend-api/codex/../conversations",
			"https://api.test//backend-api/codex/responses",
		}
		for _, p := range refused {
			code, body := raw(p)
			if code == 200 {
				t.Errorf("%s: swapped and forwarded", p)
				continue
			}
			if code != http.StatusForbidden || !strings.Contains(body, "not use with a subscription login") {
				// The engine's own parser may turn a malformed line away first.
				t.Logf("%s: %d (the engine refused it before the filter)", p, code)
				if code != http.StatusBadRequest {
					t.Errorf("%s: %d %q, want 403 saying the CLI does not use the path with a subscription login", p, code, body)
				}
			}
		}
		req, _ = http.NewRequest("GET", "https://api.test/backend-api/conversations", nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		resp, err = h2.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "not use with a subscription login") {
			t.Errorf("HTTP/2 to a disallowed path: %d %q", resp.StatusCode, b)
		}
		mu.Lock()
		if len(hits) != 0 {
			t.Errorf("forwarded from a disallowed path: %q", hits)
		}
		mu.Unlock()
		v.Events.Wait(t, "refused path", func(e egress.Event) bool {
			return e.Decision == "deny" && strings.Contains(e.Reason, "not use with a subscription login") &&
				strings.Contains(e.URL, "/backend-api/conversations")
		})
		var alerted bool
		for _, a := range v.alerts() {
			if r, _ := a["reason"].(string); strings.Contains(r, "not use with a subscription login") {
				alerted = true
			}
		}
		if !alerted {
			t.Error("no alert for a placeholder on a disallowed path")
		}
	})
}
