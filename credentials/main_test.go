package credentials

import (
	"os"
	"testing"
)

// TestMain keeps this package's tests off the user's login Keychain on a
// Mac: the file store only.
func TestMain(m *testing.M) {
	os.Setenv("VIBEDOM_CREDENTIAL_STORE", "file")
	os.Exit(m.Run())
}
