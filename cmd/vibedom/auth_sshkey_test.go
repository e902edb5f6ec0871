package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAuthSSHKey: `vibedom auth ssh-key` makes the deploy key once (0600)
// and prints its public half, the same every time; --json too.
func TestAuthSSHKey(t *testing.T) {
	c := newCLI(t)
	stdout, stderr, code := c.run(t, "", "auth", "ssh-key")
	if code != 0 || !strings.HasPrefix(stdout, "ssh-ed25519 ") || strings.Count(stdout, "\n") != 1 || !strings.Contains(stderr, "Made a deploy key") {
		t.Fatalf("auth ssh-key: exit %d\n%s\n%s", code, stdout, stderr)
	}
	priv := filepath.Join(c.home, "keys", "id_ed25519_vibedom")
	if fi, err := os.Stat(priv); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("private key: %v %v", fi, err)
	}
	pub, _ := os.ReadFile(priv + ".pub")
	if strings.TrimSpace(string(pub)) != strings.TrimSpace(stdout) {
		t.Errorf(".pub %q, printed %q", pub, stdout)
	}
	out2, stderr, code := c.run(t, "", "auth", "ssh-key", "--json")
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
