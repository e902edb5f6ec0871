package keys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// DeployKeyName is the file name of the deploy key in the keys folder; the
// public half has ".pub" appended.
const DeployKeyName = "id_ed25519_vibedom"

// DeployKey is the user's vibedom deploy key: an SSH key the user registers
// with their git host so sessions can fetch and push without the user's own
// keys. Its private half never enters a VM: the guest only gets an agent
// connection that signs with it.
type DeployKey struct {
	signer ssh.Signer
	path   string
}

// EnsureDeployKey loads the deploy key from dir, creating it (0600, dir
// 0700) on first use. created reports whether it was made now.
func EnsureDeployKey(dir string) (k *DeployKey, created bool, err error) {
	path := filepath.Join(dir, DeployKeyName)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		k, err := loadDeployKey(path, data)
		return k, false, err
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("read deploy key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create keys folder: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generate deploy key: %w", err)
	}
	host, _ := os.Hostname()
	pemData, err := marshalPrivate(priv, "vibedom deploy key "+host)
	if err != nil {
		return nil, false, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, false, fmt.Errorf("deploy key: %w", err)
	}
	k = &DeployKey{signer: signer, path: path}
	if err := writeNewKey(path, pemData); err != nil {
		if errors.Is(err, os.ErrExist) {
			return EnsureDeployKey(dir)
		}
		return nil, false, fmt.Errorf("write deploy key: %w", err)
	}
	if err := os.WriteFile(path+".pub", []byte(k.AuthorizedKey()+"\n"), 0o644); err != nil {
		return nil, false, fmt.Errorf("write deploy public key: %w", err)
	}
	return k, true, nil
}

func loadDeployKey(path string, data []byte) (*DeployKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("deploy key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("deploy key %s is readable by other users (mode %v): run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	priv, err := parseEd25519(data)
	if err != nil {
		return nil, fmt.Errorf("deploy key %s: %w", path, err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("deploy key %s: %w", path, err)
	}
	return &DeployKey{signer: signer, path: path}, nil
}

// Signer signs with the deploy key (for an SSH agent served to the guest).
func (k *DeployKey) Signer() ssh.Signer { return k.signer }

// Path is the private key file.
func (k *DeployKey) Path() string { return k.path }

// AuthorizedKey is the public key in authorized_keys format, for the user to
// add to their git host.
func (k *DeployKey) AuthorizedKey() string {
	return string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(k.signer.PublicKey())))
}

// Fingerprint is the SHA256 fingerprint of the public key.
func (k *DeployKey) Fingerprint() string { return ssh.FingerprintSHA256(k.signer.PublicKey()) }

// String redacts the private key.
func (k *DeployKey) String() string { return "keys.DeployKey{" + k.Fingerprint() + "}" }

// LogValue redacts the private key.
func (k *DeployKey) LogValue() slog.Value { return slog.StringValue(k.Fingerprint()) }

// writeNewKey writes data to a new file at path (mode 0600). O_EXCL: two
// concurrent inits must not overwrite each other's key; a file already
// there is an error wrapping os.ErrExist. Nothing is left behind on failure.
func writeNewKey(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}
