package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// TestVersionJSON runs `vibedom version --json` and checks every pin is
// the one the code pins (not a copy that can drift).
func TestVersionJSON(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	stdout, stderr, code := c.Run(t, "", "version", "--json")
	if code != 0 {
		t.Fatalf("version --json: exit %d: %s", code, stderr)
	}
	var v versionInfo
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("version --json: %v\n%s", err, stdout)
	}
	if v.Version == "" || !strings.HasPrefix(v.Go, "go") || !strings.Contains(v.Platform, "/") {
		t.Errorf("version %q, go %q, platform %q", v.Version, v.Go, v.Platform)
	}
	if v.Pins.Alpine != alpine.Branch {
		t.Errorf("alpine %q, want %q", v.Pins.Alpine, alpine.Branch)
	}
	if v.Pins.Mitmproxy != mitmproxy.Release {
		t.Errorf("mitmproxy %q, want %q", v.Pins.Mitmproxy, mitmproxy.Release)
	}
	if !strings.HasPrefix(v.Pins.Gitleaks, "v8.") {
		t.Errorf("gitleaks %q, want the linked v8 module's version", v.Pins.Gitleaks)
	}
	for _, p := range agents.Pins {
		if !slices.Contains(v.Pins.Agents[p.Agent], p.Version) {
			t.Errorf("agents[%s] = %v, want it to hold %s", p.Agent, v.Pins.Agents[p.Agent], p.Version)
		}
	}
	text, _, _ := c.Run(t, "", "version")
	for _, want := range []string{"alpine       " + alpine.Branch, "mitmproxy    " + mitmproxy.Release, "gitleaks     v8."} {
		if !strings.Contains(text, want) {
			t.Errorf("version output lacks %q:\n%s", want, text)
		}
	}
}
