package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"

	"net/http"
	"testing"
)

// mitmdumpProbe skips a mitmproxy-engine test, mitmwebProbe a live-view
// test, with the reason, when no supported mitmdump (mitmweb) is installed.
var (
	mitmdumpProbe = nftest.VersionProbe("mitmproxy engine not tested", mitmproxy.MitmdumpVersion)
	mitmwebProbe  = nftest.VersionProbe("live view not tested", mitmproxy.MitmwebVersion, mitmdumpProbe)
)

var engineKinds = []string{"go", "mitmproxy"}

// forEngines runs f once per engine, as the subtests engine=go and
// engine=mitmproxy.
func forEngines(t *testing.T, f func(t *testing.T, kind string)) {
	for _, k := range engineKinds {
		t.Run("engine="+k, func(t *testing.T) { f(t, k) })
	}
}

func TestConformanceHTTPVersions(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules)
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
		for _, h2 := range []bool{false, true} {
			c := &http.Client{Transport: v.GuestTransport(h2)}
			for range 3 {
				resp, body := mitmtest.GetBody(t, c, "https://api.test/hello?x=1")
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
