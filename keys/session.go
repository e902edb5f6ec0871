// Package keys makes and keeps vibedom's key material: the per-session SSH
// keys of the control channel, the user's deploy key, the MITM certificate
// authority and the audit log key. It performs no network I/O. Private keys
// are written 0600 and never logged: the types here redact themselves.
package keys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"

	"golang.org/x/crypto/ssh"
)

// Session holds the two SSH key pairs of one session's control channel: the
// host's client key (the guest authorizes its public half) and the guest's
// host key (the host pins its public half, so there is no trust on first
// use). Both are made by the host and handed to the guest at boot.
type Session struct {
	clientKey ed25519.PrivateKey
	hostKey   ed25519.PrivateKey
	client    ssh.Signer
	hostPub   ssh.PublicKey
}

// NewSession makes fresh ed25519 key pairs for one session.
func NewSession() (*Session, error) {
	_, ck, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate session client key: %w", err)
	}
	_, hk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate guest host key: %w", err)
	}
	return sessionFrom(ck, hk)
}

func sessionFrom(ck, hk ed25519.PrivateKey) (*Session, error) {
	cs, err := ssh.NewSignerFromKey(ck)
	if err != nil {
		return nil, fmt.Errorf("session client key: %w", err)
	}
	hs, err := ssh.NewSignerFromKey(hk)
	if err != nil {
		return nil, fmt.Errorf("guest host key: %w", err)
	}
	return &Session{clientKey: ck, hostKey: hk, client: cs, hostPub: hs.PublicKey()}, nil
}

// ClientSigner is the host's client key, used to authenticate to the guest.
func (s *Session) ClientSigner() ssh.Signer { return s.client }

// AuthorizedKey is the client's public key in authorized_keys format,
// without a trailing newline.
func (s *Session) AuthorizedKey() string {
	return string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(s.client.PublicKey())))
}

// HostPublicKey is the guest's host public key the host pins.
func (s *Session) HostPublicKey() ssh.PublicKey { return s.hostPub }

// HostKeyPEM is the guest's host private key in OpenSSH PEM form, for the
// guest's boot data only.
func (s *Session) HostKeyPEM() ([]byte, error) {
	return marshalPrivate(s.hostKey, "vibedom guest host key")
}

// ClientKeyPEM is the host's client private key in OpenSSH PEM form, so a
// later process (attach, stop) can reconnect to the same guest.
func (s *Session) ClientKeyPEM() ([]byte, error) {
	return marshalPrivate(s.clientKey, "vibedom session client key")
}

// HostKeyCallback accepts exactly the pinned guest host key and refuses any
// other with an error naming both fingerprints.
func (s *Session) HostKeyCallback() ssh.HostKeyCallback {
	want := s.hostPub
	return func(_ string, _ net.Addr, got ssh.PublicKey) error {
		if bytes.Equal(got.Marshal(), want.Marshal()) {
			return nil
		}
		return fmt.Errorf("guest host key %s does not match the pinned key %s: refusing to talk to this guest",
			ssh.FingerprintSHA256(got), ssh.FingerprintSHA256(want))
	}
}

// ClientConfig is an SSH client configuration that authenticates with the
// session client key and pins the guest host key.
func (s *Session) ClientConfig() *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(s.client)},
		HostKeyCallback: s.HostKeyCallback(),
	}
}

// String redacts the keys.
func (s *Session) String() string {
	return "keys.Session{client " + ssh.FingerprintSHA256(s.client.PublicKey()) +
		", host " + ssh.FingerprintSHA256(s.hostPub) + "}"
}

// LogValue redacts the keys in structured logs.
func (s *Session) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("client", ssh.FingerprintSHA256(s.client.PublicKey())),
		slog.String("host", ssh.FingerprintSHA256(s.hostPub)),
	)
}

// LoadSession rebuilds a Session from the PEM files written by ClientKeyPEM
// and HostKeyPEM.
func LoadSession(clientPEM, hostPEM []byte) (*Session, error) {
	ck, err := parseEd25519(clientPEM)
	if err != nil {
		return nil, fmt.Errorf("session client key: %w", err)
	}
	hk, err := parseEd25519(hostPEM)
	if err != nil {
		return nil, fmt.Errorf("guest host key: %w", err)
	}
	return sessionFrom(ck, hk)
}

func marshalPrivate(k ed25519.PrivateKey, comment string) ([]byte, error) {
	b, err := ssh.MarshalPrivateKey(k, comment)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(b), nil
}

func parseEd25519(data []byte) (ed25519.PrivateKey, error) {
	raw, err := ssh.ParseRawPrivateKey(data)
	if err != nil {
		return nil, err
	}
	switch k := raw.(type) {
	case ed25519.PrivateKey:
		return k, nil
	case *ed25519.PrivateKey:
		return *k, nil
	default:
		return nil, fmt.Errorf("key is %T, want ed25519", raw)
	}
}
