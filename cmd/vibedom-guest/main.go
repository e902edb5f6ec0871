// Command vibedom-guest is the agent inside a vibedom VM. Run as /init it is
// PID 1: it sets the guest up and serves the control channel. See package
// guest.
package main

func main() {
	panic("vibedom-guest: not yet written")
}
