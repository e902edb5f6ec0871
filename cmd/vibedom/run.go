package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/session"
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
			&cli.StringFlag{Name: "agent", Usage: "start a coding agent: claude, codex, opencode or shell (default: agent = … in ~/.vibedom/config, else a shell); words after -- go to the agent"},
			&cli.BoolFlag{Name: "root", Usage: "run the command or shell as root in the guest (default: the unprivileged agent user)"},
			&cli.BoolFlag{Name: "no-review", Usage: "do not collect the agent's changes at the end"},
			&cli.BoolFlag{Name: "ssh-agent", Usage: "forward an SSH agent holding only the deploy key (vibedom auth ssh-key), so git can push over SSH; the key never enters the VM, every signature is logged"},
			&cli.StringFlag{Name: "arch", Usage: "guest architecture: amd64 or arm64 (default: the host's)"},
			&cli.StringFlag{Name: "preflight", Usage: "secrets scan before boot: prompt (ask on a terminal), warn (report and go on), strict (refuse on unapproved HIGH), off", Value: "prompt"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print no progress lines"},
			&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "start the session in the background, print its name and return (vibedom attach NAME joins it)"},
			&cli.BoolFlag{Name: "json", Usage: "with --detach: print the session's name, host pid and log as JSON"},
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
	if c.Bool("shell") && len(command) > 0 {
		return errors.New("--shell and a command exclude each other: drop one")
	}
	mem, err := parseSize(c.String("memory"))
	if err != nil {
		return fmt.Errorf("--memory: %w", err)
	}
	if c.Int("cpus") < 1 || c.Int("cpus") > 64 {
		return fmt.Errorf("--cpus must be between 1 and 64, got %d", c.Int("cpus"))
	}
	var resolves []egress.Resolve
	for _, spec := range c.StringSlice("resolve") {
		r, err := egress.ParseResolve(spec)
		if err != nil {
			return err
		}
		resolves = append(resolves, r)
	}
	for _, f := range c.StringSlice("ca-file") {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
	}
	engine := c.String("proxy-engine")
	if c.Bool("inspect") {
		switch {
		case c.Bool("no-network"):
			return errors.New("--inspect shows the guest's network traffic, and --no-network gives it none: drop one")
		case engine != "" && engine != "mitmproxy":
			return fmt.Errorf("--inspect runs the mitmproxy engine; drop --proxy-engine %s", engine)
		case c.Bool("quiet"):
			return errors.New("--quiet would hide the live view's address, which --inspect prints as a progress line: drop --quiet")
		}
		engine = "mitmproxy"
	}
	if engine == "" {
		engine = "go"
		if h, err := session.DefaultHome(); err == nil {
			cfg, err := session.ReadConfig(h)
			if err != nil {
				return err
			}
			if cfg.ProxyEngine != "" {
				engine = cfg.ProxyEngine
			}
		}
	}
	if !slices.Contains(session.ProxyEngines, engine) {
		return fmt.Errorf("--proxy-engine must be go or mitmproxy, got %q", engine)
	}
	if engine == "mitmproxy" && !c.Bool("no-network") {
		// Fail before anything boots, with the version found and needed:
		// the release `vibedom init --with-mitmproxy` installed, else PATH's.
		mitmdump := ""
		if h, err := session.DefaultHome(); err == nil {
			mitmdump = netfilter.PreferredMitmdump(filepath.Join(string(h), netfilter.MitmproxyDirName))
		}
		if _, err := netfilter.MitmdumpVersion(ctx, mitmdump); err != nil {
			return err
		}
		if c.Bool("inspect") {
			if _, err := netfilter.MitmwebVersion(ctx, netfilter.MitmwebProgram(mitmdump, "")); err != nil {
				return err
			}
		}
	}
	mode, err := preflight.ParseMode(c.String("preflight"))
	if err != nil {
		return fmt.Errorf("--preflight: %w", err)
	}
	home, err := session.DefaultHome()
	if err != nil {
		return err
	}
	agent, err := chooseAgent(c.String("agent"), home)
	if err != nil {
		return err
	}
	o := session.Options{
		Home:      home,
		Workspace: ws,
		Name:      c.String("name"),
		CPUs:      int(c.Int("cpus")),
		MemoryMiB: int(mem >> 20),
		Arch:      vm.Arch(c.String("arch")),
		Command:   command,
		Stdin:     os.Stdin,
		Stdout:    os.Stdout,
		Stderr:    os.Stderr,
		Progress:  os.Stderr,
		Egress: session.EgressOptions{Disabled: c.Bool("no-network"), Allow: c.StringSlice("allow"),
			Resolve: resolves, CAFiles: c.StringSlice("ca-file"), ProxyEngine: engine, Inspect: c.Bool("inspect")},
		Preflight: session.PreflightOptions{Mode: mode},
		DLP:       session.DLPOptions{AllowPatterns: c.StringSlice("allow-pattern"), AllowContexts: c.StringSlice("allow-context")},
		Review:    session.ReviewOptions{ApplyAll: c.Bool("apply"), Skip: c.Bool("no-review")},
		AsRoot:    c.Bool("root"),
		SSHAgent:  session.SSHAgentOptions{Enabled: c.Bool("ssh-agent")},
	}
	if agent != "" && !(c.String("agent") == "" && len(command) > 0) {
		// An agent from the flag, or the configured default when no
		// command was given: the words after -- are its arguments.
		o.Agent = &session.AgentOptions{Name: agent, Args: command}
		o.Command = nil
		if agent != session.AgentShell {
			if err := checkAgentInstalled(agent, home, o.Arch); err != nil {
				return err
			}
			if !c.Bool("no-network") {
				if err := checkAgentKey(agent, home); err != nil {
					return err
				}
			}
		}
	}
	if o.Arch != "" && o.Arch != vm.ArchAMD64 && o.Arch != vm.ArchARM64 {
		return fmt.Errorf("--arch must be amd64 or arm64, got %q", o.Arch)
	}
	if err := egressMode(c, &o.Egress); err != nil {
		return err
	}
	if c.Bool("quiet") {
		o.Progress = nil
	}
	if os.Getenv(envHost) == "1" {
		return runHost(o)
	}
	if c.Bool("detach") {
		return detachRun(ctx, c, o)
	}
	if c.Bool("json") {
		return errors.New("--json goes with --detach (a foreground session's output is its agent's)")
	}
	// On a terminal the review prompt asks at the end even when a command
	// ran (without a TTY of its own); the terminal hosts the shell only
	// when there is no command.
	o.Terminal = session.NewTerminal(os.Stdin, os.Stdout)
	o.Review.Color = o.Terminal != nil && os.Getenv("NO_COLOR") == ""
	o.Interrupts = interrupts()
	res, err := session.Run(ctx, o)
	if err != nil {
		if res != nil && res.LogDir != "" {
			fmt.Fprintf(os.Stderr, "vibedom: logs are in %s\n", res.LogDir)
		}
		return err
	}
	return exitCode(res.ExitCode)
}

// parseSize reads sizes like 2G, 512M, 1536MiB or a plain number of MiB.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1 << 20)
	switch {
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, strings.TrimSuffix(t, "G")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, strings.TrimSuffix(t, "K")
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n <= 0 || n > 1<<20 {
		return 0, fmt.Errorf("%q is not a size: use e.g. 2G or 512M", s)
	}
	v := int64(n * float64(mult))
	if v < 128<<20 {
		return 0, fmt.Errorf("%q is too small: the VM needs at least 128M", s)
	}
	return v, nil
}

// chooseAgent is --agent, else the config's default agent, else "".
func chooseAgent(flag string, home session.Home) (string, error) {
	name := flag
	if name == "" {
		cfg, err := session.ReadConfig(home)
		if err != nil {
			return "", err
		}
		name = cfg.Agent
	}
	if name == "" {
		return "", nil
	}
	if name == session.AgentShell {
		return name, nil
	}
	if _, err := agents.ParseList(name); err != nil {
		return "", fmt.Errorf("--agent: %w (or shell)", err)
	}
	return name, nil
}

// checkAgentInstalled refuses, before anything starts, an agent that
// `vibedom init --agents` has not fetched for this guest.
func checkAgentInstalled(name string, home session.Home, arch vm.Arch) error {
	if arch == "" {
		arch = session.HostArch()
	}
	a, err := agents.GuestArch(string(arch))
	if err != nil {
		return err
	}
	libc := image.GuestLibc(home, arch)
	if libc == "" {
		return fmt.Errorf("--agent %s needs the guest image: run `vibedom init --agents %s`", name, name)
	}
	_, err = agents.FindAgent(string(home), name, a, libc)
	return err
}

// agentProviders are the providers whose key each agent can use.
var agentProviders = map[string][]string{"claude": {"anthropic"}, "codex": {"openai"}, "opencode": {"anthropic", "openai"}}

// checkAgentKey refuses, before anything starts, an agent with network and
// no API key for it on the host (the guest never gets one of its own).
func checkAgentKey(agent string, home session.Home) error {
	ks, err := credentials.Load(string(home), os.Getenv)
	if err != nil {
		return err
	}
	want := agentProviders[agent]
	for _, k := range ks {
		if slices.Contains(want, k.Provider.Name) {
			return nil
		}
	}
	var how []string
	for _, name := range want {
		p, _ := credentials.Lookup(name)
		how = append(how, "$"+p.Env+" or `vibedom auth set "+name+"`")
	}
	return fmt.Errorf("--agent %s needs an API key on the host (%s); the VM only ever gets a placeholder, and subscription logins are not carried into it", agent, strings.Join(how, ", or "))
}
