//go:build linux

// Command vibedom-guest is the agent inside a vibedom VM. As /init it is
// PID 1: it sets the guest up from the boot data and keeps reaping; its
// child "vibedom-guest agent" serves the control channel. "vibedom-guest
// changes" prints the overlay's change set as JSON; "vibedom-guest collect
// MAX" streams it with the changed files' content (proto.CollectMagic).
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/vibedom/vibedom/guest"
)

func main() {
	if os.Getpid() == 1 {
		guest.Init() // never returns
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: vibedom-guest agent|changes|collect MAX (as PID 1 it sets the guest up)")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "agent":
		if err := guest.Agent(); err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest agent:", err)
			os.Exit(1)
		}
	case "collect":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: vibedom-guest collect MAX-FILE-BYTES")
			os.Exit(2)
		}
		max, err := strconv.ParseInt(os.Args[2], 10, 64)
		if err != nil || max < 0 {
			fmt.Fprintf(os.Stderr, "vibedom-guest collect: bad size %q\n", os.Args[2])
			os.Exit(2)
		}
		if err := guest.WriteCollection(os.Stdout, os.Stderr, max); err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest collect:", err)
			os.Exit(1)
		}
	case "changes":
		if err := guest.WriteChanges(os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "vibedom-guest changes:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "vibedom-guest: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}
