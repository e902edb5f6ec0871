package keys

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

func TestAuditKey(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	k, created, err := EnsureAuditKey(dir)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	fi, err := os.Stat(k.Path())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi, err)
	}
	k2, created, err := EnsureAuditKey(dir)
	if err != nil || created || k2.PublicKey() != k.PublicKey() {
		t.Fatalf("second call made a new key: %v %v", created, err)
	}
	// What is encrypted to the recipient decrypts with the loaded identity.
	var b bytes.Buffer
	w, _ := age.Encrypt(&b, k.Recipient())
	w.Write([]byte("hello"))
	w.Close()
	r, err := age.Decrypt(&b, k2.Identity())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	out.ReadFrom(r)
	if out.String() != "hello" {
		t.Errorf("decrypted %q", out.String())
	}
	// The private half never shows.
	data, _ := os.ReadFile(k.Path())
	secret := strings.TrimSpace(string(data[bytes.LastIndex(data, []byte("AGE-SECRET")):]))
	for _, s := range []string{k.String(), k.GoString(), k.LogValue().String()} {
		if strings.Contains(s, secret) {
			t.Errorf("private key shown: %s", s)
		}
	}
	// A key others can read is refused with the fix.
	os.Chmod(k.Path(), 0o644)
	if _, err := LoadAuditKey(k.Path()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("loose mode: %v", err)
	}
	os.Chmod(k.Path(), 0o600)
	os.WriteFile(k.Path(), []byte("garbage\n"), 0o600)
	if _, err := LoadAuditKey(k.Path()); err == nil {
		t.Error("a garbage key file loaded")
	}
}
