package session

import (
	"context"

	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/vm"
)

// The guest image is package image's (image.Choose, image.BuildGuest);
// a session only asks for it. These two keep the lifecycle's call sites
// (boot.go, recover.go) as they were.

// chooseImage decides, before anything is made, what a session boots
// (image.Choose).
func chooseImage(h Home, arch vm.Arch) (image.Choice, error) { return image.Choose(h, arch) }

// prepareImage makes the chosen image ready, trusting this build's
// keyring (see testKeyring).
func prepareImage(ctx context.Context, h Home, arch vm.Arch, c image.Choice) (img *image.Image, root, libc string, err error) {
	return c.Prepare(ctx, h, arch, testKeyring())
}
