// Command vibedom-guest is the agent inside a vibedom VM. As /init it is
// PID 1: it sets the guest up from the boot data and keeps reaping; its
// child "vibedom-guest agent" serves the control channel. "vibedom-guest
// changes" prints the overlay's change set as JSON.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/vibedom/vibedom/guest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
)

func main() {
	if os.Getpid() == 1 {
		guest.Init() // never returns
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vibedom-guest agent|changes (as PID 1 it sets the guest up)")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "agent":
		if err := guest.Agent(); err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest agent:", err)
			os.Exit(1)
		}
	case "changes":
		cs, err := overlay.ScanChanges(proto.WorkspaceMount, proto.UpperDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest changes:", err)
			os.Exit(1)
		}
		if err := json.NewEncoder(os.Stdout).Encode(cs); err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest changes:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "vibedom-guest: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
