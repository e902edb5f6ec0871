package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "preflight",
		Usage:     "scan a project for secrets with gitleaks, as `vibedom run` does before the VM starts",
		ArgsUsage: "PATH",
		Description: `Runs gitleaks' default rules (extended by ~/.vibedom/gitleaks.toml when present)
over PATH, files git ignores included, and lists each finding with its risk
(HIGH, MEDIUM, LOW) and the reason. Findings listed in PATH/.gitleaksignore or
approved earlier (PATH/.vibedom/approved_secrets.txt) do not count.

With --review, asks on the terminal about each unapproved finding and records
the approvals. With --json, prints the report as JSON (secrets redacted; the
schema is in docs/preflight.md).

Exit status: 0 when no finding is unapproved, 1 when some are, 2 on error.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON (secrets redacted)"},
			&cli.BoolFlag{Name: "review", Usage: "ask about the unapproved findings on this terminal and record approvals"},
		},
		Action: preflightAction,
	})
}

func preflightAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() != 1 {
		return errors.New("give one project folder: vibedom preflight PATH [--json | --review]")
	}
	if c.Bool("json") && c.Bool("review") {
		return errors.New("--json and --review exclude each other: drop one")
	}
	home, err := home.Default()
	if err != nil {
		return err
	}
	rep, err := preflight.Scan(ctx, policy.ScanOptions(home, c.Args().First()))
	if err != nil {
		return err
	}
	out := c.Root().Writer
	switch {
	case c.Bool("json"):
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode report: %w", err)
		}
		if _, err := out.Write(termtext.JSON(append(b, '\n'))); err != nil {
			return err
		}
	case c.Bool("review"):
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return errors.New("--review asks on a terminal and stdin is not one: run it in a terminal, or use --json")
		}
		o, err := preflight.Review(ctx, rep, os.Stdin, out, true, preflight.ModePrompt)
		if err != nil {
			return err
		}
		if o != preflight.OutcomeContinue {
			return exitCode(1)
		}
	default:
		if err := rep.WriteText(out); err != nil {
			return err
		}
	}
	if len(rep.Unapproved()) > 0 {
		return exitCode(1)
	}
	return nil
}
