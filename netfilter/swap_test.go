package netfilter

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/dlp"
)

// swapFixture builds an Anthropic-style key and placeholder from two
// four-letter stems (at run time: the project's secrets scan stays quiet)
// and a DLP engine that knows both.
func swapFixture(t *testing.T, realStem, phStem string) (real, ph string, eng *dlp.Engine) {
	t.Helper()
	real = "sk-ant-api03-" + strings.Repeat(realStem, 20) + "AA" // gitleaks:allow
	ph = "sk-ant-api03-" + strings.Repeat(phStem, 20) + "BB"     // gitleaks:allow
	eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real, Source: "host key"}, {Value: ph, Source: "placeholder"}}})
	if err != nil {
		t.Fatal(err)
	}
	return real, ph, eng
}

// TestCredentialSwap: the guest has only a placeholder; the proxy puts the
// real key in the provider's auth header on requests to the provider's
// host, and nowhere else. Real HTTP clients through the real MITM, with the
// real DLP inside.
func TestCredentialSwap(t *testing.T) {
	t.Parallel()
	real, ph, eng := swapFixture(t, "R3al", "PhXx")
	filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "anthropic", Host: "api.test", Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})
	forEngines(t, func(t *testing.T, kind string) {
		testCredentialSwap(t, kind, filter, eng, real, ph)
	})
}

func testCredentialSwap(t *testing.T, kind string, filter mitm.RequestFilter, eng *dlp.Engine, real, ph string) {
	for _, h2 := range []bool{false, true} {
		name := "http1"
		if h2 {
			name = "http2"
		}
		t.Run(name, func(t *testing.T) {
			v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
			// As a session does: logs go through the DLP's known values,
			// the placeholder among them.
			v.log.SetRedactor(logredact.LogRedactor(eng))
			var mu sync.Mutex
			seen := map[string][]string{} // host -> x-api-key values, bodies
			record := func(host string) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/echo" {
						// A provider echoing the key: in a header, and in the
						// body cut in the middle of the key across flushes.
						k := r.Header.Get("X-Api-Key")
						w.Header().Set("X-Echo", "key="+k)
						io.WriteString(w, "before "+k[:30])
						w.(http.Flusher).Flush()
						io.WriteString(w, k[30:]+" after")
						return
					}
					b, _ := io.ReadAll(r.Body)
					mu.Lock()
					seen[host] = append(seen[host], r.Header.Get("X-Api-Key")+"|"+r.Header.Get("X-Other")+"|"+string(b))
					mu.Unlock()
					io.WriteString(w, "ok")
				})
			}
			v.UpstreamTLS("api.test", 443, v.UpCA, record("api.test"))
			v.UpstreamTLS("x.wild.test", 443, v.UpCA, record("x.wild.test"))
			c := &http.Client{Transport: v.GuestTransport(h2)}
			send := func(url string, hdr map[string][]string, body string) int {
				req, _ := http.NewRequest("POST", url, strings.NewReader(body))
				for k, vs := range hdr {
					for _, x := range vs {
						req.Header.Add(k, x)
					}
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", url, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			// The one place: swapped, and the DLP left the real key alone.
			if code := send("https://api.test/v1/messages", map[string][]string{"x-api-key": {ph}}, `{"q":"hi"}`); code != 200 {
				t.Fatalf("swap: status %d", code)
			}
			mu.Lock()
			got := seen["api.test"]
			mu.Unlock()
			if len(got) != 1 || got[0] != real+"||"+`{"q":"hi"}` {
				t.Fatalf("the API saw %q, want the real key", got)
			}
			refused := []struct {
				name string
				url  string
				hdr  map[string][]string
			}{
				{"another allowed host", "https://x.wild.test/v1", map[string][]string{"x-api-key": {ph}}},
				{"another header", "https://api.test/v1", map[string][]string{"X-Other": {ph}}},
				{"bearer to the x-api-key host", "https://api.test/v1", map[string][]string{"Authorization": {"Bearer " + ph}}},
				{"duplicate header", "https://api.test/v1", map[string][]string{"x-api-key": {ph, ph}}},
				{"decorated value", "https://api.test/v1", map[string][]string{"x-api-key": {"k=" + ph}}},
				{"in the query", "https://api.test/v1?key=" + ph, nil},
				{"in the path", "https://api.test/v1/" + ph, nil},
				{"another port", "https://api.test:8443/v1", map[string][]string{"x-api-key": {ph}}},
			}
			for _, r := range refused {
				if code := send(r.url, r.hdr, "x"); code != http.StatusForbidden {
					t.Errorf("%s: status %d, want 403", r.name, code)
				}
			}
			// A response echoing the real key reaches the guest scrubbed.
			req, _ := http.NewRequest("GET", "https://api.test/echo", nil)
			req.Header.Set("x-api-key", ph)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), real) || strings.Contains(resp.Header.Get("X-Echo"), real) ||
				string(body) != "before "+RedactedSecret+" after" {
				t.Errorf("echoed key reached the guest: body %q header %q", body, resp.Header.Get("X-Echo"))
			}
			// Split over two headers: neither part is the placeholder, so
			// nothing is swapped (the API sees the fragments, never the key).
			send("https://api.test/v1", map[string][]string{"x-api-key": {ph[:20]}, "X-Api-Key-2": {ph[20:]}}, "split")
			mu.Lock()
			last := seen["api.test"][len(seen["api.test"])-1]
			seen["api.test"] = seen["api.test"][:len(seen["api.test"])-1]
			mu.Unlock()
			if strings.Contains(last, real) || !strings.HasPrefix(last, ph[:20]+"|") {
				t.Errorf("split placeholder: the API saw %q", last)
			}
			// In a body: not swapped; the DLP scrubs it.
			send("https://x.wild.test/v1", nil, "leak "+ph+" end")
			mu.Lock()
			other := strings.Join(seen["x.wild.test"], "\n")
			all := strings.Join(seen["api.test"][1:], "\n")
			mu.Unlock()
			if strings.Contains(other, ph) || strings.Contains(other, real) || !strings.Contains(other, "leak ") {
				t.Errorf("another host saw: %q", other)
			}
			if all != "" {
				t.Errorf("refused requests reached the API: %q", all)
			}
			v.Events.Wait(t, "placeholder alert", func(e egress.Event) bool {
				return e.Decision == "deny" && strings.Contains(e.Reason, "credential placeholder")
			})
			// Nothing logged holds the key or the placeholder.
			files, _ := filepath.Glob(filepath.Join(v.logDir, "*"))
			for _, f := range files {
				b, _ := os.ReadFile(f)
				if strings.Contains(string(b), real) || strings.Contains(string(b), ph) {
					t.Errorf("%s holds the key or the placeholder", f)
				}
			}
		})
	}
}

// TestCredentialSwapTrailers: a placeholder in a request trailer is never
// swapped; as one in any header but the swap's, it refuses the request
// (in a value or a name, a body scrubbed whole or streamed, HTTP/1 and
// HTTP/2), so upstream never gets it, not even scrubbed; a trailer
// without one passes beside a swap.
func TestCredentialSwapTrailers(t *testing.T) {
	t.Parallel()
	real, ph, eng := swapFixture(t, "R3al", "PhXx")
	filter := NewSwapFilter(&DLPFilter{Engine: eng, BufferLimit: 64}, []credentials.Swap{{Name: "anthropic", Host: "api.test", Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		var mu sync.Mutex
		var seen []string // what upstream got: key | trailers | body
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s|%v|%s|%v", r.Header.Get("X-Api-Key"), r.Trailer, b, err))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			send := func(t *testing.T, body string, tr http.Header) int {
				t.Helper()
				req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://api.test/v1/messages/"+t.Name(), strings.NewReader(body))
				req.Header.Set("X-Api-Key", ph)
				req.Trailer, req.ContentLength = tr, -1 // chunked: HTTP/1 sends trailers only then
				resp, err := c.Do(req)
				if err != nil {
					return 0 // aborted
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			proto := map[bool]string{false: "http1", true: "h2"}[h2]
			long := strings.Repeat("streamed past the buffer limit\n", 8)
			for _, c := range []struct {
				name, body string
				tr         http.Header
			}{
				{"value", "short", http.Header{"X-Late": {"k=" + ph}}},
				{"value-streamed", long, http.Header{"X-Late": {ph}}},
				{"name", "short", http.Header{"X-" + ph: {"v"}}},
			} {
				t.Run(proto+"/"+c.name, func(t *testing.T) {
					mu.Lock()
					before := len(seen)
					mu.Unlock()
					code := send(t, c.body, c.tr)
					if code == 200 {
						t.Errorf("status 200, want the request refused")
					}
					mu.Lock()
					got := seen[before:]
					mu.Unlock()
					for _, s := range got {
						if strings.Contains(s, "PhXx") || strings.Contains(s, "REDACTED") || strings.Contains(s, "<nil>") && strings.Contains(s, "X-Late") {
							t.Errorf("upstream got the trailer: %q", s)
						}
					}
				})
			}
			t.Run(proto+"/plain", func(t *testing.T) {
				if code := send(t, "short", http.Header{"X-Plain": {"fine"}}); code != 200 {
					t.Fatalf("status %d", code)
				}
				mu.Lock()
				last := seen[len(seen)-1]
				mu.Unlock()
				if want := real + "|map[X-Plain:[fine]]|short|<nil>"; last != want {
					t.Errorf("upstream got %q, want %q", last, want)
				}
			})
		}
		// An alert each: refused (403) when the trailer is known before the
		// head goes out, else aborted, with a finding.
		v.Events.Wait(t, "placeholder in a trailer's name", func(e egress.Event) bool {
			return e.Decision == "deny" && strings.Contains(e.Reason, "credential placeholder") && strings.Contains(e.Reason, "in a trailer's name")
		})
		late := v.Events.WaitCount(t, "placeholder in a trailer's value", 4, func(e egress.Event) bool {
			return egress.IsAlert(e) && strings.Contains(e.Reason, "credential placeholder") && strings.Contains(e.Reason, "in trailer x-late")
		})
		for _, e := range late {
			if e.Decision != "deny" && (len(e.Findings) != 1 || e.Findings[0].Category != "PLACEHOLDER") {
				t.Errorf("an aborted request: %s %s %+v", e.URL, e.Decision, e.Findings)
			}
		}
	})
}
