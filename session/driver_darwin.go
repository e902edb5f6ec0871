package session

import (
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/vz"
)

// DefaultDriver is Apple's Virtualization.framework.
func DefaultDriver(home.Home) (vm.Driver, error) {
	d, err := vz.New(nil)
	if err != nil {
		return nil, err
	}
	return d, nil
}
