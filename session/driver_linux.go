package session

import (
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// DefaultDriver is QEMU.
func DefaultDriver(h home.Home) (vm.Driver, error) {
	return qemu.New(qemu.Options{}), nil
}
