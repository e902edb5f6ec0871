package dlp

import (
	"strings"
	"testing"
)

// TestInternalHostsAndULA: internal host names and IPv6 unique local
// addresses are redacted where internal addresses are (external and
// public destinations); look-alikes pass untouched.
func TestInternalHostsAndULA(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{})
	for _, tc := range []struct{ text, value string }{
		{"DB_HOST=db1.prod.internal\n", "db1.prod.internal"},
		{"curl http://build.corp:8080/api", "build.corp"},
		{`{"printer":"laser-3.LOCAL"}`, "laser-3.LOCAL"},
		{"ssh git.eng.corp", "git.eng.corp"},
		{"nas at http://nas.lan:5000/", "nas.lan"},
		{"addr fd12:3456:789a:1::1 up", "fd12:3456:789a:1::1"},
		{"[FD00::5]:443", "FD00::5"},
	} {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			out, rep := scrubText(t, e, class, tc.text)
			if strings.Contains(out, tc.value) || !strings.Contains(out, "[REDACTED:INTERNAL_IP]") {
				t.Errorf("%v: %q -> %q (%v)", class, tc.text, out, rep.Findings())
			}
		}
		if out, _ := scrubText(t, e, ClassInternal, tc.text); out != tc.text {
			t.Errorf("internal: %q -> %q", tc.text, out)
		}
	}
	for _, in := range []string{
		"http://localhost:3000/ and 127.0.0.1",
		"import golang.org/x/tools/internal/event",
		"the .internal suffix, a .corporate site, x.localhost",
		"metadata.internal.example.com",
		"var my_var.local = 1; ${HOST}.local",
		"addr 2001:db8::1 and fe80::1 and fd is a flag; fdfd:",
		"hash fd12ab34:",
		"a plan, a clan. .lan is a suffix; x.lane y.landing",
	} {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			if out, rep := scrubText(t, e, class, in); out != in {
				t.Errorf("%v: %q -> %q (%v)", class, in, out, rep.Findings())
			}
		}
	}
}
