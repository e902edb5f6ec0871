//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "vibedom-guest runs only inside a Linux guest; build it with GOOS=linux")
	os.Exit(1)
}
