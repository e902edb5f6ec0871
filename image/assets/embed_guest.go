//go:build vibedom_embedguest

package assets

import (
	"embed"
	"io/fs"
)

// The guest agents `make embed-guest` copies into guestbin/ (not kept in
// git). A build with the vibedom_embedguest tag fails when one is missing.
//
//go:embed guestbin/SHA256SUMS guestbin/vibedom-guest-linux-amd64 guestbin/vibedom-guest-linux-arm64
var guestFiles embed.FS

func init() {
	sub, err := fs.Sub(guestFiles, "guestbin")
	if err != nil {
		panic(err)
	}
	embeddedGuests = sub
}
