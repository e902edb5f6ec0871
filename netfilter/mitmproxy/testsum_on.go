//go:build vibedom_testkeys

package mitmproxy

import "os"

// testMitmproxySHA256: a build with the vibedom_testkeys tag (the CLI's
// tests build one) expects $VIBEDOM_TEST_MITMPROXY_SHA256 of the mitmproxy
// tarball, so a test can serve its own from a loopback mirror.
func testMitmproxySHA256() string { return os.Getenv("VIBEDOM_TEST_MITMPROXY_SHA256") }
