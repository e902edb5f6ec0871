package netfilter

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"
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

// auditRecs is an AuditSink that keeps what it is given.
type auditRecs struct{ recs []dlp.AuditRecord }

func (a *auditRecs) Record(recs ...dlp.AuditRecord) error {
	a.recs = append(a.recs, recs...)
	return nil
}

// TestDLPRefusedMethodAudited: a method holding a value refuses the
// request (a *DLPRefusal) and the value goes to the audit log as refused;
// a plain method passes (the twin).
func TestDLPRefusedMethodAudited(t *testing.T) {
	e, err := dlp.New(dlp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		refuse bool
	}{{dlpAWS, true}, {"PROPFIND", false}} {
		a := &auditRecs{}
		f := &DLPFilter{Engine: e, Audit: a}
		r, _ := http.NewRequest(tc.method, "https://registry.example.net/x", nil)
		_, err := f.FilterRequest(t.Context(), mitm.Destination{Name: "registry.example.net", Port: 443}, r)
		var ref *DLPRefusal
		if got := errors.As(err, &ref); got != tc.refuse {
			t.Errorf("method %.4s…: refused %v (%v), want %v", tc.method, got, err, tc.refuse)
			continue
		}
		if !tc.refuse {
			continue
		}
		if ref.Where != "method" || len(a.recs) != 1 || a.recs[0].Action != "refuse" || a.recs[0].Where != "method" || a.recs[0].Value != dlpAWS {
			t.Errorf("refusal at %q, audit %d records %+v", ref.Where, len(a.recs), a.recs)
		}
		if strings.Contains(err.Error(), dlpAWS) {
			t.Errorf("the error names the value: %v", err)
		}
	}
}
