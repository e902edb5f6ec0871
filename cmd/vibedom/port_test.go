package main

import "testing"

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
