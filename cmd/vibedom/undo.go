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
			"created files). A path you changed after the apply is kept, and that apply stays undoable:\n" +
			"--force --backup ID restores the kept paths too, after backing up your versions. --force only\n" +
			"ever touches the apply named. Run undo again to undo the apply before. Whatever an undo\n" +
			"overwrites is backed up: --backup with the ID it prints puts it back. SESSION defaults to the latest.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "backup", Usage: "undo this apply (or undo) `ID` instead of the latest (see --list)"},
			&cli.BoolFlag{Name: "force", Usage: "also restore paths changed since the apply (needs --backup; your versions are backed up first)"},
			&cli.BoolFlag{Name: "list", Usage: "list the session's applies and undos, oldest first"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			si, err := changesSession(c)
			if err != nil {
				return err
			}
			if c.Bool("list") {
				list, err := overlay.ListBackups(si.Dir)
				if err != nil {
					return err
				}
				for _, b := range list {
					what := "apply"
					if b.Undo {
						what = "undo of " + b.Of
					}
					fmt.Fprintf(os.Stdout, "  %s  %s  %s\n", b.ID, what, b.State)
				}
				return nil
			}
			rep, err := overlay.Undo(ctx, si.Dir, si.Workspace, overlay.UndoOptions{Force: c.Bool("force"), BackupID: c.String("backup")})
			if rep != nil {
				for _, p := range rep.Restored {
					fmt.Fprintf(os.Stdout, "  %s  restored\n", overlay.DisplayPath(p))
				}
				for _, k := range rep.Kept {
					fmt.Fprintf(os.Stdout, "  %s  %s\n", overlay.DisplayPath(k.Path), termtext.Inline(fmt.Sprint(k.Err)))
				}
				if rep.UndoBackupID != "" {
					fmt.Fprintf(os.Stdout, "What this undo overwrote is backed up: `vibedom undo --backup %s` puts it back.\n", rep.UndoBackupID)
				}
				if len(rep.Kept) > 0 {
					fmt.Fprintf(os.Stdout, "Apply %s stays undoable; the paths above were kept. To undo an earlier apply instead:\n"+
						"`vibedom undo --list`, then `vibedom undo --backup ID`.\n", rep.BackupID)
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
