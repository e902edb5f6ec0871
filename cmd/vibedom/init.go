package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/session"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "init",
		Usage: "set up ~/.vibedom: MITM CA, deploy key, DLP audit key, allowlist; check the hypervisor and image",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"}},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, err := session.DefaultHome()
			if err != nil {
				return err
			}
			r, err := session.Init(ctx, home)
			if err != nil {
				return err
			}
			w := c.Root().Writer
			if c.Bool("json") {
				if err := writeJSON(w, r); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(w, "vibedom is set up in %s\n\n", r.Home)
				if r.DeployKeyNew {
					fmt.Fprintln(w, "A deploy key was made. Add this public key to your git host (e.g. GitLab: Settings > SSH Keys)")
				} else {
					fmt.Fprintln(w, "Deploy key (add it to your git host if you have not yet):")
				}
				fmt.Fprintf(w, "\n  %s\n\n", r.DeployKey)
				fmt.Fprintf(w, "MITM CA: %s (%s); its key never leaves this machine.\n", r.CACert, r.CAFingerprint)
				fmt.Fprintf(w, "DLP audit key: %s (decrypts what was scrubbed: vibedom logs --decrypt)\n", r.AuditKey)
				fmt.Fprintf(w, "Allowed domains: edit %s\n", r.TrustedFile)
				for _, p := range r.Problems {
					fmt.Fprintf(w, "\nBefore `vibedom run` works: %s\n", p)
				}
			}
			if len(r.Problems) > 0 {
				return exitCode(1)
			}
			return nil
		},
	})
}
