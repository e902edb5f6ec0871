package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

// The live egress commands: allow and deny change a running session's
// policy through its host's control socket (session/egress_live.go);
// `policy show NAME` and `policy check --session NAME` read it.

func init() {
	saveFlag := &cli.BoolFlag{Name: "save", Usage: "also append the rules to ~/.vibedom/trusted_domains.txt (user scope, later sessions too)"}
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON"}
	commands = append(commands,
		&cli.Command{
			Name:      "allow",
			Usage:     "let a running session reach more names (new connections see it at once)",
			ArgsUsage: "SESSION RULE…",
			Description: `Adds allow rules to the running session's egress policy, session scope
(with --save also user scope). RULE is written as in trusted_domains.txt:
example.com, *.example.com, example.com:8443, example.com:*, 192.0.2.7.
Deny rules still beat allow rules; no rule makes loopback, link-local
(metadata), the host's own or private addresses reachable.`,
			Flags:  []cli.Flag{saveFlag, jsonFlag},
			Action: liveRuleAction(session.EgressAllow),
		},
		&cli.Command{
			Name:      "deny",
			Usage:     "stop a running session reaching names; its open connections to them are closed",
			ArgsUsage: "SESSION RULE…",
			Description: `Adds deny rules (example.com, *.example.com, example.com:80; the "!" is
optional) to the running session's egress policy. New connections and DNS
questions are refused at once, and open connections the rules cover are
closed.`,
			Flags:  []cli.Flag{saveFlag, jsonFlag},
			Action: liveRuleAction(session.EgressDeny),
		},
	)
}

// run's egress flags (run.go lists them): --egress, --ask-timeout, --no-mitm.
var (
	egressFlag     = &cli.StringFlag{Name: "egress", Usage: "what happens to a name no rule decides: deny (refused at once) or ask (held while you are asked: vibedom watch NAME, a bell and title on the attached terminal); default: egress = … in ~/.vibedom/config, else deny"}
	noMITMFlag     = &cli.StringSliceFlag{Name: "no-mitm", Usage: "pass TLS to this allowed `HOST` through uninspected, for a client that pins its certificate (repeatable; the SNI must name it; never a model provider's host; logged as uninspected)"}
	askTimeoutFlag = &cli.DurationFlag{Name: "ask-timeout", Usage: "with --egress ask: how long a question waits for an answer before the request is denied (default: ask-timeout = … in ~/.vibedom/config, else 60s)"}
)

// egressMode fills o's ask mode from the flags and ~/.vibedom/config.
func egressMode(c *cli.Command, o *session.EgressOptions) error {
	mode, timeout := c.String("egress"), c.Duration("ask-timeout")
	if mode == "" || timeout == 0 {
		if h, err := home.Default(); err == nil {
			cfg, err := session.ReadConfig(h)
			if err != nil {
				return err
			}
			if mode == "" {
				mode = cfg.Egress
			}
			if timeout == 0 {
				timeout = cfg.AskTimeout
			}
		}
	}
	switch mode {
	case "", session.EgressModeDeny:
		if c.IsSet("ask-timeout") {
			return fmt.Errorf("--ask-timeout goes with --egress ask")
		}
	case session.EgressModeAsk:
		if o.Disabled {
			return fmt.Errorf("--egress ask asks about network names, and --no-network gives the VM none: drop one")
		}
	default:
		return fmt.Errorf("--egress must be ask or deny, got %q", mode)
	}
	if timeout < 0 || c.IsSet("ask-timeout") && (timeout < time.Second || timeout > time.Hour) {
		return fmt.Errorf("--ask-timeout must be from 1s to 1h, got %v", timeout)
	}
	o.Mode, o.AskTimeout = mode, timeout
	o.NoMITM = c.StringSlice("no-mitm")
	if len(o.NoMITM) > 0 && o.Disabled {
		return fmt.Errorf("--no-mitm names a host, and --no-network gives the VM no network: drop one")
	}
	return nil
}

// egressDo sends one OpEgress request to the session named name.
func egressDo(name string, req session.EgressRequest) (*session.EgressReply, error) {
	home, err := home.Default()
	if err != nil {
		return nil, err
	}
	i, err := session.FindSession(home, name)
	if err != nil {
		return nil, err
	}
	conn, err := session.DialControl(i)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rep, err := conn.Do(session.ControlRequest{Op: session.OpEgress, Egress: &req}, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("session %s: %w", i.Name, err)
	}
	if rep.Egress == nil {
		return nil, fmt.Errorf("session %s: its host does not know live egress rules (it runs an older vibedom): stop it and start a new one", i.Name)
	}
	return rep.Egress, nil
}

func liveRuleAction(action string) cli.ActionFunc {
	return func(_ context.Context, c *cli.Command) error {
		if c.Args().Len() < 2 {
			return fmt.Errorf("give a session and at least one rule: `vibedom %s SESSION RULE…` (`vibedom list` shows sessions)", action)
		}
		rep, err := egressDo(c.Args().First(), session.EgressRequest{Action: action, Rules: c.Args().Slice()[1:], Save: c.Bool("save")})
		if err != nil {
			return err
		}
		out := cmdOut(c)
		if c.Bool("json") {
			return writeJSON(out, rep)
		}
		verb := map[string]string{session.EgressAllow: "allowed", session.EgressDeny: "denied"}[action]
		for _, r := range rep.Rules {
			fmt.Fprintf(out, "session %s: %s %s (%s scope): new connections see it now\n",
				termtext.Line(rep.Session), verb, termtext.Line(strings.TrimPrefix(r.Rule, "!")), r.Scope)
		}
		if rep.Saved != "" {
			fmt.Fprintf(out, "saved to %s\n", termtext.Line(rep.Saved))
		}
		if action == session.EgressDeny {
			fmt.Fprintf(out, "closed %d open connection%s it covers\n", rep.Closed, plural(rep.Closed))
		}
		return nil
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// policyShowSession prints a running session's rules in effect.
func policyShowSession(c *cli.Command, name string) error {
	rep, err := egressDo(name, session.EgressRequest{Action: session.EgressShow})
	if err != nil {
		return err
	}
	out := cmdOut(c)
	if c.Bool("json") {
		return writeJSON(out, rep)
	}
	writeLiveRules(out, rep)
	return nil
}

func writeLiveRules(w io.Writer, rep *session.EgressReply) {
	fmt.Fprintf(w, "session %s: egress rules in effect (a deny rule beats any allow rule)\n", termtext.Line(rep.Session))
	width := 0
	for _, r := range rep.Rules {
		width = max(width, len(r.Rule))
	}
	for _, r := range rep.Rules {
		verdict := "allow"
		if r.Deny {
			verdict = "deny "
		}
		since := ""
		if r.Live {
			since = "  since " + r.Since.Local().Format("15:04:05")
		}
		// Rules and sources may come from the workspace's file.
		fmt.Fprintf(w, "  %s  %-*s  %-9s  %s%s\n", verdict, width, termtext.Line(r.Rule), r.Scope, termtext.Line(r.Source), since)
	}
}

// policyCheckSession decides HOST:PORT as the running session would now.
func policyCheckSession(c *cli.Command, name, host string, port uint16) error {
	rep, err := egressDo(name, session.EgressRequest{Action: session.EgressCheck, Name: host, Port: port})
	if err != nil {
		return err
	}
	d := rep.Check
	if d == nil {
		return fmt.Errorf("session %s gave no decision", termtext.Line(name))
	}
	out := cmdOut(c)
	if c.Bool("json") {
		if err := writeJSON(out, d); err != nil {
			return err
		}
	} else {
		verdict := "deny "
		if d.Allow {
			verdict = "allow"
		}
		target := d.Name + ":" + strconv.Itoa(int(d.Port))
		if strings.Contains(d.Name, ":") {
			target = "[" + d.Name + "]:" + strconv.Itoa(int(d.Port))
		}
		fmt.Fprintf(out, "%s  %s  (session %s, now)\n", verdict, termtext.Line(target), termtext.Line(rep.Session))
		if d.Rule != "" {
			fmt.Fprintf(out, "  rule    %s\n  source  %s\n  scope   %s\n  since   %s\n", termtext.Line(d.Rule), termtext.Line(d.Source),
				d.Scope, d.Since.Local().Format(time.DateTime))
		}
		fmt.Fprintf(out, "  reason  %s\n", termtext.Line(d.Reason))
		if !d.Allow {
			fmt.Fprintf(out, "  allow it with `vibedom allow %s RULE`\n", termtext.Line(rep.Session))
		}
	}
	if !d.Allow {
		return exitCode(1)
	}
	return nil
}

// policyShow lists a session's live rules when its argument names a
// session, and is policyStatus otherwise (a folder: "." or a path).
func policyShow(ctx context.Context, c *cli.Command) error {
	arg := c.Args().First()
	if c.Args().Len() == 1 && session.ValidName(arg) && !strings.ContainsAny(arg, `/\`) {
		if h, err := home.Default(); err == nil {
			if _, err := os.Stat(h.Session(arg)); err == nil {
				return policyShowSession(c, arg)
			}
		}
		if fi, err := os.Stat(arg); err != nil || !fi.IsDir() {
			return fmt.Errorf("no session called %q (`vibedom list` shows them) and no folder of that name", arg)
		}
	}
	return policyStatus(ctx, c)
}
