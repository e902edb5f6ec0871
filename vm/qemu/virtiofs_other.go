//go:build !linux

package qemu

import (
	"context"
	"errors"
	"fmt"

	"github.com/vibedom/vibedom/vm"
)

// virtiofsUsable: the read-only guard around virtiofsd needs Linux mount
// namespaces, so other hosts share over 9p.
func virtiofsUsable() error {
	return errors.New("virtiofs on QEMU needs a Linux host (its read-only guard is a mount namespace)")
}

type daemon struct{}

func startVirtiofsd(context.Context, vm.Share, string) (*daemon, error) {
	return nil, fmt.Errorf("%w: %v", vm.ErrUnavailable, virtiofsUsable())
}

func (d *daemon) stop() {}
