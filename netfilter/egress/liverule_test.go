package egress

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoMITMRule: "no-mitm HOST" names one host, matches no destination,
// and is honoured only from the user's file.
func TestNoMITMRule(t *testing.T) {
	r, err := ParseRule("no-mitm Pinned.Example.", "test")
	if err != nil || r.NoMITM() != "pinned.example" || r.Matches("pinned.example", 443) {
		t.Fatalf("no-mitm Pinned.Example.: %+v %v", r, err)
	}
	for _, bad := range []string{"no-mitm *.example.com", "no-mitm pinned.example:443", "no-mitm 192.0.2.7", "no-mitm https://x.example", "no-mitm "} {
		if _, err := ParseRule(bad, "test"); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	dir := t.TempDir()
	user := filepath.Join(dir, "trusted_domains.txt")
	os.WriteFile(user, []byte("pinned.example\nno-mitm pinned.example\n"), 0o600)
	p, err := LoadPolicy(PolicyConfig{UserFile: user})
	if err != nil || len(p.NoMITM()) != 1 || p.NoMITM()[0] != "pinned.example" || !p.Decide("pinned.example", 443).Allow {
		t.Fatalf("user file: %v %v", p.NoMITM(), err)
	}
	if _, err := LoadPolicy(PolicyConfig{Workspace: &WorkspaceScope{Data: []byte("no-mitm pinned.example\n"), Source: "ws", AllowApproved: true}}); err == nil ||
		!strings.Contains(err.Error(), "never from the workspace") {
		t.Errorf("workspace no-mitm: %v", err)
	}
	if _, err := LoadPolicy(PolicyConfig{Allow: []string{"no-mitm pinned.example"}}); err == nil || !strings.Contains(err.Error(), "--no-mitm pinned.example") {
		t.Errorf("--allow no-mitm: %v", err)
	}
}

func TestGuardedAddr(t *testing.T) {
	for _, c := range []struct {
		addr    string
		private []netip.Prefix
		ok      bool
	}{
		{"93.184.216.34", nil, true},
		{"127.0.0.1", nil, false},
		{"169.254.169.254", nil, false},
		{"::1", nil, false},
		{"10.1.2.3", nil, false},
		{"10.1.2.3", []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, true},
		{"0.0.0.0", nil, false},
	} {
		if err := GuardedAddr(netip.MustParseAddr(c.addr), c.private); (err == nil) != c.ok {
			t.Errorf("%s (%v): %v", c.addr, c.private, err)
		}
	}
}
