//go:build tools

// Package vibedom pins the modules the project builds on before every one of
// them has an importer, so `go mod tidy` keeps their exact versions.
package vibedom

import (
	_ "filippo.io/age"
	_ "github.com/Code-Hex/vz/v3"
	_ "github.com/andybalholm/brotli"
	_ "github.com/containers/gvisor-tap-vsock/pkg/tap"
	_ "github.com/creack/pty"
	_ "github.com/klauspost/compress/zstd"
	_ "github.com/pkg/sftp"
	_ "github.com/sergi/go-diff/diffmatchpatch"
	_ "github.com/urfave/cli/v3"
	_ "github.com/zricethezav/gitleaks/v8/detect"
	_ "golang.org/x/crypto/ssh"
	_ "golang.org/x/net/http2"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/term"
	_ "gvisor.dev/gvisor/pkg/tcpip/stack"
)
