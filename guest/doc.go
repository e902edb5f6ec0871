// Package guest is vibedom-guest, the code that runs inside the VM: PID 1
// (Init), the mounts, the root and /work overlays, the NIC, the SSH server
// of the control channel (Server, Agent), kept terminals, SSH-agent
// forwarding to the host, and the collection of the change set.
//
// Everything here runs in the guest, where root belongs to the agent: it
// enforces nothing the host relies on. The host's side lives elsewhere: the
// SSH client of the control channel in package guestlink, the boot function
// in package boot, and the contract both sides share in guest/proto.
package guest
