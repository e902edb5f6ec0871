// Command vibedom runs an AI coding agent in a hardware-isolated Linux VM
// whose only ways out are a reviewed patch and an allowlisting proxy.
//
// The command is thin: each subcommand lives in its own file, parses its
// flags, builds a configuration and calls one library function.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/termtext"
)

// commands is filled by each subcommand file's init function.
var commands []*cli.Command

// exitError carries a process exit code out of a command without printing
// anything more (the command has already said what happened).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	return exitError{code}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args))
}

func run(ctx context.Context, args []string) int {
	cmds := slices.Clone(commands)
	slices.SortFunc(cmds, func(a, b *cli.Command) int { return strings.Compare(a.Name, b.Name) })
	app := &cli.Command{
		Name:                  "vibedom",
		Usage:                 "run an AI coding agent in a sandboxed VM; get its work back as a reviewed patch",
		Commands:              cmds,
		EnableShellCompletion: true,
		ExitErrHandler:        func(context.Context, *cli.Command, error) {},
	}
	err := app.Run(ctx, args)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// An error may quote a guest path or a workspace name: print it
	// through the one sanitizer.
	fmt.Fprintf(os.Stderr, "vibedom: %s\n", termtext.Text(err.Error()))
	return 2
}
