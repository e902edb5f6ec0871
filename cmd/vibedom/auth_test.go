package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

func TestAuthCLI(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	key := "sk-ant-api03-" + strings.Repeat("Kk9", 20) // gitleaks:allow
	if _, stderr, code := c.Run(t, key+"\n", "auth", "set", "anthropic"); code != 0 {
		t.Fatalf("auth set: %d %s", code, stderr)
	}
	stdout, _, code := c.Run(t, "", "auth", "list", "--json")
	var rows []struct{ Provider, Source, Fingerprint string }
	if code != 0 || json.Unmarshal([]byte(stdout), &rows) != nil || len(rows) != 1 || rows[0].Provider != "anthropic" {
		t.Fatalf("auth list: %d %s", code, stdout)
	}
	if strings.Contains(stdout, key) {
		t.Error("auth list shows the key")
	}
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"auth", "set", "mistral"}, key + "\n", "anthropic, openai, gemini"},
		{[]string{"auth", "set", "openai"}, "\n", "empty"},
		{[]string{"auth", "set"}, "", "name one provider"},
	} {
		_, stderr, code := c.Run(t, tc.stdin, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%v: exit %d %q", tc.args, code, stderr)
		}
	}
	if _, _, code := c.Run(t, "", "auth", "rm", "anthropic"); code != 0 {
		t.Error("auth rm")
	}
	if stdout, _, _ := c.Run(t, "", "auth", "list"); !strings.Contains(stdout, "No API keys") {
		t.Errorf("after rm: %s", stdout)
	}
}
