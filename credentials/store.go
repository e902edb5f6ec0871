package credentials

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vibedom/vibedom/atomicfile"
)

// secretStore holds named secrets on the host: the 0600 file store
// everywhere, the login Keychain on macOS (see store_darwin.go). get
// returns an error wrapping fs.ErrNotExist for a name it does not hold.
type secretStore interface {
	get(name string) ([]byte, error)
	put(name string, b []byte) error
	del(name string) error
	// where says where name is kept, for messages.
	where(name string) string
}

// maxStored bounds one stored secret.
const maxStored = 1 << 20

// fileStore keeps each secret in <dir>/<name>, 0600, the folder 0700.
type fileStore struct{ dir string }

func (s fileStore) where(name string) string { return filepath.Join(s.dir, name) }

func (s fileStore) get(name string) ([]byte, error) {
	f := s.where(name)
	fi, err := os.Lstat(f)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: must be a regular file only you can read (chmod 600 %s)", f, f)
	}
	return atomicfile.ReadLimited(f, maxStored)
}

func (s fileStore) put(name string, b []byte) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(s.where(name), b, 0o600)
}

func (s fileStore) del(name string) error {
	err := os.Remove(s.where(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
