package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "doctor",
		Usage: "check this host for sessions: keys and their permissions, the hypervisor, the image; say what to fix",
		Description: `Exits 1 when a check fails (a session would not start, or not safely);
warnings (slower than it could be) do not change the exit status.`,
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"}},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, err := home.Default()
			if err != nil {
				return err
			}
			r, err := session.Doctor(ctx, home)
			if err != nil {
				return err
			}
			w := c.Root().Writer
			if c.Bool("json") {
				if err := writeJSON(w, r); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(w, "vibedom doctor: %s guests on %s, home %s\n\n", r.Arch, r.Driver, termtext.Line(r.Home))
				fails, warns := 0, 0
				for _, ck := range r.Checks {
					mark := "ok  "
					switch ck.Status {
					case vm.CheckWarn:
						mark = "WARN"
						warns++
					case vm.CheckFail:
						mark = "FAIL"
						fails++
					}
					fmt.Fprintf(w, "  %s  %-26s %s\n", mark, ck.Name, termtext.Inline(ck.Detail))
					if ck.Fix != "" {
						fmt.Fprintf(w, "        %-26s fix: %s\n", "", termtext.Inline(ck.Fix))
					}
				}
				fmt.Fprintf(w, "\n%d checks: %d failed, %d warnings\n", len(r.Checks), fails, warns)
			}
			if r.Failed() {
				return exitCode(1)
			}
			return nil
		},
	})
}
