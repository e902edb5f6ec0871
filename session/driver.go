package session

import (
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/vm"
)

// controlFor is where the guest agent listens for the driver's control
// channel, as the driver reports it.
func controlFor(d vm.Driver) proto.Control {
	if d.Info().Transport == vm.TransportVsock {
		return proto.Control{Transport: proto.TransportVsock, Port: vm.DefaultControlPort}
	}
	return proto.Control{Transport: proto.TransportVirtioSerial, Name: vm.ControlPortName}
}

// shareFSFor is how the driver shares the workspace, as it reports it.
func shareFSFor(d vm.Driver) string {
	if d.Info().ShareFS == vm.ShareVirtiofs {
		return proto.FSVirtiofs
	}
	return proto.FS9P
}
