package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

func TestInit(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	stdout, stderr, code := c.Run(t, "", "init", "--json")
	if code != 0 && code != 1 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	var r struct {
		Home          string `json:"home"`
		DeployKey     string `json:"deploy_key"`
		DeployKeyPath string `json:"deploy_key_path"`
		CAFingerprint string `json:"ca_fingerprint"`
		DeployKeyNew  bool   `json:"deploy_key_created"`
		AuditKey      string `json:"audit_key_path"`
		AuditPublic   string `json:"audit_public_key"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("init --json: %v\n%s", err, stdout)
	}
	if !strings.HasPrefix(r.DeployKey, "ssh-ed25519 ") || !r.DeployKeyNew || r.CAFingerprint == "" ||
		r.Home != c.Home || r.DeployKeyPath != filepath.Join(c.Home, "keys", "id_ed25519_vibedom") {
		t.Errorf("deploy key: %+v", r)
	}
	if r.AuditKey != filepath.Join(c.Home, "keys", "dlp_audit.key") || !strings.HasPrefix(r.AuditPublic, "age1") {
		t.Errorf("audit key: %q %q", r.AuditKey, r.AuditPublic)
	}
	for path, want := range map[string]os.FileMode{
		filepath.Join(c.Home, "keys", "id_ed25519_vibedom"): 0o600,
		filepath.Join(c.Home, "ca", "ca-key.pem"):           0o600,
		filepath.Join(c.Home, "ca"):                         0o700,
		filepath.Join(c.Home, "trusted_domains.txt"):        0o600,
		filepath.Join(c.Home, "keys", "dlp_audit.key"):      0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", path, got, want)
		}
	}
	// A second init keeps the key.
	stdout2, _, _ := c.Run(t, "", "init", "--json")
	var r2 struct {
		DeployKey string `json:"deploy_key"`
	}
	json.Unmarshal([]byte(stdout2), &r2)
	if r2.DeployKey != r.DeployKey {
		t.Errorf("second init replaced the deploy key")
	}
	var r3 struct {
		AuditPublic string `json:"audit_public_key"`
	}
	json.Unmarshal([]byte(stdout2), &r3)
	if r3.AuditPublic != r.AuditPublic {
		t.Errorf("second init replaced the audit key")
	}
	// The human output shows the public key and where the CA is.
	out, _, _ := c.Run(t, "", "init")
	if !strings.Contains(out, r.DeployKey) || !strings.Contains(out, "MITM CA") {
		t.Errorf("init output:\n%s", out)
	}
}

func TestRunPreflightStrictRefuses(t *testing.T) {
	t.Parallel()
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := t.TempDir()
	// An AWS key built at run time, so this file holds none.
	key := "AKIA" + "Z7Q3" + "XK2M" + "PL4W" + "RT6N"
	secret := "wJalrXUtnFEMI" + "/K7MDENG/bPxRfiCY" + "EXAMPLEKEYq8"
	os.WriteFile(filepath.Join(ws, ".env.production"), []byte("AWS_ACCESS_KEY_ID="+key+"\nAWS_SECRET_ACCESS_KEY="+secret+"\n"), 0o644)
	_, stderr, code := c.Run(t, "", "run", ws, "--preflight=strict", "--no-network", "--", "true")
	if code == 0 {
		t.Fatalf("strict preflight let the session start:\n%s", stderr)
	}
	if !strings.Contains(stderr, "HIGH") || strings.Contains(stderr, "booting") {
		t.Errorf("stderr:\n%s", stderr)
	}
	if strings.Contains(stderr, key) || strings.Contains(stderr, secret) {
		t.Errorf("the secret was printed:\n%s", stderr)
	}
	if ents, _ := os.ReadDir(filepath.Join(c.Home, "sessions")); len(ents) > 0 {
		t.Errorf("a refused session left a session folder")
	}
	c.AssertNothingLeft(t)
}
