package dlp

import (
	"strings"
	"testing"
)

// TestDodgedEmails: addresses spelled out to dodge a scanner are redacted
// where e-mail addresses are; English that merely holds "at" and "dot",
// example domains and file names pass untouched.
func TestDodgedEmails(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	for _, tc := range []struct{ text, value string }{
		{"write to jane.doe at acme-corp dot com today", "jane.doe at acme-corp dot com"},
		{"mail: jane.doe[at]acme-corp[.]com", "jane.doe[at]acme-corp[.]com"},
		{"jane (at) mail (dot) acme (dot) io", "jane (at) mail (dot) acme (dot) io"},
		{"contact JANE [AT] ACME [DOT] COM", "JANE [AT] ACME [DOT] COM"},
		{`{"to":"bob{at}shop.co.uk"}`, "bob{at}shop.co.uk"},
	} {
		out, rep := scrubText(t, e, ClassPublic, tc.text)
		if strings.Contains(out, tc.value) || !strings.Contains(out, "[REDACTED:EMAIL]") {
			t.Errorf("%q -> %q (%v)", tc.text, out, rep.Findings())
		}
	}
	for _, in := range []string{
		"look at github.com and at golang.org",
		"meet at noon, dot the i's",
		"jane at example dot com",
		"logo[at]2x dot png",
		"x = a.at(b) + c.dot(d)",
		"the job runs at 10 dot 30",
	} {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, in); out != in {
				t.Errorf("%v: %q -> %q (%v)", class, in, out, rep.Findings())
			}
		}
	}
}
