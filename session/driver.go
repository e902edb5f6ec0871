package session

import (
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/vm"
)

// controlFor is where the guest agent listens for the driver's control
// channel: vsock on vz, a virtio-serial port elsewhere.
func controlFor(d vm.Driver) proto.Control {
	if d.Name() == "vz" {
		return proto.Control{Transport: proto.TransportVsock, Port: vm.DefaultControlPort}
	}
	return proto.Control{Transport: proto.TransportVirtioSerial, Name: vm.ControlPortName}
}

// shareFSFor is how the driver shares the workspace: virtiofs on vz, 9p on
// QEMU.
func shareFSFor(d vm.Driver) string {
	if d.Name() == "vz" {
		return proto.FSVirtiofs
	}
	return proto.FS9P
}
