package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/termtext"
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
			},
			Action: policyCheck,
		}},
	})
}

// policyCheckResult is the --json output of `vibedom policy check`.
type policyCheckResult struct {
	Input string `json:"input"`
	Name  string `json:"name"`
	Port  uint16 `json:"port"`
	netfilter.Decision
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
	home, err := vibedomHome()
	if err != nil {
		return err
	}
	ws, err := filepath.Abs(c.String("workspace"))
	if err != nil {
		return fmt.Errorf("workspace %q: %w", c.String("workspace"), err)
	}
	pol, err := netfilter.LoadPolicy(netfilter.PolicyConfig{
		UserFile:      filepath.Join(home, "trusted_domains.txt"),
		WorkspaceFile: netfilter.WorkspacePolicyFile(ws),
		Allow:         c.StringSlice("allow"),
	})
	if err != nil {
		return err
	}
	name := host
	if ip, ok := netfilter.ParseAddr(host); ok {
		name = ip.String()
	} else if n, err := netfilter.NormalizeName(host); err == nil {
		name = n
	}
	res := policyCheckResult{Input: input, Name: name, Port: port, Decision: pol.Decide(host, port)}
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
