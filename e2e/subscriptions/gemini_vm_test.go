package subscriptions

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestGeminiToolCallVM: the real Gemini CLI runs in the VM with the
// image's node (`vibedom run --agent gemini -- -p …`), talks to the fake
// Gemini API through the proxy with a placeholder key, which the proxy
// swaps; the API scripts a write_file call, Gemini executes it in /work,
// and the file comes back through the review and apply. The API sees only
// the real key.
func TestGeminiToolCallVM(t *testing.T) {
	// The Debian-sourced test userland's own nodejs is an empty stand-in
	// (bookworm's 18 cannot run Gemini CLI): this image's is Node.js 20,
	// the official build (alpinetest.NodePin).
	reg := agentstest.ServeNPM(t, agentstest.GeminiTarball(t))
	c, bin := clitest.GuestImageHomeNode(t, "--agents", "gemini", "--registry", reg.URL)

	fake := &fakeGemini{file: "/work/made-by-gemini.txt"}
	port, caFile := clitest.ServeTLS(t, fake, "generativelanguage.googleapis.com")

	realKey := "AIzaSyREAL" + strings.Repeat("r", 29) // gitleaks:allow
	c.Env = append(c.Env, "GEMINI_API_KEY="+realKey)
	ws := clitest.SampleWorkspace(t)
	common := []string{"--preflight=off", "--allow", "127.0.0.1:*",
		"--resolve", "generativelanguage.googleapis.com:443:127.0.0.1:" + port, "--ca-file", caFile}
	stdout, stderr, code := c.RunWith(t, bin, "", append(append([]string{"run", ws, "--agent", "gemini", "--no-review"}, common...), "--", "--version")...)
	if code != 0 || !strings.Contains(stdout, "0.61.0") {
		t.Fatalf("gemini --version: exit %d\n%s\n%s", code, stdout, stderr)
	}
	stdout, stderr, code = c.RunWith(t, bin, "", append(append([]string{"run", ws, "--agent", "gemini", "--apply"}, common...),
		"--", "-p", "MAKE-THE-FILE in /work, then say done")...)
	fake.mu.Lock()
	keys, paths, toolDone := slices.Clone(fake.keys), slices.Clone(fake.paths), fake.toolDone
	fake.mu.Unlock()
	if code != 0 {
		t.Fatalf("gemini: exit %d\nrequests: %v\nstdout:\n%s\nstderr:\n%s", code, paths, stdout, stderr)
	}
	if len(keys) == 0 {
		t.Fatalf("the fake API got no request")
	}
	for i, k := range keys {
		if k != realKey {
			t.Errorf("request %d (%s): x-goog-api-key %.12q…, want the real key", i, paths[i], k)
		}
	}
	if !toolDone {
		t.Errorf("gemini never sent the tool's result back")
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-by-gemini.txt")); err != nil || string(b) != "written by the agent\n" {
		t.Errorf("the agent's file after apply: %q %v", b, err)
	}
}
