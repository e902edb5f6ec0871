package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "diff",
		Usage:     "print a session's changes as a git-style patch",
		ArgsUsage: "[SESSION]",
		Description: "Prints the session's changes.patch. Piped, it is the raw patch, byte for byte (`vibedom diff | git apply`\n" +
			"works). On a terminal, or with --color=always, control, bidi and invisible characters are shown escaped\n" +
			"(\\x1b, \\u202e …) so the patch cannot drive the terminal: page it with `vibedom diff --color=always | less -R`,\n" +
			"not with the raw patch. --stat and --name-only summarise it as git does. SESSION defaults to the latest.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "color", Value: "auto", Usage: "auto, always or never"},
			&cli.BoolFlag{Name: "stat", Usage: "a diffstat instead of the patch: lines changed per file, then the totals"},
			&cli.BoolFlag{Name: "name-only", Usage: "only the names of the changed files, one a line"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			si, err := changesSession(c)
			if err != nil {
				return err
			}
			patch, _, err := overlay.ReadSessionPatch(si.Dir)
			if err != nil {
				return err
			}
			tty := changesIsTerminal(os.Stdout)
			var color bool
			switch c.String("color") {
			case "auto":
				color = tty && os.Getenv("NO_COLOR") == ""
			case "always":
				color = true
			case "never":
			default:
				return fmt.Errorf("--color %q: use auto, always or never", c.String("color"))
			}
			// On a terminal, or colored for a pager, the patch goes through
			// the sanitizer; piped plain it stays byte-exact for git apply.
			if c.Bool("stat") || c.Bool("name-only") {
				return writeDiffSummary(os.Stdout, patch, c.Bool("stat"), c.Bool("name-only"), color)
			}
			if tty || color {
				patch = review.ColorDiff(patch, color)
			}
			_, err = os.Stdout.Write(patch)
			return err
		},
	})
}

// writeDiffSummary prints the patch's diffstat or its file names.
func writeDiffSummary(w io.Writer, patch []byte, stat, names, color bool) error {
	if stat && names {
		return errors.New("--stat and --name-only: give one of them")
	}
	fps, err := overlay.ParsePatch(patch)
	if err != nil {
		return err
	}
	if names {
		review.WriteNameOnly(w, fps)
	} else {
		review.WriteStat(w, fps, color)
	}
	return nil
}
