package netfilter

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"github.com/vibedom/vibedom/netfilter/egress"
)

// TestNoMITMPinnedClient: a client that pins its server's certificate (it
// trusts only the upstream's CA, never vibedom's) works to a no-mitm name
// on both engines, and the log marks the connection uninspected; an SNI
// that is missing or names another host is refused; other names are
// intercepted as ever.
func TestNoMITMPinnedClient(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newEngineEnv(t, kind, mitmtest.Rules+"pinned.test\n", func(c *mitm.EngineConfig) { c.NoMITM = []string{"pinned.test"} })
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "real %s", r.Host) })
		v.UpstreamTLS("pinned.test", 443, v.UpCA, h)
		v.UpstreamTLS("api.test", 443, v.UpCA, h)
		pinned := x509.NewCertPool()
		pinned.AddCert(v.UpCA.Certificate())

		conn := v.GuestConn("pinned.test", 443)
		defer conn.Close()
		tc := tls.Client(conn, &tls.Config{ServerName: "pinned.test", RootCAs: pinned})
		if err := tc.HandshakeContext(t.Context()); err != nil {
			t.Fatalf("a pinned client's handshake through no-mitm: %v", err)
		}
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: pinned.test\r\nConnection: close\r\n\r\n")
		body, _ := io.ReadAll(tc)
		if !strings.Contains(string(body), "real pinned.test") {
			t.Errorf("through no-mitm: %q", body)
		}
		tc.Close()
		v.Events.Wait(t, "uninspected connect", func(e egress.Event) bool {
			return e.Kind == "connect" && e.Name == "pinned.test" && e.Decision == "allow" && e.Reason == mitm.NoMITMReason
		})

		for _, sni := range []string{"", "api.test"} {
			conn := v.GuestConn("pinned.test", 443)
			tc := tls.Client(conn, &tls.Config{ServerName: sni, RootCAs: pinned, InsecureSkipVerify: sni == ""})
			if err := tc.HandshakeContext(t.Context()); err == nil {
				t.Errorf("SNI %q to a no-mitm name: the handshake went through", sni)
			}
			conn.Close()
		}

		// Another name is still intercepted: the pinned client refuses
		// vibedom's certificate.
		conn = v.GuestConn("api.test", 443)
		defer conn.Close()
		tc = tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: pinned})
		if err := tc.HandshakeContext(t.Context()); err == nil {
			t.Error("api.test was not intercepted")
		}
	})
}
