package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/wstrust"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "policy",
		Usage: "inspect the egress policy",
		Commands: []*cli.Command{{
			Name:      "check",
			Usage:     "say whether the guest may reach HOST[:PORT] or URL, and which rule decides",
			ArgsUsage: "HOST[:PORT]|URL",
			Description: "Merges the built-in rules, ~/.vibedom/trusted_domains.txt, the workspace's\n" +
				".vibedom/trusted_domains.txt and --allow rules, as a session would, and decides.\n" +
				"The port defaults to 443 (80 for http:// and ws:// URLs).\n" +
				"Exits 0 when allowed, 1 when denied, 2 when the policy cannot be loaded.",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print the decision as JSON"},
				&cli.StringFlag{Name: "workspace", Value: ".", Usage: "the workspace whose `PATH`/.vibedom/trusted_domains.txt applies"},
				&cli.StringSliceFlag{Name: "allow", Usage: "an extra `RULE`, as `vibedom run --allow` takes it (repeatable)"},
				&cli.StringFlag{Name: "session", Usage: "decide as the running session `NAME` does now (live rules included)"},
			},
			Action: policyCheck,
		}, {
			Name:      "approve",
			Usage:     "approve what the workspace's .vibedom files allow (egress rules, DLP allowlist)",
			ArgsUsage: "[WORKSPACE]",
			Description: "A cloned repository can ship .vibedom/trusted_domains.txt and .vibedom/dlp_allowlist.txt.\n" +
				"Their deny rules apply at once; what they allow (allow rules, values exempt from scrubbing)\n" +
				"applies only once you approved the file's exact content here. A changed file is asked about again.\n" +
				"Prints what would be approved and asks on the terminal; --yes approves without asking.",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "yes", Aliases: []string{"y"}, Usage: "approve without asking (for scripts)"},
				&cli.BoolFlag{Name: "json", Usage: "print the files' state as JSON (with --yes: after approving)"},
			},
			Action: policyApprove,
		}, {
			Name:      "show",
			Usage:     "list a running session's rules in effect (live ones included); with a WORKSPACE, as status",
			ArgsUsage: "SESSION|[WORKSPACE]",
			Description: "With the name of a session, lists the rules its host applies now, with their scope\n" +
				"(builtin, user, workspace, session) and source. Otherwise it is `vibedom policy status`.",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			},
			Action: policyShow,
		}, {
			Name:        "status",
			Usage:       "say whether the workspace's .vibedom files are approved, unapproved or changed",
			ArgsUsage:   "[WORKSPACE]",
			Description: "Exits 0 when nothing waits for approval, 1 when something does, 2 on error.",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "json", Usage: "print the state as JSON"},
			},
			Action: policyStatus,
		}},
	})
}

// loadTrust reads the trust state of the workspace named by the command's
// first argument (the current folder when none).
func loadTrust(c *cli.Command) (home.Home, *wstrust.Trust, error) {
	if c.Args().Len() > 1 {
		return "", nil, fmt.Errorf("give at most one WORKSPACE")
	}
	arg := c.Args().First()
	if arg == "" {
		arg = "."
	}
	ws, err := wstrust.CheckWorkspace(arg)
	if err != nil {
		return "", nil, err
	}
	h, err := home.Default()
	if err != nil {
		return "", nil, err
	}
	t, err := policy.LoadTrust(h, ws)
	return h, t, err
}

func policyStatus(_ context.Context, c *cli.Command) error {
	_, t, err := loadTrust(c)
	if err != nil {
		return err
	}
	out := cmdOut(c)
	if c.Bool("json") {
		b, _ := json.MarshalIndent(t, "", "  ")
		fmt.Fprintf(out, "%s\n", b)
	} else {
		writeTrust(out, t)
	}
	if len(t.NeedsApproval()) > 0 {
		return exitCode(1)
	}
	return nil
}

func policyApprove(_ context.Context, c *cli.Command) error {
	h, t, err := loadTrust(c)
	if err != nil {
		return err
	}
	out := cmdOut(c)
	pending := t.NeedsApproval()
	if len(pending) == 0 {
		if c.Bool("json") {
			b, _ := json.MarshalIndent(t, "", "  ")
			fmt.Fprintf(out, "%s\n", b)
		} else {
			writeTrust(out, t)
			fmt.Fprintln(out, "nothing to approve")
		}
		return nil
	}
	if !c.Bool("yes") {
		if c.Bool("json") || !term.IsTerminal(int(os.Stdin.Fd())) {
			return errors.New("approve asks on a terminal and stdin is not one: run it in a terminal, or pass --yes after reading `vibedom policy status`")
		}
		writeTrust(out, t)
		fmt.Fprintf(out, "approve what these files allow for %s? [y/N] ", printable(t.Workspace))
		line, _ := bufio.NewReader(io.LimitReader(os.Stdin, 256)).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
			fmt.Fprintln(out, "not approved: nothing changed")
			return exitCode(1)
		}
	}
	if err := wstrust.Approve(h, t); err != nil {
		return err
	}
	if t, err = policy.LoadTrust(h, t.Workspace); err != nil {
		return err
	}
	if c.Bool("json") {
		b, _ := json.MarshalIndent(t, "", "  ")
		fmt.Fprintf(out, "%s\n", b)
		return nil
	}
	for _, f := range pending {
		entries := "entries"
		if len(f.Widening) == 1 {
			entries = "entry"
		}
		fmt.Fprintf(out, "approved %s (sha256 %s): %d %s\n", f.Rel, f.SHA256, len(f.Widening), entries)
	}
	return nil
}

// writeTrust prints each trust file's state and entries. Entries come from
// the workspace: they are printed only through printable.
func writeTrust(w io.Writer, t *wstrust.Trust) {
	fmt.Fprintf(w, "workspace %s\n", printable(t.Workspace))
	for _, f := range t.Files {
		switch {
		case !f.Present:
			fmt.Fprintf(w, "  %-30s  absent\n", f.Rel)
			continue
		case f.State == wstrust.None:
			fmt.Fprintf(w, "  %-30s  nothing to approve (allows nothing)\n", f.Rel)
		default:
			fmt.Fprintf(w, "  %-30s  %s\n", f.Rel, f.State)
		}
		for _, e := range f.Widening {
			fmt.Fprintf(w, "      allows  %s\n", printable(e))
		}
		for _, e := range f.Narrowing {
			fmt.Fprintf(w, "      denies  %s\n", printable(e))
		}
	}
}

// printable returns s as it is when every rune prints as itself, else
// Go-quoted: a workspace value never drives the terminal.
func printable(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func cmdOut(c *cli.Command) io.Writer {
	if w := c.Root().Writer; w != nil {
		return w
	}
	return os.Stdout
}

// policyCheckResult is the --json output of `vibedom policy check`.
type policyCheckResult struct {
	Input string `json:"input"`
	Name  string `json:"name"`
	Port  uint16 `json:"port"`
	egress.Decision
	// Ignored counts the workspace's allow rules left out until approved.
	Ignored int      `json:"ignored_rules,omitempty"`
	Notes   []string `json:"notes,omitempty"`
}

func policyCheck(_ context.Context, c *cli.Command) error {
	if c.Args().Len() != 1 {
		return fmt.Errorf("policy check takes one HOST[:PORT] or URL (e.g. `vibedom policy check api.openai.com:443`)")
	}
	input := c.Args().First()
	host, port, err := parseCheckTarget(input)
	if err != nil {
		return err
	}
	if name := c.String("session"); name != "" {
		if c.IsSet("workspace") || c.IsSet("allow") {
			return fmt.Errorf("--session decides with the session's own rules: leave out --workspace and --allow")
		}
		return policyCheckSession(c, name, host, port)
	}
	hm, err := home.Default()
	if err != nil {
		return err
	}
	trust := &wstrust.Trust{}
	ws, err := wstrust.CheckWorkspace(c.String("workspace"))
	switch {
	case err != nil && c.IsSet("workspace"):
		return err
	case err == nil:
		// Without --workspace, the current folder is the workspace when it
		// can be one (not "/").
		if trust, err = policy.LoadTrust(hm, ws); err != nil {
			return err
		}
	}
	pol, notes, err := policy.EgressPolicy(hm, trust, c.StringSlice("allow"))
	if err != nil {
		return err
	}
	name := host
	if ip, ok := egress.ParseAddr(host); ok {
		name = ip.String()
	} else if n, err := egress.NormalizeName(host); err == nil {
		name = n
	}
	res := policyCheckResult{Input: input, Name: name, Port: port, Decision: pol.Decide(host, port), Ignored: len(pol.Ignored()), Notes: notes}
	out := c.Root().Writer
	if out == nil {
		out = os.Stdout
	}
	if c.Bool("json") {
		b, _ := json.Marshal(res)
		fmt.Fprintf(out, "%s\n", termtext.JSON(b))
	} else {
		verdict := "deny "
		if res.Allow {
			verdict = "allow"
		}
		target := name + ":" + strconv.Itoa(int(port))
		if strings.Contains(name, ":") {
			target = "[" + name + "]:" + strconv.Itoa(int(port))
		}
		// Rules and their sources may come from the workspace's policy file.
		fmt.Fprintf(out, "%s  %s\n", verdict, termtext.Line(target))
		if res.Rule != "" {
			fmt.Fprintf(out, "  rule    %s\n  source  %s\n", termtext.Line(res.Rule), termtext.Line(res.Source))
		}
		fmt.Fprintf(out, "  reason  %s\n", termtext.Line(res.Reason))
		for _, n := range notes {
			fmt.Fprintf(out, "  note    %s\n", termtext.Inline(n))
		}
	}
	if !res.Allow {
		return exitCode(1)
	}
	return nil
}

// parseCheckTarget splits HOST, HOST:PORT, [IPv6]:PORT, a bare IPv6 address
// or a URL into host and port (443 by default; 80 for http and ws URLs).
func parseCheckTarget(s string) (string, uint16, error) {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return "", 0, fmt.Errorf("%q is not a URL with a host", s)
		}
		var def uint16
		switch strings.ToLower(u.Scheme) {
		case "https", "wss":
			def = 443
		case "http", "ws":
			def = 80
		}
		port, err := checkPort(u.Port(), def)
		if err != nil {
			return "", 0, fmt.Errorf("%q: %w", s, err)
		}
		return u.Hostname(), port, nil
	}
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		if h, p, err := net.SplitHostPort(s); err == nil {
			port, err := checkPort(p, 443)
			if err != nil {
				return "", 0, fmt.Errorf("%q: %w", s, err)
			}
			return h, port, nil
		}
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			return s[1 : len(s)-1], 443, nil
		}
		return "", 0, fmt.Errorf("%q is not HOST[:PORT]", s)
	}
	return s, 443, nil
}

func checkPort(p string, def uint16) (uint16, error) {
	if p == "" {
		if def == 0 {
			return 0, fmt.Errorf("no port and no known default for this scheme: add one")
		}
		return def, nil
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", p)
	}
	return uint16(n), nil
}
