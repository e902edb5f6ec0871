package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/netfilter"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/vm"
)

// StartOptions is `vibedom run` as the user asked for it: the flags, not yet
// completed. Start fills in the defaults (~/.vibedom/config's agent and
// proxy engine) and refuses, before anything boots, what cannot work.
type StartOptions struct {
	// Session holds the session's own options as given. Its Agent is set
	// by Start (from AgentName); Egress.Resolve from Resolve.
	Session Options
	// AgentName is --agent: claude, codex, opencode or shell; "" means the
	// config's default agent when no command was given, else none. The
	// words of Session.Command then go to the agent.
	AgentName string
	// Shell is --shell: an interactive shell, which a command excludes.
	Shell bool
	// Memory is --memory, e.g. 2G or 512M (ParseSize); "" keeps
	// Session.MemoryMiB.
	Memory string
	// Resolve are the --resolve specs (NAME:PORT:ADDRESS[:PORT]).
	Resolve []string
	// PreflightMode is --preflight (prompt, warn, strict, off); "" keeps
	// Session.Preflight.
	PreflightMode string
	// Quiet prints no progress lines.
	Quiet bool
	// Detach starts the session host in the background instead of running
	// the session here; HostSilent then relays none of the host's progress
	// lines while it starts (--json).
	Detach     bool
	HostSilent bool
}

// Start checks and completes a `vibedom run` request, then runs the session
// in this process (Run) or, with Detach, starts its host in the background
// and returns once the session runs (Result.Host is then set).
func Start(ctx context.Context, so StartOptions) (*Result, error) {
	o, err := so.complete(ctx)
	if err != nil {
		return nil, err
	}
	if so.Detach {
		return detach(ctx, o, !so.Quiet && !so.HostSilent)
	}
	return Run(ctx, o)
}

// complete turns the request into a session's Options: every check that
// can fail before anything is made, and every default from the config.
func (so StartOptions) complete(ctx context.Context) (Options, error) {
	o := so.Session
	if so.Shell && len(o.Command) > 0 {
		return o, errors.New("--shell and a command exclude each other: drop one")
	}
	if o.Home == "" {
		h, err := home.Default()
		if err != nil {
			return o, err
		}
		o.Home = h
	}
	if so.Memory != "" {
		mem, err := ParseSize(so.Memory)
		if err != nil {
			return o, fmt.Errorf("--memory: %w", err)
		}
		o.MemoryMiB = int(mem >> 20)
	}
	if o.CPUs < 1 || o.CPUs > 64 {
		return o, fmt.Errorf("--cpus must be between 1 and 64, got %d", o.CPUs)
	}
	o.Egress.Resolve = nil
	for _, spec := range so.Resolve {
		r, err := nfegress.ParseResolve(spec)
		if err != nil {
			return o, err
		}
		o.Egress.Resolve = append(o.Egress.Resolve, r)
	}
	for _, f := range o.Egress.CAFiles {
		if _, err := os.Stat(f); err != nil {
			return o, fmt.Errorf("--ca-file: %w", err)
		}
	}
	// The config is read only when a default is needed: a broken one does
	// not stop a run whose flags say everything.
	var cfg *Config
	config := func() (*Config, error) {
		if cfg != nil {
			return cfg, nil
		}
		c, err := ReadConfig(o.Home)
		cfg = c
		return c, err
	}
	engine, err := chooseEngine(o.Egress, so.Quiet, config)
	if err != nil {
		return o, err
	}
	o.Egress.ProxyEngine = engine
	if engine == "mitmproxy" && !o.Egress.Disabled {
		if err := netfilter.ProbeMitmproxy(ctx, string(o.Home), o.Egress.Inspect); err != nil {
			return o, err
		}
	}
	if so.PreflightMode != "" {
		mode, err := preflight.ParseMode(so.PreflightMode)
		if err != nil {
			return o, fmt.Errorf("--preflight: %w", err)
		}
		o.Preflight.Mode = mode
	}
	agent, err := chooseAgent(so.AgentName, config)
	if err != nil {
		return o, err
	}
	if agent != "" && !(so.AgentName == "" && len(o.Command) > 0) {
		// An agent from the flag, or the configured default when no
		// command was given: the words after -- are its arguments.
		o.Agent = &AgentOptions{Name: agent, Args: o.Command}
		o.Command = nil
		if agent != AgentShell {
			if err := checkAgentInstalled(agent, o.Home, o.Arch); err != nil {
				return o, err
			}
			if !o.Egress.Disabled {
				if err := checkAgentKey(agent, o.Home); err != nil {
					return o, err
				}
			}
		}
	}
	if err := checkArch(o.Arch); err != nil {
		return o, err
	}
	if so.Quiet {
		o.Progress = nil
	}
	if !so.Detach && !o.Detached {
		// On a terminal the review prompt asks at the end even when a
		// command ran (without a TTY of its own); the terminal hosts the
		// shell only when there is no command.
		in, _ := o.Stdin.(*os.File)
		out, _ := o.Stdout.(*os.File)
		o.Terminal = NewTerminal(in, out)
		o.Review.Color = o.Terminal != nil && os.Getenv("NO_COLOR") == ""
	}
	return o, nil
}

// ParseSize reads sizes like 2G, 512M, 1536MiB or a plain number of MiB,
// in bytes; a VM needs at least 128M.
func ParseSize(s string) (int64, error) {
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

// checkArch refuses a guest architecture vibedom does not boot.
func checkArch(a vm.Arch) error {
	if a != "" && a != vm.ArchAMD64 && a != vm.ArchARM64 {
		return fmt.Errorf("--arch must be amd64 or arm64, got %q", a)
	}
	return nil
}

// chooseEngine is --proxy-engine (mitmproxy with --inspect), else the
// config's proxy-engine, else go.
func chooseEngine(e EgressOptions, quiet bool, config func() (*Config, error)) (string, error) {
	engine := e.ProxyEngine
	if e.Inspect {
		switch {
		case e.Disabled:
			return "", errors.New("--inspect shows the guest's network traffic, and --no-network gives it none: drop one")
		case engine != "" && engine != "mitmproxy":
			return "", fmt.Errorf("--inspect runs the mitmproxy engine; drop --proxy-engine %s", engine)
		case quiet:
			return "", errors.New("--quiet would hide the live view's address, which --inspect prints as a progress line: drop --quiet")
		}
		engine = "mitmproxy"
	}
	if engine == "" {
		engine = "go"
		cfg, err := config()
		if err != nil {
			return "", err
		}
		if cfg.ProxyEngine != "" {
			engine = cfg.ProxyEngine
		}
	}
	if !slices.Contains(ProxyEngines, engine) {
		return "", fmt.Errorf("--proxy-engine must be go or mitmproxy, got %q", engine)
	}
	return engine, nil
}

// chooseAgent is --agent, else the config's default agent, else "".
func chooseAgent(flag string, config func() (*Config, error)) (string, error) {
	name := flag
	if name == "" {
		cfg, err := config()
		if err != nil {
			return "", err
		}
		name = cfg.Agent
	}
	if name == "" || name == AgentShell {
		return name, nil
	}
	if _, err := agents.ParseList(name); err != nil {
		return "", fmt.Errorf("--agent: %w (or shell)", err)
	}
	return name, nil
}

// checkAgentInstalled refuses, before anything starts, an agent that
// `vibedom init --agents` has not fetched for this guest.
func checkAgentInstalled(name string, h home.Home, arch vm.Arch) error {
	if arch == "" {
		arch = HostArch()
	}
	a, err := agents.GuestArch(string(arch))
	if err != nil {
		return err
	}
	if agents.IsNode(name) {
		// Any guest architecture; the lockfile and files are checked now.
		if _, err := agents.FindNode(string(h), name); err != nil {
			return err
		}
	}
	libc := image.GuestLibc(h, arch)
	if libc == "" {
		return fmt.Errorf("--agent %s needs the guest image: run `vibedom init --agents %s`", name, name)
	}
	if agents.IsNode(name) {
		return nil
	}
	_, err = agents.FindAgent(string(h), name, a, libc)
	return err
}

// agentProviders are the providers whose key each agent can use.
// An npm:PACKAGE agent has none listed: it gets whatever keys the host has.
var agentProviders = map[string][]string{"claude": {"anthropic"}, "codex": {"openai"}, "opencode": {"anthropic", "openai"}, "gemini": {"gemini"}}

// checkAgentKey refuses, before anything starts, an agent with network and
// neither an API key nor a subscription login for it on the host (the
// guest never gets one of its own).
func checkAgentKey(agent string, h home.Home) error {
	ks, err := credentials.Load(string(h), os.Getenv)
	if err != nil {
		return err
	}
	want, ok := agentProviders[agent]
	if !ok {
		return nil
	}
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
	if lk, err := credentials.LookupLogin(agent); err == nil {
		_, err := credentials.LoadLogin(string(h), lk)
		if err == nil {
			return nil
		}
		if !errors.Is(err, credentials.ErrNoLogin) {
			return err
		}
		how = append(how, "a subscription login: `vibedom auth import "+agent+"` or `vibedom auth login "+agent+"`")
	}
	return fmt.Errorf("--agent %s needs an API key or a subscription login on the host (%s); the VM only ever gets placeholders", agent, strings.Join(how, ", or "))
}
