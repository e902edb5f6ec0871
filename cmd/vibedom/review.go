package main

import (
	"context"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
	"github.com/vibedom/vibedom/session"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "review",
		Usage:     "review a session's changes and apply all, some or none of them",
		ArgsUsage: "[SESSION]",
		Description: "Shows what the agent changed (every file, then the protected, refused, conflicting and flagged paths\n" +
			"and the totals just above the prompt; names and reasons with control or invisible characters escaped), then asks:\n" +
			"[a]pply all, [b]ranch (a commit on a new git branch; in a repository), [r]eview (colored diff in $PAGER),\n[s]elect files, [k]eep for later, [d]iscard.\n" +
			"Without a terminal nothing is applied unless --apply is given. SESSION defaults to the latest.",
		Flags: append(applySafetyFlags(),
			&cli.BoolFlag{Name: "apply", Usage: "apply everything without asking (conflicts keep your version)"},
		),
		Action: func(ctx context.Context, c *cli.Command) error {
			si, err := changesSession(c)
			if err != nil {
				return err
			}
			tty := changesIsTerminal(os.Stdin) && changesIsTerminal(os.Stdout)
			out, rep, err := review.Run(ctx, review.Options{
				Apply:    changesApplyOptions(c, si),
				In:       os.Stdin,
				Out:      os.Stdout,
				TTY:      tty,
				Color:    tty && os.Getenv("NO_COLOR") == "",
				ApplyAll: c.Bool("apply"),
			})
			if err != nil {
				return err
			}
			if (out == review.Applied || out == review.Branched) && changesNotApplied(rep) > 0 {
				return exitCode(1)
			}
			return nil
		},
	})
}

// applySafetyFlags are the flags that relax apply's refusals.
func applySafetyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "allow-protected", Usage: "apply this protected `PATH` too (exact, DIR/ prefix or glob; repeatable)"},
		&cli.BoolFlag{Name: "allow-outside-symlinks", Usage: "apply symlinks that resolve outside the workspace or loop (they stay flagged)"},
	}
}

// changesSession finds the session named by the first argument (latest when
// none).
func changesSession(c *cli.Command) (*review.SessionInfo, error) {
	home, err := home.Default()
	if err != nil {
		return nil, err
	}
	if c.Args().Len() > 1 {
		return nil, fmt.Errorf("one SESSION at most (got %d arguments)", c.Args().Len())
	}
	i, err := session.FindSession(home, c.Args().First())
	if err != nil {
		return nil, err
	}
	return i.Review(), nil
}

func changesApplyOptions(c *cli.Command, si *review.SessionInfo) overlay.ApplyOptions {
	return overlay.ApplyOptions{
		Workspace:            si.Workspace,
		SessionDir:           si.Dir,
		AllowProtected:       c.StringSlice("allow-protected"),
		AllowOutsideSymlinks: c.Bool("allow-outside-symlinks"),
	}
}

// changesNotApplied counts the paths of an apply that did not go through
// (refused, protected, failed, or a conflict that kept the user's version).
func changesNotApplied(rep *overlay.Report) int {
	if rep == nil {
		return 0
	}
	n := len(rep.Failed)
	for _, f := range rep.Plan.Files {
		switch f.Status {
		case overlay.StatusRefused, overlay.StatusProtected:
			n++
		case overlay.StatusConflict:
			if rep.Results[f.Path] == "conflict: kept yours" {
				n++
			}
		}
	}
	return n
}

func changesIsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }
