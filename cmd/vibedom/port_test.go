package main

import (
	"strings"
	"testing"
)

// TestPortCommandRefusals: a stopped session, a privileged port and a bad
// spec each end `vibedom port` with exit 2 (one line on stderr).
func TestPortCommandRefusals(t *testing.T) {
	changesFixture(t) // one stopped session, ws-0001
	for _, args := range [][]string{
		{"port", "ws-0001", "add", "3000"},
		{"port", "ws-0001", "list"},
		{"port", "ws-0001", "add", "80"},
		{"port", "ws-0001", "add", "x:y:z:w"},
		{"port", "ws-0001", "open", "3000"},
		{"port", "ws-0001"},
	} {
		if code, out := capture(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2; output:\n%s", args, code, out)
		}
	}
}

// TestPortExposedWarns: a port named on an address beyond loopback
// (0.0.0.0, [::], an IPv4-mapped any) is published with a warning; one on
// loopback is not.
func TestPortExposedWarns(t *testing.T) {
	for spec, warn := range map[string]bool{
		"0.0.0.0:8080:80": true, "[::]:8080:80": true, "[::ffff:0.0.0.0]:8080:80": true,
		"8080:80": false, "[::1]:8080:80": false, "localhost:8080:80": false,
	} {
		var b strings.Builder
		if _, err := parsePort(spec, &b); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if got := strings.Contains(b.String(), "warning"); got != warn {
			t.Errorf("%s: warned %v, want %v (%q)", spec, got, warn, b.String())
		}
	}
}
