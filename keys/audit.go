package keys

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"
)

// AuditKeyName is the file name of the DLP audit key in the keys folder.
const AuditKeyName = "dlp_audit.key"

// AuditKey is the age X25519 key the DLP audit log (the original values of
// what was scrubbed) is encrypted to. It stays on the host; only the
// public recipient is used while a session runs.
type AuditKey struct {
	id   *age.X25519Identity
	path string
}

// EnsureAuditKey loads the audit key from dir, creating it (0600, an age
// identity file with the public key in a comment) on first use. created
// reports whether it was made now.
func EnsureAuditKey(dir string) (k *AuditKey, created bool, err error) {
	path := filepath.Join(dir, AuditKeyName)
	k, err = LoadAuditKey(path)
	if err == nil {
		return k, false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create keys folder: %w", err)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, false, fmt.Errorf("generate the audit key: %w", err)
	}
	data := fmt.Sprintf("# vibedom DLP audit key (decrypts dlp_audit.jsonl.enc)\n# created: %s\n# public key: %s\n%s\n",
		time.Now().UTC().Format(time.RFC3339), id.Recipient(), id)
	if err := writeNewKey(path, []byte(data)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return EnsureAuditKey(dir)
		}
		return nil, false, fmt.Errorf("write the audit key: %w", err)
	}
	return &AuditKey{id: id, path: path}, true, nil
}

// LoadAuditKey reads an existing audit key, refusing one other users can
// read. A missing file is an error wrapping os.ErrNotExist.
func LoadAuditKey(path string) (*AuditKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s is readable by other users (mode %v): run chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	ids, err := age.ParseIdentities(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("audit key %s: %w", path, err)
	}
	for _, i := range ids {
		if x, ok := i.(*age.X25519Identity); ok {
			return &AuditKey{id: x, path: path}, nil
		}
	}
	return nil, fmt.Errorf("audit key %s holds no X25519 identity", path)
}

// Recipient is the public key the audit log is encrypted to.
func (k *AuditKey) Recipient() age.Recipient { return k.id.Recipient() }

// Identity decrypts the audit log.
func (k *AuditKey) Identity() age.Identity { return k.id }

// Path is the key file.
func (k *AuditKey) Path() string { return k.path }

// PublicKey is the recipient in age's text form (age1…).
func (k *AuditKey) PublicKey() string { return k.id.Recipient().String() }

// String shows the public key only.
func (k *AuditKey) String() string { return "keys.AuditKey{" + k.PublicKey() + "}" }

// GoString shows the public key only.
func (k *AuditKey) GoString() string { return k.String() }

// LogValue shows the public key only.
func (k *AuditKey) LogValue() slog.Value { return slog.StringValue(k.PublicKey()) }
