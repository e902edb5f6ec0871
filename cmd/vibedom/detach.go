package main

import (
	"context"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/session"
)

// The detached session host: `vibedom run --detach` (session.Detach)
// starts the program again with this hidden command, and the host's
// options in the session folder it names.
func init() {
	commands = append(commands, &cli.Command{
		Name:      session.HostCommand,
		Usage:     "run a detached session's host (started by vibedom run --detach only)",
		ArgsUsage: "SESSION-FOLDER",
		Hidden:    true,
		Action: func(ctx context.Context, c *cli.Command) error {
			res, err := session.Host(ctx, session.HostOptions{Dir: c.Args().First(), Interrupts: interrupts()})
			if err != nil {
				return err
			}
			return exitCode(res.ExitCode)
		},
	})
}
