package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/urfave/cli/v3"
)

// version is set at link time with -ldflags "-X main.version=…".
var version = "dev"

func init() {
	commands = append(commands, &cli.Command{
		Name:  "version",
		Usage: "print the version of vibedom",
		Action: func(_ context.Context, c *cli.Command) error {
			v := version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			fmt.Fprintf(c.Root().Writer, "vibedom %s (%s, %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	})
}
