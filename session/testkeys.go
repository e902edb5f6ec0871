//go:build !vibedom_testkeys

package session

import "github.com/vibedom/vibedom/image/alpine"

// testKeyring is nil in every real build: Alpine's release keys, embedded
// in the binary, are the only ones trusted. Binaries built with the
// vibedom_testkeys tag (only the test suite builds them) may trust a test
// mirror's key instead; see testkeys_on.go.
func testKeyring() *alpine.Keyring { return nil }

// TestKeysBuild reports whether this binary was built for tests (it may
// trust a test mirror's key).
const TestKeysBuild = false

// TestKeyring is the keyring a test build trusts; nil (the release keys)
// in every real build.
func TestKeyring() *alpine.Keyring { return testKeyring() }
