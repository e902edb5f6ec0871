package netfilter

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/dlp"
)

// TestConformanceDLPCredentialHeaders: a secret found by its shape (an AWS
// key id, a GitHub or GitLab token, a JWT) rides in a credential header
// (Cookie, Authorization, X-Api-Key, Private-Token) no more than in any
// other: redacted to public and external destinations, passed to
// internal ones, whatever the header. What the guest is meant to send
// there comes through untouched: the session's placeholder (swapped for
// the real key by the swap filter wrapped around the DLP, as a session
// does), a known value to the AI API (logged), and the twins: tokens a
// server issues (an opaque bearer token, session and CSRF cookies, Basic
// credentials), personal data in a cookie. Real HTTP clients through both
// engines, HTTP/1.1 and HTTP/2.
func TestConformanceDLPCredentialHeaders(t *testing.T) {
	t.Parallel()
	// Fixtures built at run time (the project's own secrets scan stays quiet).
	real := "sk-ant-api03-" + strings.Repeat("R3al", 20) + "AA"  // gitleaks:allow
	ph := "sk-ant-api03-" + strings.Repeat("PhXx", 20) + "BB"    // gitleaks:allow
	other := "sk-ant-api03-" + strings.Repeat("Oth3", 20) + "CC" // gitleaks:allow
	gh := strings.Join([]string{"ghp_", "R8mKq2Lx7Vn4Tp9Wz3Yb6Hc1Jf5Gd0Se8Ua1"}, "")
	gl := strings.Join([]string{"glpat-", "x9Kq2Lm7Vn4Tp8Wz3Yb6"}, "")
	jwt := strings.Join([]string{"eyJhbGciOiJIUzI1NiJ9", ".", "eyJzdWIiOiJib2IiLCJuIjo3fQ", ".", "Xq3LmN7vK2pR9tW4yB6hC1jF5gD0sEa8Zx3LmN7vK2p"}, "")
	opaque := strings.Join([]string{"Zx8Qm2Lk7Vn4", "Tp9Wr3Yb6Hc1"}, "")
	csrf := strings.Join([]string{"q8Zx3LmN7vK2pR9t", "W4yB6hC1jF5gD0sE"}, "")
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:"+strings.Join([]string{"Tr0ub4dor", "&3x"}, "")))
	const pub, ext, in = "registry.example.net", "api.anthropic.com", "git.corp.internal"

	type hdr = [2]string
	cases := []struct {
		name, host string
		send, want []hdr // want: the headers as the upstream must see them
	}{
		// Found by shape: redacted where pattern secrets are.
		{"public/cookie aws", pub, []hdr{{"Cookie", "s=" + dlpAWS + "; theme=dark"}}, []hdr{{"Cookie", "s=[REDACTED:CLOUD_KEY]; theme=dark"}}},
		{"public/cookie aws glued", pub, []hdr{{"Cookie", "id=100-" + dlpAWS}}, []hdr{{"Cookie", "id=100-[REDACTED:CLOUD_KEY]"}}},
		{"public/bearer github", pub, []hdr{{"Authorization", "Bearer " + gh}}, []hdr{{"Authorization", "Bearer [REDACTED:TOKEN]"}}},
		{"public/x-api-key jwt", pub, []hdr{{"X-Api-Key", jwt}}, []hdr{{"X-Api-Key", "[REDACTED:JWT]"}}},
		{"public/private-token gitlab", pub, []hdr{{"Private-Token", gl}}, []hdr{{"Private-Token", "[REDACTED:TOKEN]"}}},
		{"public/anthropic key not the placeholder", pub, []hdr{{"X-Api-Key", other}}, []hdr{{"X-Api-Key", "[REDACTED:TOKEN]"}}},
		{"public/known value", pub, []hdr{{"Authorization", "Bearer " + dlpSecret}}, []hdr{{"Authorization", "Bearer [REDACTED:SECRET]"}}},
		{"external/bearer github beside the swap", ext, []hdr{{"X-Api-Key", ph}, {"Authorization", "Bearer " + gh}},
			[]hdr{{"X-Api-Key", real}, {"Authorization", "Bearer [REDACTED:TOKEN]"}}},
		{"external/another anthropic key", ext, []hdr{{"Authorization", "Bearer " + other}}, []hdr{{"Authorization", "Bearer [REDACTED:TOKEN]"}}},
		{"external/cookie aws", ext, []hdr{{"Cookie", "k=" + dlpAWS}}, []hdr{{"Cookie", "k=[REDACTED:CLOUD_KEY]"}}},
		// What the guest is meant to send.
		{"external/the placeholder is swapped", ext, []hdr{{"X-Api-Key", ph}}, []hdr{{"X-Api-Key", real}}},
		{"external/known value is logged", ext, []hdr{{"Authorization", "Bearer " + dlpSecret}}, []hdr{{"Authorization", "Bearer " + dlpSecret}}},
		{"internal/keys pass", in, []hdr{{"Cookie", "s=" + dlpAWS}, {"Authorization", "Bearer " + gh}},
			[]hdr{{"Cookie", "s=" + dlpAWS}, {"Authorization", "Bearer " + gh}}},
		{"twin/public opaque bearer", pub, []hdr{{"Authorization", "Bearer " + opaque}}, []hdr{{"Authorization", "Bearer " + opaque}}},
		{"twin/public session cookies", pub, []hdr{{"Cookie", "csrftoken=" + csrf + "; sessionid=" + opaque + "; user=bob@corp.io"}},
			[]hdr{{"Cookie", "csrftoken=" + csrf + "; sessionid=" + opaque + "; user=bob@corp.io"}}},
		{"twin/public basic", pub, []hdr{{"Authorization", basic}}, []hdr{{"Authorization", basic}}},
		{"twin/public x-auth-token", pub, []hdr{{"X-Auth-Token", "auth_token=" + csrf}}, []hdr{{"X-Auth-Token", "auth_token=" + csrf}}},
		{"twin/external opaque bearer", ext, []hdr{{"Authorization", "Bearer " + opaque}}, []hdr{{"Authorization", "Bearer " + opaque}}},
	}
	forEngines(t, func(t *testing.T, kind string) {
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: dlpSecret, Source: ".env:1 API_KEY"}, {Value: real, Source: "host key"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "anthropic", Host: ext, Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})
		v := newEngineEnv(t, kind, dlpRules, func(c *mitm.EngineConfig) { c.Filter = filter })
		v.log.SetRedactor(logredact.LogRedactor(eng))
		up := map[string]*seen{}
		for _, name := range []string{pub, ext, in} {
			up[name] = &seen{}
			v.UpstreamTLS(name, 443, v.UpCA, up[name].handler())
		}
		n := 0
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			for _, tc := range cases {
				t.Run(map[bool]string{false: "http1", true: "h2"}[h2]+"/"+tc.name, func(t *testing.T) {
					req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://"+tc.host+"/v1/x", nil)
					for _, h := range tc.send {
						req.Header.Set(h[0], h[1])
					}
					resp, err := c.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					n++
					if resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
					got := up[tc.host].last(t)
					for _, h := range tc.want {
						if g := got.header.Get(h[0]); g != h[1] {
							t.Errorf("%s: upstream got %q, want %q", h[0], g, h[1])
						}
					}
				})
			}
		}
		v.Events.WaitCount(t, "requests", n, func(e egress.Event) bool { return e.Kind == "request" })
		v.log.Close()
		for _, f := range []string{NetworkLogFile, AlertsLogFile} {
			b, _ := os.ReadFile(filepath.Join(v.logDir, f))
			for _, s := range []string{dlpAWS, gh, gl, jwt, other, real, ph, dlpSecret} {
				if bytes.Contains(b, []byte(s)) {
					t.Errorf("%s holds a value (%.8s…)", f, s)
				}
			}
		}
	})
}
