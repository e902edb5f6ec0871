package keys

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestEnsureCACreatesThenLoads(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want os.FileMode
	}{
		{dir, 0o700},
		{filepath.Join(dir, CAKeyFile), 0o600},
		{filepath.Join(dir, CACertFile), 0o644},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != c.want {
			t.Errorf("mode of %s: got %04o, want %04o", c.path, got, c.want)
		}
	}
	cert := ca.Certificate()
	if !cert.IsCA || !cert.MaxPathLenZero {
		t.Errorf("CA certificate: IsCA %v MaxPathLenZero %v, want both true", cert.IsCA, cert.MaxPathLenZero)
	}
	if got, want := cert.PublicKeyAlgorithm, x509.ECDSA; got != want {
		t.Errorf("CA key algorithm: got %v, want %v", got, want)
	}
	again, err := EnsureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := again.Fingerprint(), ca.Fingerprint(); got != want {
		t.Errorf("reloaded CA fingerprint: got %s, want %s", got, want)
	}
	pub, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, ca.CertPEM()) {
		t.Errorf("%s differs from CertPEM()", CACertFile)
	}
	if bytes.Contains(pub, []byte("PRIVATE")) || bytes.Contains(ca.CertPEM(), []byte("PRIVATE")) {
		t.Errorf("public certificate file holds a private key")
	}
}

func TestEnsureCAConcurrent(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ca")
	const n = 8
	fps := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ca, err := EnsureCA(dir)
			if err != nil {
				t.Error(err)
				return
			}
			fps[i] = ca.Fingerprint()
		})
	}
	wg.Wait()
	for i := range fps {
		if fps[i] != fps[0] {
			t.Errorf("caller %d got CA %s, caller 0 got %s", i, fps[i], fps[0])
		}
	}
}

func TestEnsureCARefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		wantErr error
		wantMsg string
	}{
		{
			name: "group readable key",
			prepare: func(t *testing.T, dir string) {
				os.Chmod(filepath.Join(dir, CAKeyFile), 0o640)
			},
			wantErr: ErrKeyPermissions,
			wantMsg: "chmod 600 ",
		},
		{
			name: "world readable key",
			prepare: func(t *testing.T, dir string) {
				os.Chmod(filepath.Join(dir, CAKeyFile), 0o604)
			},
			wantErr: ErrKeyPermissions,
			wantMsg: "chmod 600 ",
		},
		{
			name: "directory writable by others",
			prepare: func(t *testing.T, dir string) {
				os.Chmod(dir, 0o777)
			},
			wantErr: ErrKeyPermissions,
			wantMsg: "chmod 700 ",
		},
		{
			name: "key is a symlink",
			prepare: func(t *testing.T, dir string) {
				p := filepath.Join(dir, CAKeyFile)
				os.Rename(p, p+".real")
				os.Symlink(p+".real", p)
			},
			wantErr: ErrKeyPermissions,
		},
		{
			name: "garbage key file",
			prepare: func(t *testing.T, dir string) {
				os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("not pem"), 0o600)
			},
			wantErr: ErrCAInvalid,
			wantMsg: "vibedom init",
		},
		{
			name: "key and certificate of different CAs",
			prepare: func(t *testing.T, dir string) {
				other, err := EnsureCA(filepath.Join(t.TempDir(), "other"))
				if err != nil {
					t.Fatal(err)
				}
				mine, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
				i := bytes.Index(mine, []byte("-----BEGIN CERTIFICATE"))
				mixed := append(mine[:i:i], other.CertPEM()...)
				os.WriteFile(filepath.Join(dir, CAKeyFile), mixed, 0o600)
			},
			wantErr: ErrCAInvalid,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ca")
			if _, err := EnsureCA(dir); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, dir)
			_, err := EnsureCA(dir)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("EnsureCA: got %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

func TestIssueLeaf(t *testing.T) {
	t.Parallel()
	ca, err := EnsureCA(filepath.Join(t.TempDir(), "ca"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, host, verifyAs string
	}{
		{"dns name", "api.example.com", "api.example.com"},
		{"punycode name", "xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"ipv4", "192.0.2.7", "192.0.2.7"},
		{"ipv6", "2001:db8::1", "2001:db8::1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ca.IssueLeaf(tt.host, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			_, err = c.Leaf.Verify(x509.VerifyOptions{
				DNSName:   tt.verifyAs,
				Roots:     ca.Pool(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				t.Errorf("leaf for %q does not verify against the CA: %v", tt.host, err)
			}
			if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: "other.example", Roots: ca.Pool()}); err == nil {
				t.Errorf("leaf for %q verifies for other.example", tt.host)
			}
			if got := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore); got > 2*time.Hour+time.Minute {
				t.Errorf("leaf validity: got %v, want at most 2h (1h skew + 1h)", got)
			}
			if c.Leaf.IsCA {
				t.Errorf("leaf is a CA")
			}
		})
	}
	for _, bad := range []string{"", "*.example.com", "a b"} {
		if _, err := ca.IssueLeaf(bad, 0); err == nil {
			t.Errorf("IssueLeaf(%q): got nil error, want one", bad)
		}
	}
}

func TestCARedacts(t *testing.T) {
	t.Parallel()
	ca, err := EnsureCA(filepath.Join(t.TempDir(), "ca"))
	if err != nil {
		t.Fatal(err)
	}
	d := ca.key.D.String()
	var logBuf bytes.Buffer
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("ca", "ca", ca)
	for _, s := range []string{ca.String(), fmt.Sprintf("%v", ca), fmt.Sprintf("%+v", ca), fmt.Sprintf("%#v", ca), fmt.Sprint(*ca), logBuf.String()} {
		if strings.Contains(s, d) || strings.Contains(s, "PRIVATE") {
			t.Errorf("formatted CA leaks the key: %s", s)
		}
	}
	if !strings.Contains(logBuf.String(), ca.Fingerprint()) {
		t.Errorf("log line lacks the fingerprint: %s", logBuf.String())
	}
}
