package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestAuthLoginCLI: `auth import` takes the host CLI's login, `auth list`
// shows it without a token, `auth rm` forgets it; damaged or missing
// files and an agent without a login of its own give one-line errors
// that say what to run.
func TestAuthLoginCLI(t *testing.T) {
	c := clitest.New(t)
	hd := t.TempDir()
	c.Env = append(c.Env, "HOME="+hd, "USER=tester", "PATH=/nonexistent", "CLAUDE_CONFIG_DIR=", "CODEX_HOME=",
		"ANTHROPIC_API_KEY=", "OPENAI_API_KEY=")
	access := "sk-ant-oat01-" + strings.Repeat("Ab3_", 23) + "xyz"  // gitleaks:allow
	refresh := "sk-ant-ort01-" + strings.Repeat("Zq9-", 23) + "uvw" // gitleaks:allow
	doc, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{"accessToken": access, "refreshToken": refresh,
		"expiresAt": time.Now().Add(time.Hour).UnixMilli(), "scopes": []string{"user:inference"}, "subscriptionType": "max"}})
	cred := filepath.Join(hd, ".claude", ".credentials.json")
	os.MkdirAll(filepath.Dir(cred), 0o700)

	oneLine := func(args []string, want ...string) {
		t.Helper()
		_, stderr, code := c.Run(t, "", args...)
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d %q", args, code, stderr)
		}
		for _, w := range want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: %q does not say %q", args, stderr, w)
			}
		}
		if strings.Contains(stderr, access[13:]) || strings.Contains(stderr, refresh[13:]) {
			t.Errorf("%v: the error holds a token", args)
		}
	}
	oneLine([]string{"auth", "import", "claude"}, "vibedom auth login claude")
	oneLine([]string{"auth", "import", "gemini"}, "claude, codex")
	oneLine([]string{"auth", "login", "claude"}, "not installed", "vibedom auth import claude")
	os.WriteFile(cred, doc[:len(doc)/2], 0o600)
	oneLine([]string{"auth", "import", "claude"}, cred, "damaged")

	os.WriteFile(cred, doc, 0o600)
	stdout, stderr, code := c.Run(t, "", "auth", "import", "claude")
	if code != 0 || !strings.Contains(stdout, "Imported the claude subscription login (max") {
		t.Fatalf("import: %d %s %s", code, stdout, stderr)
	}
	stdout, _, code = c.Run(t, "", "auth", "list", "--json")
	var rows []struct {
		Name, Provider, Kind, Fingerprint, Plan string
		Expires                                 *time.Time
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &rows) != nil || len(rows) != 1 || rows[0].Kind != "subscription" ||
		rows[0].Provider != "anthropic" || rows[0].Expires == nil || rows[0].Plan != "max" {
		t.Fatalf("auth list --json: %d %s", code, stdout)
	}
	text, _, _ := c.Run(t, "", "auth", "list")
	for _, out := range []string{stdout, text} {
		if strings.Contains(out, access[13:30]) || strings.Contains(out, refresh[13:30]) {
			t.Errorf("auth list shows a token:\n%s", out)
		}
	}
	if !strings.Contains(text, "subscription (claude login, max)") {
		t.Errorf("auth list: %s", text)
	}
	// A damaged stored login says what to run (run refuses it the same
	// way: session's TestCheckAgentKeyLogin).
	stored := filepath.Join(c.Home, "credentials", "claude.login")
	os.WriteFile(stored, []byte("{"), 0o600)
	_, stderr, _ = c.Run(t, "", "auth", "list")
	if !strings.Contains(stderr, "vibedom auth import claude") {
		t.Errorf("list with a damaged login: %q", stderr)
	}

	if _, stderr, code := c.Run(t, "", "auth", "rm", "claude"); code != 0 {
		t.Fatalf("rm: %s", stderr)
	}
	if _, err := os.Stat(stored); !os.IsNotExist(err) {
		t.Errorf("rm left %s", stored)
	}
	if stdout, _, _ := c.Run(t, "", "auth", "list"); !strings.Contains(stdout, "No API keys or subscription logins") {
		t.Errorf("after rm: %s", stdout)
	}
}
