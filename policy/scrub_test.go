package policy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
)

// TestScrubRefusedHeader: vibedom scrub reports a value in a header that
// frames the message (which the proxy does not rewrite) as what the proxy
// does with it, refuse, not as a redaction; the same value in another
// header (the twin) is redacted.
func TestScrubRefusedHeader(t *testing.T) {
	aws := j("AKIA", "Z7QX3M4P2KD9WLNB")
	tests := []struct {
		name, header, where string
		action              dlp.Action
		redacted, refused   int
		summary, note       string
	}{
		{"framing header", "Content-Type: text/plain; x=" + aws, "header:Content-Type", dlp.Refuse, 0, 1, "1 refused (CLOUD_KEY)", "the proxy refuses this request"},
		{"another header", "X-Note: " + aws, "header:X-Note", dlp.Redact, 1, 0, "1 redacted (CLOUD_KEY)", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			r, err := Scrub(t.Context(), ScrubOptions{Home: home.Home(t.TempDir()), Dest: "registry.example.net",
				Headers: []string{tc.header}, Body: strings.NewReader("hello"), Out: &out})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Findings) != 1 {
				t.Fatalf("findings %v, want one", r.Findings)
			}
			f := r.Findings[0]
			if f.Action != tc.action || f.Category != dlp.CatCloudKey || f.Where != tc.where {
				t.Errorf("finding %v, want %v CLOUD_KEY in %s", f, tc.action, tc.where)
			}
			if r.Redacted != tc.redacted || r.Refused != tc.refused || r.Logged != 0 {
				t.Errorf("redacted %d refused %d logged %d, want %d %d 0", r.Redacted, r.Refused, r.Logged, tc.redacted, tc.refused)
			}
			if !strings.HasPrefix(r.Summary, tc.summary) {
				t.Errorf("summary %q, want %q…", r.Summary, tc.summary)
			}
			if notes := strings.Join(r.Notes, "\n"); tc.note != "" && !strings.Contains(notes, tc.note) {
				t.Errorf("notes %q, want one saying %q", notes, tc.note)
			}
			b, _ := json.Marshal(r)
			if want := `"action":"` + tc.action.String() + `"`; !bytes.Contains(b, []byte(want)) || bytes.Contains(b, []byte(aws)) {
				t.Errorf("json report %s: want %s and no value", b, want)
			}
			if out.String() != "hello" {
				t.Errorf("body %q", out.String())
			}
		})
	}
}

// TestFindingOf: a logged finding keeps the action the proxy took.
func TestFindingOf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want dlp.Action
	}{{"refuse", dlp.Refuse}, {"redact", dlp.Redact}, {"log", dlp.Log}, {"pass", dlp.Pass}, {"something new", dlp.Redact}} {
		if got := findingOf(nfegress.Finding{Category: "CLOUD_KEY", Action: tc.in}); got.Action != tc.want || got.Category != dlp.CatCloudKey {
			t.Errorf("%q: got %v %v, want %v CLOUD_KEY", tc.in, got.Action, got.Category, tc.want)
		}
	}
}
