//go:build !darwin

package credentials

import (
	"fmt"
	"io/fs"
)

// newStore is the host's store: the 0600 files of <home>/credentials.
func newStore(home string) secretStore { return fileStore{dir: Dir(home)} }

// vendorKeychain reads a generic password another program keeps in the
// login Keychain: macOS only.
func vendorKeychain(service, account string) ([]byte, error) {
	return nil, fmt.Errorf("the Keychain item %q: %w (no Keychain on this system)", service, fs.ErrNotExist)
}
