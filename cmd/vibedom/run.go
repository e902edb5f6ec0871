package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "run",
		Usage:     "boot a VM on a project and run a shell, or a command, in it",
		ArgsUsage: "PATH [-- COMMAND [ARGS…]]",
		Description: `The project at PATH is shared read-only; the guest works in /work, an overlay
over it. Without a command you get a shell in /work on your terminal. With
one (after --) it runs without a TTY, its output streams to yours, and vibedom
exits with its exit code. When it ends, vibedom shows what changed and asks
what to apply (without a terminal nothing is applied unless --apply).`,
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "cpus", Usage: "virtual CPUs", Value: 2},
			&cli.StringFlag{Name: "memory", Usage: "guest memory, e.g. 2G or 512M", Value: "2G"},
			&cli.StringFlag{Name: "name", Usage: "session name (default: the folder's name plus a random suffix)"},
			&cli.BoolFlag{Name: "shell", Usage: "attach an interactive shell (the default without a command)"},
			&cli.StringSliceFlag{Name: "allow", Usage: "also allow this egress rule for this session (repeatable), e.g. --allow registry.npmjs.org"},
			&cli.BoolFlag{Name: "no-network", Usage: "give the VM no network interface at all"},
			egressFlag, askTimeoutFlag, noMITMFlag, // egress.go
			&cli.StringSliceFlag{Name: "resolve", Usage: "connect to this address for an allowed name, like curl's --resolve (repeatable): NAME:PORT:ADDRESS[:PORT]"},
			&cli.StringFlag{Name: "proxy-engine", Usage: "the proxy that inspects the guest's traffic: go (built in) or mitmproxy (the mitmdump that vibedom init --with-mitmproxy installed, else a mitmdump ≥ 8.1 on PATH, that vibedom starts for the session); default: proxy-engine = … in ~/.vibedom/config, else go"},
			&cli.BoolFlag{Name: "inspect", Usage: "watch the requests as sent upstream (after the DLP) in mitmweb's web UI, read-only, on 127.0.0.1 (its URL is printed); implies --proxy-engine mitmproxy"},
			&cli.StringSliceFlag{Name: "ca-file", Usage: "also trust the CA certificates in this PEM file for upstream TLS (repeatable)"},
			&cli.StringSliceFlag{Name: "allow-pattern", Usage: "never redact this value in what the agent sends (repeatable; re:REGEXP for a pattern), e.g. --allow-pattern 'Pearl St'"},
			&cli.StringSliceFlag{Name: "allow-context", Usage: "let this category through to every destination (repeatable), e.g. --allow-context internal_ips (categories: vibedom scrub --help)"},
			&cli.BoolFlag{Name: "apply", Usage: "apply every change at the end without asking"},
			&cli.StringFlag{Name: "agent", Usage: "start a coding agent: claude, codex, opencode, gemini, npm:PACKAGE or shell (default: agent = … in ~/.vibedom/config, else a shell); words after -- go to the agent"},
			&cli.BoolFlag{Name: "root", Usage: "run the command or shell as root in the guest (default: the unprivileged agent user)"},
			&cli.BoolFlag{Name: "no-review", Usage: "do not collect the agent's changes at the end"},
			&cli.BoolFlag{Name: "ssh-agent", Usage: "forward an SSH agent holding only the deploy key (vibedom auth ssh-key), so git can push over SSH; the key never enters the VM, every signature is logged"},
			&cli.StringFlag{Name: "arch", Usage: "guest architecture: amd64 or arm64 (default: the host's)"},
			&cli.StringFlag{Name: "preflight", Usage: "secrets scan before boot: prompt (ask on a terminal), warn (report and go on), strict (refuse on unapproved HIGH), off", Value: "prompt"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print no progress lines"},
			&cli.BoolFlag{Name: "timings", Usage: "print where the time to a ready guest went: host preparation steps, VM start, guest boot (kernel, modules, mounts), SSH handshake (session.log always has it)"},
			&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "start the session in the background, print its name and return (vibedom attach NAME joins it)"},
			&cli.BoolFlag{Name: "json", Usage: "with --detach: print the session's name, host pid and log as JSON"},
			publishFlag(),
		},
		Action: runAction,
	})
}

func runAction(ctx context.Context, c *cli.Command) error {
	args := c.Args().Slice()
	if len(args) == 0 {
		return errors.New("no project given: run `vibedom run PATH` (e.g. vibedom run .)")
	}
	ws, command := args[0], args[1:]
	if len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	if c.Bool("json") && !c.Bool("detach") {
		return errors.New("--json goes with --detach (a foreground session's output is its agent's)")
	}
	ports, err := publishedPorts(c)
	if err != nil {
		return err
	}
	o := session.StartOptions{
		Session: session.Options{
			Workspace:   ws,
			Name:        c.String("name"),
			CPUs:        int(c.Int("cpus")),
			Arch:        vm.Arch(c.String("arch")),
			Command:     command,
			Stdin:       os.Stdin,
			Stdout:      os.Stdout,
			Stderr:      os.Stderr,
			Progress:    os.Stderr,
			ShowTimings: c.Bool("timings"),
			Egress: session.EgressOptions{Disabled: c.Bool("no-network"), Allow: c.StringSlice("allow"),
				CAFiles: c.StringSlice("ca-file"), ProxyEngine: c.String("proxy-engine"), Inspect: c.Bool("inspect")},
			DLP:      policy.DLPOptions{AllowPatterns: c.StringSlice("allow-pattern"), AllowContexts: c.StringSlice("allow-context")},
			Review:   session.ReviewOptions{ApplyAll: c.Bool("apply"), Skip: c.Bool("no-review")},
			AsRoot:   c.Bool("root"),
			SSHAgent: session.SSHAgentOptions{Enabled: c.Bool("ssh-agent")},
			Ports:    ports,
		},
		AgentName:     c.String("agent"),
		Shell:         c.Bool("shell"),
		Memory:        c.String("memory"),
		Resolve:       c.StringSlice("resolve"),
		PreflightMode: c.String("preflight"),
		Quiet:         c.Bool("quiet"),
		Detach:        c.Bool("detach"),
		HostSilent:    c.Bool("json"),
	}
	if err := egressMode(c, &o.Session.Egress); err != nil {
		return err
	}
	if !o.Detach {
		o.Session.Interrupts = interrupts()
	}
	res, err := session.Start(ctx, o)
	if err != nil {
		if res != nil && res.LogDir != "" {
			fmt.Fprintf(os.Stderr, "vibedom: logs are in %s\n", res.LogDir)
		}
		return err
	}
	if h := res.Host; h != nil {
		w := c.Root().Writer
		if c.Bool("json") {
			return writeJSON(w, map[string]any{"name": res.Name, "pid": h.PID, "host_log": h.Log, "workspace": h.Workspace})
		}
		fmt.Fprintf(w, "%s\n", termtext.Line(res.Name))
		fmt.Fprintf(os.Stderr, "vibedom: session %s runs in the background (host pid %d, its output in %s)\n", termtext.Line(res.Name), h.PID, termtext.Line(h.Log))
		fmt.Fprintf(os.Stderr, "vibedom: vibedom attach %[1]s · vibedom status %[1]s · vibedom stop %[1]s\n", termtext.Line(res.Name))
		return nil
	}
	return exitCode(res.ExitCode)
}
