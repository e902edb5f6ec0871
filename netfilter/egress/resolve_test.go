package egress

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseResolve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, want, err string }{
		{"api.example.com:443:127.0.0.1:8443", "api.example.com 443 127.0.0.1:8443", ""},
		{"API.Example.COM.:443:10.0.0.5", "api.example.com 443 10.0.0.5:443", ""},
		{"example.com:443:[::1]:8443", "example.com 443 [::1]:8443", ""},
		{"example.com:443:::1", "example.com 443 [::1]:443", ""},
		{"example.com", "", "no port"},
		{"example.com:443", "", "no address"},
		{"example.com:0:127.0.0.1", "", "bad port"},
		{"example.com:99999:127.0.0.1", "", "bad port"},
		{"example.com:443:not-an-ip", "", "bad address"},
		{"exa mple.com:443:127.0.0.1", "", "--resolve"},
		{"example.com:443:127.0.0.1:0", "", "bad upstream port"},
	} {
		r, err := ParseResolve(tc.spec)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if got := r.Name + " " + itoa(int(r.Port)) + " " + r.Addr.String(); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.spec, got, tc.want)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
