package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "list",
		Usage: "list sessions, newest first, with their status, project and whether a patch waits for review",
		Description: `A session whose state says it is running but whose process is gone is shown as
"crashed" (its scratch disk and logs are kept: vibedom review still works on a
patch it wrote).`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print a JSON array"}},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, err := home.Default()
			if err != nil {
				return err
			}
			all, err := session.ListSessions(home)
			if err != nil {
				return err
			}
			type row struct {
				Name      string    `json:"name"`
				Status    string    `json:"status"`
				Workspace string    `json:"workspace"`
				Created   time.Time `json:"created"`
				Patch     bool      `json:"patch_pending"`
				LogDir    string    `json:"log_dir"`
				Problem   string    `json:"problem,omitempty"`
			}
			rows := []row{}
			for _, s := range all {
				rows = append(rows, row{Name: s.Name, Status: statusLabel(s), Workspace: s.Workspace, Created: s.Created,
					Patch: s.PatchPending(), LogDir: s.LogDir, Problem: s.Problem})
			}
			w := c.Root().Writer
			if c.Bool("json") {
				b, err := json.MarshalIndent(rows, "", "  ")
				if err != nil {
					return err
				}
				_, err = w.Write(termtext.JSON(append(b, '\n')))
				return err
			}
			if len(rows) == 0 {
				fmt.Fprintln(w, "no sessions yet: start one with `vibedom run PATH`")
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATUS\tCREATED\tPATCH\tWORKSPACE")
			for _, r := range rows {
				patch := ""
				if r.Patch {
					patch = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", termtext.Line(r.Name), termtext.Line(r.Status),
					r.Created.Local().Format("2006-01-02 15:04"), patch, termtext.Line(r.Workspace))
			}
			return tw.Flush()
		},
	})
}
