package netfilter

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter/egress"
)

// TestConformanceDLPRefusedAudit: a request refused for a value in a header
// that frames the message was not sent, and the audit log says so (action
// "refuse", not "redact"); the same value in another header of a request
// that goes out is recorded as redacted (the twin). Both engines.
func TestConformanceDLPRefusedAudit(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newDLPEnvEngine(t, kind, 0)
		c := &http.Client{Transport: v.GuestTransport(false)}
		send := func(hdr, val string) int {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://registry.example.net/x", strings.NewReader("hello"))
			req.Header.Set("Content-Type", "text/plain")
			req.Header.Set(hdr, val)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := send("Content-Type", "text/plain; x="+dlpAWS); code != http.StatusForbidden {
			t.Errorf("framing header: status %d, want 403", code)
		}
		if code := send("X-Note", dlpAWS); code != 200 {
			t.Errorf("twin: status %d, want 200", code)
		}
		v.Events.WaitCount(t, "both requests", 2, func(e egress.Event) bool { return e.Kind == "request" && e.Name == "registry.example.net" })
		f, err := os.Open(v.audit)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got := map[string]string{}
		if err := dlp.ReadAuditLog(f, func(r dlp.AuditRecord) error { got[r.Where] = r.Action + " " + r.Category; return nil }, v.id); err != nil {
			t.Fatal(err)
		}
		if got["header:Content-Type"] != "refuse CLOUD_KEY" || got["header:X-Note"] != "redact CLOUD_KEY" {
			t.Errorf("audit actions %v, want refuse in Content-Type, redact in X-Note", got)
		}
	})
}
