package egress

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testPolicy writes the user and workspace files and loads the four scopes.
func testPolicy(t *testing.T, user, workspace string, allow ...string) *Policy {
	t.Helper()
	dir := t.TempDir()
	cfg := PolicyConfig{
		UserFile:  filepath.Join(dir, "user.txt"),
		Workspace: &WorkspaceScope{Data: []byte(workspace), Source: filepath.Join(dir, ".vibedom", "trusted_domains.txt"), AllowApproved: true},
		Allow:     allow,
	}
	if err := os.WriteFile(cfg.UserFile, []byte(user), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyDecide(t *testing.T) {
	t.Parallel()
	user := `# the user's own file
example.com
*.wild.example
deep.example:8443
any.example:*
!blocked.wild.example
!secret.example.com          # deny beats the workspace's allow
bücher.example
UPPER.Example
dot.example.
192.0.2.7
[2001:db8::1]:443
2001:db8::2
!*.evil.example
*.evil.example
`
	workspace := `secret.example.com
api.workspace.example:443
!api.anthropic.com:80
!only443.example:443
only443.example
`
	p := testPolicy(t, user, workspace, "flag.example:9000", "!flagdeny.example")

	tests := []struct {
		name      string
		host      string
		port      uint16
		allow     bool
		rule      string
		sourceHas string
		reasonHas string
	}{
		{"builtin", "api.anthropic.com", 443, true, "api.anthropic.com:443", "builtin", ""},
		{"builtin is https only", "api.anthropic.com", 80, false, "!api.anthropic.com:80", "trusted_domains.txt:3", ""},
		{"builtin other port", "api.openai.com", 22, false, "", "", "allows other ports only"},
		{"exact default 443", "example.com", 443, true, "example.com", "user.txt:2", ""},
		{"exact default 80", "example.com", 80, true, "example.com", "user.txt:2", ""},
		{"exact other port denied", "example.com", 8080, false, "", "", "other ports"},
		{"exact does not cover subdomain", "www.example.com", 443, false, "", "", "no rule allows"},
		{"unknown name", "unknown.example", 443, false, "", "", "no rule allows this name"},
		{"wildcard one label", "a.wild.example", 443, true, "*.wild.example", "user.txt:3", ""},
		{"wildcard two labels", "a.b.wild.example", 443, true, "*.wild.example", "user.txt:3", ""},
		{"wildcard not apex", "wild.example", 443, false, "", "", "no rule"},
		{"wildcard not suffix without dot", "xwild.example", 443, false, "", "", "no rule"},
		{"wildcard deny more specific", "blocked.wild.example", 443, false, "!blocked.wild.example", "user.txt:6", ""},
		{"deny without port covers every port", "blocked.wild.example", 22, false, "!blocked.wild.example", "user.txt:6", ""},
		{"deny does not cover deeper names", "x.blocked.wild.example", 443, true, "*.wild.example", "", ""},
		{"explicit port", "deep.example", 8443, true, "deep.example:8443", "", ""},
		{"explicit port excludes defaults", "deep.example", 443, false, "", "", ""},
		{"any port", "any.example", 22, true, "any.example:*", "", ""},
		{"any port 65535", "any.example", 65535, true, "any.example:*", "", ""},
		{"port 0 never", "any.example", 0, false, "", "", "port 0"},
		{"deny wildcard beats allow wildcard", "x.evil.example", 443, false, "!*.evil.example", "", ""},
		{"deny across scopes: user deny beats workspace allow", "secret.example.com", 443, false, "!secret.example.com", "user.txt:7", ""},
		{"deny port in a later scope beats allow of the same scope", "only443.example", 443, false, "!only443.example:443", "", ""},
		{"later scope allow still works on other ports", "only443.example", 80, true, "only443.example", "", ""},
		{"workspace scope", "api.workspace.example", 443, true, "api.workspace.example:443", "trusted_domains.txt:2", ""},
		{"flag scope", "flag.example", 9000, true, "flag.example:9000", "--allow", ""},
		{"flag deny", "flagdeny.example", 443, false, "!flagdeny.example", "--allow", ""},
		{"case folded query", "EXAMPLE.com", 443, true, "example.com", "", ""},
		{"case folded rule", "upper.example", 443, true, "UPPER.Example", "", ""},
		{"trailing dot query", "example.com.", 443, true, "example.com", "", ""},
		{"trailing dot rule", "dot.example", 443, true, "dot.example.", "", ""},
		{"two trailing dots", "example.com..", 443, false, "", "", "invalid host name"},
		{"idn query unicode", "bücher.example", 443, true, "bücher.example", "", ""},
		{"idn query punycode", "xn--bcher-kva.example", 443, true, "bücher.example", "", ""},
		{"idn query upper unicode", "BÜCHER.example", 443, true, "bücher.example", "", ""},
		{"invalid name underscore", "a_b.example.com", 443, false, "", "", "invalid host name"},
		{"invalid name numeric tld", "example.123", 443, false, "", "", "numeric"},
		{"short ipv4 form", "192.0.2", 443, false, "", "", "invalid host name"},
		{"ipv4 named by rule", "192.0.2.7", 443, true, "192.0.2.7", "", ""},
		{"ipv4 mapped ipv6", "::ffff:192.0.2.7", 443, true, "192.0.2.7", "", ""},
		{"ipv4 not named", "192.0.2.8", 443, false, "", "", "no rule names this IP"},
		{"ipv6 bracketed rule", "[2001:db8::1]", 443, true, "[2001:db8::1]:443", "", ""},
		{"ipv6 bare query", "2001:db8::1", 443, true, "[2001:db8::1]:443", "", ""},
		{"ipv6 rule port only", "2001:db8::1", 80, false, "", "", "other ports"},
		{"ipv6 no port rule", "2001:db8:0::2", 80, true, "2001:db8::2", "", ""},
		{"ipv6 with zone", "fe80::1%eth0", 443, false, "", "", ""},
		{"loopback never implied", "127.0.0.1", 443, false, "", "", "no rule names this IP"},
		{"empty name", "", 443, false, "", "", "invalid host name"},
		{"name with port inside", "example.com:443", 443, false, "", "", "invalid host name"},
		{"name with space", "example.com foo", 443, false, "", "", "invalid host name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Decide(tt.host, tt.port)
			if d.Allow != tt.allow {
				t.Errorf("Decide(%q, %d).Allow: got %v, want %v (%+v)", tt.host, tt.port, d.Allow, tt.allow, d)
			}
			if tt.rule != "" && d.Rule != tt.rule {
				t.Errorf("Decide(%q, %d).Rule: got %q, want %q", tt.host, tt.port, d.Rule, tt.rule)
			}
			if !strings.Contains(d.Source, tt.sourceHas) {
				t.Errorf("Decide(%q, %d).Source: got %q, want it to contain %q", tt.host, tt.port, d.Source, tt.sourceHas)
			}
			if !strings.Contains(d.Reason, tt.reasonHas) {
				t.Errorf("Decide(%q, %d).Reason: got %q, want it to contain %q", tt.host, tt.port, d.Reason, tt.reasonHas)
			}
			if !d.Allow && tt.rule == "" && d.Rule != "" {
				t.Errorf("Decide(%q, %d): default deny names rule %q", tt.host, tt.port, d.Rule)
			}
		})
	}
}

func TestPolicyDecideName(t *testing.T) {
	t.Parallel()
	p := testPolicy(t, `example.com
!example.com:443
both.example
!both.example:443
!both.example:80
ssh.example:22
*.wild.example
!gone.wild.example
192.0.2.7:22
`, "")
	tests := []struct {
		name  string
		host  string
		allow bool
	}{
		{"builtin", "api.openai.com", true},
		{"443 denied but 80 allowed", "example.com", true},
		{"both default ports denied", "both.example", false},
		{"only a non-web port", "ssh.example", true},
		{"wildcard", "x.wild.example", true},
		{"wildcard apex", "wild.example", false},
		{"deny without port", "gone.wild.example", false},
		{"unknown", "nope.example", false},
		{"invalid", "a..b", false},
		{"ip named", "192.0.2.7", true},
		{"ip not named", "192.0.2.9", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.DecideName(tt.host); got.Allow != tt.allow {
				t.Errorf("DecideName(%q): got %+v, want allow %v", tt.host, got, tt.allow)
			}
		})
	}
}

func TestPolicyDecideAddr(t *testing.T) {
	t.Parallel()
	p := testPolicy(t, "192.0.2.7\n[2001:db8::1]:*\n*.example.com\n", "")
	tests := []struct {
		name  string
		ip    string
		port  uint16
		allow bool
	}{
		{"named v4", "192.0.2.7", 443, true},
		{"named v4 mapped", "::ffff:192.0.2.7", 80, true},
		{"named v4 wrong port", "192.0.2.7", 22, false},
		{"named v6 any port", "2001:db8::1", 22, true},
		{"unnamed", "198.51.100.1", 443, false},
		{"loopback", "127.0.0.1", 443, false},
		{"metadata", "169.254.169.254", 80, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.DecideAddr(netip.MustParseAddr(tt.ip), tt.port); got.Allow != tt.allow {
				t.Errorf("DecideAddr(%s, %d): got %+v, want allow %v", tt.ip, tt.port, got, tt.allow)
			}
		})
	}
	if got := p.DecideAddr(netip.Addr{}, 443); got.Allow {
		t.Errorf("DecideAddr(zero): allowed")
	}
}

func TestParseRulesMalformed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line, reasonHas string
	}{
		{"scheme", "https://example.com", "without a scheme"},
		{"path", "example.com/path", "without path"},
		{"two rules on a line", "a.example b.example", "one rule a line"},
		{"bare star", "*", `"*"`},
		{"star in middle", "a.*.example.com", `"*"`},
		{"star suffix", "*example.com", `"*"`},
		{"double wildcard", "*.*.example.com", `"*"`},
		{"wildcard tld", "*.com", "at least two labels"},
		{"wildcard ip", "*.192.0.2.7", "IP address"},
		{"port zero", "example.com:0", "1 to 65535"},
		{"port too big", "example.com:65536", "1 to 65535"},
		{"port empty", "example.com:", "1 to 65535"},
		{"port word", "example.com:https", "1 to 65535"},
		{"port sign", "example.com:+443", "1 to 65535"},
		{"port range", "example.com:80-90", "1 to 65535"},
		{"underscore", "a_b.example", "disallowed"},
		{"empty label", "a..example", "invalid label"},
		{"long label", strings.Repeat("a", 64) + ".example", ""},
		{"numeric tld", "example.123", "numeric"},
		{"bad ipv6", "[2001:db8::zz]:443", "not a valid IP"},
		{"unclosed bracket", "[2001:db8::1:443", "unclosed"},
		{"ipv4 in brackets", "[192.0.2.7]", "not a valid IP"},
		{"deny alone", "!", "empty"},
		{"double deny", "!!example.com", ""},
		{"userinfo", "user@example.com", "without path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := "good.example\n# comment\n\n" + tt.line + "\nother.example\n"
			rules, err := ParseRules(strings.NewReader(src), "/x/trusted_domains.txt")
			if err == nil {
				t.Fatalf("ParseRules(%q): got %d rules and no error, want an error", tt.line, len(rules))
			}
			if rules != nil {
				t.Errorf("ParseRules returned rules despite the error: %v", rules)
			}
			if !errors.Is(err, ErrMalformedRule) {
				t.Errorf("error %v does not wrap ErrMalformedRule", err)
			}
			var re *RuleError
			if !errors.As(err, &re) || re.Line != 4 || re.Source != "/x/trusted_domains.txt" {
				t.Errorf("error %v: want a RuleError at /x/trusted_domains.txt line 4, got %+v", err, re)
			}
			if !strings.Contains(err.Error(), "/x/trusted_domains.txt:4") || !strings.Contains(err.Error(), tt.reasonHas) {
				t.Errorf("error %q: want file:line and %q", err, tt.reasonHas)
			}
		})
	}
}

func TestLoadPolicyFailsClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	user := filepath.Join(dir, "user.txt")
	os.WriteFile(user, []byte("ok.example\n*.com\nexample.com:99999\n"), 0o644)
	_, err := LoadPolicy(PolicyConfig{UserFile: user, Allow: []string{"https://x.example"}})
	if err == nil {
		t.Fatal("LoadPolicy with malformed rules: got nil error")
	}
	for _, want := range []string{"user.txt:2", "user.txt:3", "--allow"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}

	t.Run("missing files are empty scopes", func(t *testing.T) {
		p, err := LoadPolicy(PolicyConfig{UserFile: filepath.Join(dir, "nope")})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(p.Rules()); got != 3 {
			t.Errorf("rules: got %d, want the 3 builtins", got)
		}
	})
	t.Run("no builtins", func(t *testing.T) {
		p, err := LoadPolicy(PolicyConfig{NoBuiltins: true})
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Decide("api.anthropic.com", 443); d.Allow {
			t.Errorf("NoBuiltins still allows the builtin: %+v", d)
		}
	})
	t.Run("unapproved workspace allows ignored, denies kept", func(t *testing.T) {
		ws := &WorkspaceScope{Data: []byte("evil.example\n*.exfil.example:*\n!api.openai.com\n"), Source: "ws/.vibedom/trusted_domains.txt"}
		p, err := LoadPolicy(PolicyConfig{Workspace: ws})
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Decide("evil.example", 443); d.Allow {
			t.Errorf("unapproved workspace allow rule applied: %+v", d)
		}
		if d := p.Decide("api.openai.com", 443); d.Allow {
			t.Errorf("workspace deny rule not applied: %+v", d)
		}
		if got := len(p.Ignored()); got != 2 {
			t.Errorf("ignored: got %d rules, want 2", got)
		}
		ws.AllowApproved = true
		p, err = LoadPolicy(PolicyConfig{Workspace: ws})
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Decide("a.exfil.example", 22); !d.Allow || len(p.Ignored()) != 0 {
			t.Errorf("approved workspace allow rule: %+v, ignored %d", d, len(p.Ignored()))
		}
	})
	t.Run("directory refused", func(t *testing.T) {
		if _, err := LoadPolicy(PolicyConfig{UserFile: dir}); err == nil {
			t.Errorf("LoadPolicy of a directory: got nil error")
		}
	})
	t.Run("huge line refused", func(t *testing.T) {
		big := filepath.Join(dir, "big.txt")
		os.WriteFile(big, []byte(strings.Repeat("a", 100000)+"\n"), 0o644)
		if _, err := LoadPolicy(PolicyConfig{UserFile: big}); err == nil {
			t.Errorf("LoadPolicy with a 100 kB line: got nil error")
		}
	})
	t.Run("bom and crlf", func(t *testing.T) {
		f := filepath.Join(dir, "crlf.txt")
		os.WriteFile(f, []byte("\ufeffcrlf.example\r\n!x.crlf.example\r\n"), 0o644)
		p, err := LoadPolicy(PolicyConfig{UserFile: f, NoBuiltins: true})
		if err != nil {
			t.Fatal(err)
		}
		if d := p.Decide("crlf.example", 443); !d.Allow {
			t.Errorf("crlf.example: got %+v, want allow", d)
		}
	})
}

func TestDisplayPath(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	if got, want := displayPath(filepath.Join(home, ".vibedom", "trusted_domains.txt")), "~/.vibedom/trusted_domains.txt"; got != want {
		t.Errorf("displayPath: got %q, want %q", got, want)
	}
	if got, want := displayPath("/etc/x"), "/etc/x"; got != want {
		t.Errorf("displayPath: got %q, want %q", got, want)
	}
}
