// Package keystest makes a session's control-channel keys for tests: fresh
// keys.Session pairs with the guest's host key both as the PEM a boot
// configuration carries and as the signer an in-process SSH server standing
// in for the guest serves with. It is imported by tests and test suites
// only; it makes no key a real session uses and writes nothing to disk.
package keystest

import (
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/keys"
)

// Session is one test's session keys.
type Session struct {
	// Keys are the session's keys: the host's client key and the pinned
	// guest host key.
	Keys *keys.Session
	// HostPEM is the guest's host private key, as handed to the guest.
	HostPEM []byte
	// HostSigner is that key parsed, for a test's own SSH server.
	HostSigner ssh.Signer
}

// New makes fresh session keys, failing t if it cannot.
func New(t testing.TB) Session {
	t.Helper()
	k, err := keys.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	hostPEM, err := k.HostKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(hostPEM)
	if err != nil {
		t.Fatal(err)
	}
	return Session{Keys: k, HostPEM: hostPEM, HostSigner: signer}
}
