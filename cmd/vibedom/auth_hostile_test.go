package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestAuthImportHostileFile (issue 21, adversarial): `auth import` refuses
// a credentials file that is a symlink, a FIFO (without waiting on it) or
// huge, with a one-line error; a plan name holding terminal escapes or a
// newline is printed escaped by `auth import` and `auth list`.
func TestAuthImportHostileFile(t *testing.T) {
	c := clitest.New(t)
	hd := t.TempDir()
	c.Env = append(c.Env, "HOME="+hd, "USER=tester", "PATH=/nonexistent", "CLAUDE_CONFIG_DIR=", "CODEX_HOME=",
		"ANTHROPIC_API_KEY=", "OPENAI_API_KEY=")
	access := "sk-ant-oat01-" + strings.Repeat("Ab3_", 23) + "xyz"  // gitleaks:allow
	refresh := "sk-ant-ort01-" + strings.Repeat("Zq9-", 23) + "uvw" // gitleaks:allow
	doc := func(plan string) []byte {
		b, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{"accessToken": access, "refreshToken": refresh,
			"expiresAt": time.Now().Add(time.Hour).UnixMilli(), "scopes": []string{"user:inference"}, "subscriptionType": plan}})
		return b
	}
	cred := filepath.Join(hd, ".claude", ".credentials.json")
	os.MkdirAll(filepath.Dir(cred), 0o700)
	elsewhere := filepath.Join(hd, "elsewhere.json")
	os.WriteFile(elsewhere, doc("max"), 0o600)

	for _, c2 := range []struct {
		name string
		make func() error
	}{
		{"symlink", func() error { return os.Symlink(elsewhere, cred) }},
		{"fifo", func() error { return syscall.Mkfifo(cred, 0o600) }},
		{"huge", func() error {
			return os.WriteFile(cred, append(doc("max")[:10], []byte(strings.Repeat(" ", 8<<20))...), 0o600)
		}},
	} {
		os.Remove(cred)
		if err := c2.make(); err != nil {
			t.Fatal(err)
		}
		_, stderr, code := c.Run(t, "", "auth", "import", "claude")
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, cred) {
			t.Errorf("%s: exit %d %q", c2.name, code, stderr)
		}
	}
	os.Remove(cred)
	os.WriteFile(cred, doc("max\x1b]0;pwned\x07\nFAKE LINE"), 0o600)
	stdout, stderr, code := c.Run(t, "", "auth", "import", "claude")
	list, _, _ := c.Run(t, "", "auth", "list")
	for _, out := range []string{stdout + stderr, list} {
		if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\nFAKE LINE") {
			t.Errorf("a terminal escape or a forged line printed (exit %d): %q", code, out)
		}
	}
}
