package main

import (
	"context"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "undo",
		Usage:     "undo the latest apply of a session's changes",
		ArgsUsage: "[SESSION]",
		Description: "Restores every path the latest apply wrote or removed (content, mode, symlinks, deleted and\n" +
			"created files). A path you changed after the apply is kept unless --force. Run it again to undo\n" +
			"the apply before. SESSION defaults to the latest.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Usage: "also restore paths changed since the apply (your later edits are lost)"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			si, err := changesSession(c)
			if err != nil {
				return err
			}
			rep, err := overlay.Undo(ctx, si.Dir, si.Workspace, overlay.UndoOptions{Force: c.Bool("force")})
			if rep != nil {
				for _, p := range rep.Restored {
					fmt.Fprintf(os.Stdout, "  %s  restored\n", overlay.DisplayPath(p))
				}
				for _, k := range rep.Kept {
					fmt.Fprintf(os.Stdout, "  %s  %s\n", overlay.DisplayPath(k.Path), termtext.Inline(fmt.Sprint(k.Err)))
				}
			}
			if err != nil {
				return err
			}
			if len(rep.Kept) > 0 {
				return exitCode(1)
			}
			return nil
		},
	})
}
