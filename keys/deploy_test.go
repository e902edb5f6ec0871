package keys

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureDeployKey(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	k1, created, err := EnsureDeployKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Errorf("first EnsureDeployKey: created = false, want true")
	}
	fi, err := os.Stat(k1.Path())
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("deploy key mode: got %v, want 0600", got)
	}
	pub, err := os.ReadFile(k1.Path() + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(pub)), k1.AuthorizedKey(); got != want {
		t.Errorf(".pub file: got %q, want %q", got, want)
	}
	k2, created, err := EnsureDeployKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if created {
		t.Errorf("second EnsureDeployKey: created = true, want false")
	}
	if k1.AuthorizedKey() != k2.AuthorizedKey() {
		t.Errorf("second EnsureDeployKey made a different key")
	}
	if s := k1.String(); strings.Contains(s, "PRIVATE") || !strings.Contains(s, "SHA256:") {
		t.Errorf("String() = %q: want only the fingerprint", s)
	}
}

func TestDeployKeyRefusesLoosePermissions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k, _, err := EnsureDeployKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(k.Path(), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = EnsureDeployKey(dir)
	if err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("loose deploy key: got error %v, want one telling to chmod 600", err)
	}
}

func TestSessionKeysRoundTrip(t *testing.T) {
	t.Parallel()
	s, err := NewSession()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := s.ClientKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	hp, err := s.HostKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	s2, err := LoadSession(cp, hp)
	if err != nil {
		t.Fatal(err)
	}
	if s.AuthorizedKey() != s2.AuthorizedKey() {
		t.Errorf("client key changed across LoadSession")
	}
	if err := s2.HostKeyCallback()("guest", nil, s.HostPublicKey()); err != nil {
		t.Errorf("pinned host key refused: %v", err)
	}
	other, err := NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.HostKeyCallback()("guest", nil, other.HostPublicKey()); err == nil {
		t.Errorf("a different host key was accepted")
	}
	if strings.Contains(s.String(), "PRIVATE") {
		t.Errorf("String() leaks key material: %s", s)
	}
}
