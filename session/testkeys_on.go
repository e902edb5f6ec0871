//go:build vibedom_testkeys

package session

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/vibedom/vibedom/image/alpine"
)

// TestKeysBuild reports whether this binary was built for tests (it may
// trust a test mirror's key).
const TestKeysBuild = true

// testKeyring, in binaries built with the vibedom_testkeys tag (only the
// test suite builds them; `make build` never does), trusts the keys in
// $VIBEDOM_TEST_ALPINE_KEYS: a folder of <arch>/<name>.rsa.pub files, so the
// CLI can be driven end to end against a test mirror. Unset, it is nil (the
// release keys), as in a real build.
func testKeyring() *alpine.Keyring {
	dir := os.Getenv("VIBEDOM_TEST_ALPINE_KEYS")
	if dir == "" {
		return nil
	}
	k := alpine.NewKeyring()
	for _, arch := range alpine.Arches {
		files, _ := filepath.Glob(filepath.Join(dir, arch, "*.rsa.pub"))
		for _, f := range files {
			pem, err := os.ReadFile(f)
			if err != nil {
				panic(fmt.Sprintf("test keys: %v", err))
			}
			if err := k.Add(filepath.Base(f), arch, pem); err != nil {
				panic(fmt.Sprintf("test keys: %s: %v", f, err))
			}
		}
	}
	return k
}

// TestKeyring is the keyring a test build trusts.
func TestKeyring() *alpine.Keyring { return testKeyring() }
