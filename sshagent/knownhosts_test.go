package sshagent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// TestAgentChecksKnownHosts: the agent signs only when the user's
// known_hosts lists the server's key for the carried connection's name. An
// impostor or an echoing "server" (another key of the type), a revoked key,
// a name listed with a key of another type only, a name not listed, or no
// usable file: no signature (a server the attacker runs could replay another
// server's recorded key exchange).
func TestAgentChecksKnownHosts(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecdsaPub, _ := ssh.NewPublicKey(&ek.PublicKey)
	other := newSigner(t).PublicKey()
	dir := t.TempDir()
	for _, tt := range []struct {
		name, file string
		refusal    string
		known      bool
	}{
		{"listed", "git.test", "", true},
		{"another key of the type", "other", "is not the one known_hosts lists", false},
		{"revoked", "revoked", "is revoked", false},
		{"only another type listed", "ecdsa", "which no known_hosts file lists", false},
		{"not listed", "none", "which no known_hosts file lists", false},
		{"unreadable file", "garbage", "which no known_hosts file lists", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newSSHWorld(t, deploy.PublicKey())
			var content string
			switch tt.file {
			case "git.test":
				content = knownhosts.Line([]string{"git.test"}, w.host.PublicKey())
			case "other":
				content = knownhosts.Line([]string{"git.test"}, other) + "\n" + knownhosts.Line([]string{"git.test"}, ecdsaPub)
			case "revoked":
				content = "@revoked * " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(w.host.PublicKey())))
			case "ecdsa":
				content = knownhosts.Line([]string{"git.test"}, ecdsaPub)
			case "none":
				content = knownhosts.Line([]string{"elsewhere.test"}, other)
			case "garbage":
				content = "git.test not-a-key\n"
			}
			f := filepath.Join(dir, tt.file)
			os.WriteFile(f, []byte(content+"\n"), 0o600)
			check, notes := KnownHosts(f, filepath.Join(dir, "missing"))
			if (tt.file == "garbage") != (len(notes) == 1) {
				t.Errorf("notes: %q", notes)
			}
			w.carried.CheckHostKeys(check)
			rec := &events{}
			ag := served(t, New(deploy, w.carried, rec))
			c, err := w.dial(w.spliced, "git", ag)
			if tt.refusal != "" {
				if err == nil {
					c.Close()
					t.Fatal("logged in")
				}
				wantRefusal(t, rec, tt.refusal)
				return
			}
			if err != nil {
				t.Fatalf("login: %v", err)
			}
			c.Close()
			if e := lastEvent(t, rec); e.Decision != "allow" || e.KnownHost != tt.known {
				t.Errorf("event: %+v, want known_host %v", e, tt.known)
			}
		})
	}
}
