package main

import (
	"context"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "apply",
		Usage:     "apply a session's changes to its workspace (safely, undoably)",
		ArgsUsage: "[SESSION]",
		Description: "Applies changes.patch file by file: never outside the workspace or through a symlink, protected\n" +
			"paths refused unless allowed, conflicts with your own edits merged when clean, else resolved\n" +
			"by --on-conflict. Everything overwritten is backed up: `vibedom undo` puts it back.\n" +
			"With --branch, the same paths become one commit on a new git branch instead (its parent: the commit the\n" +
			"session started from); the workspace, its index and HEAD are not touched.\n" +
			"Exits 1 when some path was not applied. SESSION defaults to the latest.",
		Flags: append(append(applySafetyFlags(),
			&cli.StringSliceFlag{Name: "files", Usage: "apply only this `PATH` (or DIR/; repeatable)"},
			&cli.StringFlag{Name: "on-conflict", Value: "mine", Usage: "mine (keep yours), agent (take the agent's) or markers (write both)"},
		), branchFlags()...),
		Action: func(ctx context.Context, c *cli.Command) error {
			si, err := changesSession(c)
			if err != nil {
				return err
			}
			opts := changesApplyOptions(c, si)
			opts.Files = c.StringSlice("files")
			if c.IsSet("branch") {
				return applyBranch(ctx, c, si, opts)
			}
			var res overlay.Resolution
			switch c.String("on-conflict") {
			case "mine":
				res = overlay.KeepMine
			case "agent":
				res = overlay.TakeAgent
			case "markers":
				res = overlay.WriteMarks
			default:
				return fmt.Errorf("--on-conflict %q: use mine, agent or markers", c.String("on-conflict"))
			}
			opts.Resolve = func(cf *overlay.Conflict) overlay.Resolution {
				for _, o := range cf.Options {
					if o == res {
						return res
					}
				}
				return overlay.KeepMine
			}
			color := changesIsTerminal(os.Stdout) && os.Getenv("NO_COLOR") == ""
			rep, err := overlay.Apply(ctx, opts)
			if rep != nil {
				review.WriteReport(os.Stdout, rep, color)
			}
			if err != nil {
				return err
			}
			if n := changesNotApplied(rep); n > 0 {
				fmt.Fprintf(os.Stderr, "vibedom: %d path(s) not applied (see above); the patch is kept in %s\n", n, termtext.Line(si.Dir))
				return exitCode(1)
			}
			return nil
		},
	})
}
