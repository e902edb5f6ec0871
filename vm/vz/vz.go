// Package vz runs vibedom machines on Apple's Virtualization.framework
// through github.com/Code-Hex/vz/v3. It is the only package of vibedom that
// imports vz.
//
// The backend works on Apple silicon Macs (darwin/arm64) with macOS 14 or
// later, in a binary signed with the com.apple.security.virtualization
// entitlement. It boots an uncompressed arm64 Linux Image with an initramfs,
// gives the guest a virtio console (hvc0) written to Config.ConsoleLog, one
// virtiofs device per Share (read-only when asked, enforced by the host),
// one virtio-blk device per Disk, an entropy device, a vsock device for the
// control channel and, when Config.Network is set, one virtio-net NIC whose
// frames go through the caller's datagram socket. Machines can pause and
// resume (vm.Pauser) and, on macOS 14 or later, be saved to disk and
// restored (vm.StateSaver, vm.Restorer). A traditional memory balloon
// lets the host set how much memory the guest keeps (vm.Ballooner); vz has
// no free page reporting, so an idle guest gives memory back only when the
// host lowers that target. Each machine has a generic
// platform with a machine identity, made anew or taken from
// Config.MachineID, and reports it (vm.Identified): a restore needs the
// identity the machine was saved with.
//
// On every other platform the package still builds: New returns an error
// wrapping vm.ErrUnavailable, so callers may import it unconditionally.
//
// Files that call vz are built only for darwin && arm64 and hold nothing but
// those calls; validation, kernel format checks, MAC parsing, the dial retry
// loop and state tracking live in plain Go files tested on every platform.
// The darwin files are type-checked on Linux by tools/check-darwin.
package vz

import (
	"errors"
	"log/slog"

	"github.com/vibedom/vibedom/vm"
)

// Name is the driver's name, as Driver.Name reports it.
const Name = "vz"

// ErrKernelFormat means the kernel file is not an uncompressed arm64 Linux
// Image, the only format Virtualization.framework boots. It is returned
// wrapped together with vm.ErrInvalidConfig.
var ErrKernelFormat = errors.New("kernel is not an uncompressed arm64 Linux Image")

// Driver starts machines on Virtualization.framework. Make one with New.
type Driver struct {
	log *slog.Logger
	// lockPath is the host's save/restore lock file
	// (vm.DefaultSaveLockPath).
	lockPath string
}

// Name returns "vz".
func (d *Driver) Name() string { return Name }

// Info implements vm.Driver: vsock for control, virtiofs for shares.
func (d *Driver) Info() vm.Info {
	return vm.Info{Transport: vm.TransportVsock, ShareFS: vm.ShareVirtiofs}
}

func newDriver(log *slog.Logger) *Driver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{log: log, lockPath: vm.DefaultSaveLockPath()}
}
