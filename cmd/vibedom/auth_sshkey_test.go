package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestAuthSSHKey: `vibedom auth ssh-key` makes the deploy key once (0600)
// and prints its public half, the same every time; --json too.
func TestAuthSSHKey(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	stdout, stderr, code := c.Run(t, "", "auth", "ssh-key")
	if code != 0 || !strings.HasPrefix(stdout, "ssh-ed25519 ") || strings.Count(stdout, "\n") != 1 || !strings.Contains(stderr, "Made a deploy key") {
		t.Fatalf("auth ssh-key: exit %d\n%s\n%s", code, stdout, stderr)
	}
	priv := filepath.Join(c.Home, "keys", "id_ed25519_vibedom")
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key: %v %v", fi, err)
	}
	pub, _ := os.ReadFile(priv + ".pub")
	if strings.TrimSpace(string(pub)) != strings.TrimSpace(stdout) {
		t.Errorf(".pub %q, printed %q", pub, stdout)
	}
	out2, stderr, code := c.Run(t, "", "auth", "ssh-key", "--json")
	var k struct {
		PublicKey   string `json:"public_key"`
		Fingerprint string `json:"fingerprint"`
		Path        string `json:"path"`
		Created     bool   `json:"created"`
	}
	if code != 0 || json.Unmarshal([]byte(out2), &k) != nil {
		t.Fatalf("--json: exit %d %s %s", code, out2, stderr)
	}
	if k.PublicKey != strings.TrimSpace(stdout) || k.Created || k.Path != priv || !strings.HasPrefix(k.Fingerprint, "SHA256:") {
		t.Errorf("--json: %+v", k)
	}
	if strings.Contains(out2, "PRIVATE") {
		t.Error("the private key was printed")
	}
}

// TestLogsSSHAgent: `vibedom logs --ssh-agent` prints the agent log with the
// guest's strings escaped, as text and as JSON lines.
func TestLogsSSHAgent(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	dir := filepath.Join(t.TempDir(), "session-20260101-000000")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "ssh_agent.jsonl"), []byte(
		`{"time":"2026-01-01T00:00:00Z","op":"sign","decision":"allow","key":"SHA256:abc","user":"git\u001b[2J","service":"ssh-connection","algorithm":"ssh-ed25519","session_id":"00112233445566778899aabbccddeeff","server":"git.test:22","server_host_key":"SHA256:def","known_host":true}`+"\n"+
			`{"time":"2026-01-01T00:00:01Z","op":"add","decision":"deny","reason":"adding keys is not allowed"}`+"\n"), 0o600)
	stdout, stderr, code := c.Run(t, "", "logs", "--ssh-agent", dir)
	if code != 0 || !strings.Contains(stdout, `allow  sign       SHA256:abc user "git\x1b[2J" service ssh-connection ssh-ed25519 ssh session 0011223344556677… to git.test:22 host key SHA256:def (in known_hosts)`) ||
		!strings.Contains(stdout, "deny   add        (adding keys is not allowed)") || strings.Contains(stdout, "\x1b") {
		t.Errorf("logs --ssh-agent: exit %d\n%s\n%s", code, stdout, stderr)
	}
	stdout, _, code = c.Run(t, "", "logs", "--ssh-agent", "--json", dir)
	if code != 0 || strings.Count(stdout, "\n") != 2 || !strings.Contains(stdout, `git\u001b[2J`) || strings.Contains(stdout, "\x1b") {
		t.Errorf("logs --ssh-agent --json: exit %d\n%s", code, stdout)
	}
	if _, stderr, code := c.Run(t, "", "logs", "--ssh-agent", "--alerts", dir); code == 0 || !strings.Contains(stderr, "exclude each other") {
		t.Errorf("--ssh-agent --alerts: exit %d %s", code, stderr)
	}
}
