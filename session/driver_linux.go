package session

import (
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// DefaultDriver is QEMU.
func DefaultDriver(h Home) (vm.Driver, error) {
	return qemu.New(qemu.Options{}), nil
}
