package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"

	"context"
	"io"
	"net/http"
	"sync"
	"testing"
)

var mitmdumpCheck struct {
	once sync.Once
	err  error
}

// skipWithoutMitmdump skips a mitmproxy-engine test, with the reason, when
// no supported mitmdump is installed.
func skipWithoutMitmdump(t testing.TB) {
	t.Helper()
	mitmdumpCheck.once.Do(func() { _, mitmdumpCheck.err = mitmproxy.MitmdumpVersion(context.Background(), "") })
	if mitmdumpCheck.err != nil {
		t.Skipf("mitmproxy engine not tested: %v", mitmdumpCheck.err)
	}
}

var engineKinds = []string{"go", "mitmproxy"}

// forEngines runs f once per engine, as the subtests engine=go and
// engine=mitmproxy.
func forEngines(t *testing.T, f func(t *testing.T, kind string)) {
	for _, k := range engineKinds {
		t.Run("engine="+k, func(t *testing.T) { f(t, k) })
	}
}

func getBody(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestConformanceHTTPVersions(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules)
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(echoInfo))
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			for range 3 {
				resp, body := getBody(t, c, "https://api.test/hello?x=1")
				if resp.StatusCode != 200 || body != "hello from api.test /hello?x=1" {
					t.Fatalf("h2=%v: got %d %q", h2, resp.StatusCode, body)
				}
				if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
					t.Errorf("guest protocol %s, want major %d", resp.Proto, want)
				}
			}
		}
	})
}
