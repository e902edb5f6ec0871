package netfilter

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"
)

// TestLoginSwapTrailerAdv (adversarial): a real token the host refreshed
// mid-session (which the DLP, its known values fixed at the start, does
// not know) is refused in a request trailer as it is in a header: in the
// value or the name, declared or not, HTTP/1 and HTTP/2, on both engines,
// a short body or one streamed. The upstream never sees it.
func TestLoginSwapTrailerAdv(t *testing.T) {
	t.Parallel()
	real1 := "sk-ant-oat01-" + strings.Repeat("Rea1", 20) + "AA" // gitleaks:allow
	real2 := "vQ" + strings.Repeat("rEa2tOkN", 10) + "x9"        // gitleaks:allow
	ph := "sk-ant-oat01-" + strings.Repeat("PhAc", 20) + "BB"    // gitleaks:allow
	rph := "sk-ant-ort01-" + strings.Repeat("PhRe", 20) + "BB"   // gitleaks:allow
	forEngines(t, func(t *testing.T, kind string) {
		cred := &fakeLogin{real: []string{real1}, access: []string{ph}, refresh: rph}
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real1, Source: "login"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng, BufferLimit: 64}, []credentials.Swap{{Name: "claude login", Host: "api.test", Header: "authorization", Dynamic: cred}})
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		var mu sync.Mutex
		var got []string
		v.UpstreamTLS("x.wild.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, fmt.Sprintf("%s %v %v %s", r.URL.Path, r.Header, r.Trailer, b))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		cred.mu.Lock()
		cred.real = append(cred.real, real2) // the host refreshed
		cred.mu.Unlock()
		long := strings.Repeat("streamed past the buffer limit\n", 8)
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			for _, tc := range []struct {
				name, body string
				tr         http.Header
			}{
				{"value", "short", http.Header{"X-Late": {"t=" + real2}}},
				{"value-streamed", long, http.Header{"X-Late": {real2}}},
				{"name", "short", http.Header{"X-" + real2: {"v"}}},
			} {
				t.Run(fmt.Sprintf("h2=%v/%s", h2, tc.name), func(t *testing.T) {
					req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://x.wild.test/"+tc.name, strings.NewReader(tc.body))
					req.Trailer, req.ContentLength = tc.tr, -1
					if resp, err := c.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range got {
			if strings.Contains(strings.ToLower(s), strings.ToLower(real2)) {
				t.Errorf("the refreshed token reached the upstream in a trailer: %s", s)
			}
		}
	})
}
