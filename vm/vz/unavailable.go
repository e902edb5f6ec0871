//go:build !(darwin && arm64)

package vz

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/vibedom/vibedom/vm"
)

var (
	_ vm.Driver   = (*Driver)(nil)
	_ vm.Restorer = (*Driver)(nil)
)

// errUnavailable says why vz cannot run here and what to use instead.
var errUnavailable = fmt.Errorf("%w: the vz backend needs an Apple silicon Mac (darwin/arm64), this is %s/%s: use the QEMU backend",
	vm.ErrUnavailable, runtime.GOOS, runtime.GOARCH)

// New returns an error wrapping vm.ErrUnavailable: Virtualization.framework
// exists only on Apple silicon Macs.
func New(log *slog.Logger) (*Driver, error) { return nil, errUnavailable }

// Available always fails here; see New.
func (d *Driver) Available(ctx context.Context, arch vm.Arch) error { return errUnavailable }

// Start always fails here; see New.
func (d *Driver) Start(ctx context.Context, cfg vm.Config) (vm.Machine, error) {
	return nil, errUnavailable
}

// Restore always fails here; see New.
func (d *Driver) Restore(ctx context.Context, cfg vm.Config, statePath string) (vm.Machine, error) {
	return nil, errUnavailable
}
