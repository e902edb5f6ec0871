package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/session"
)

// initJSON is `vibedom init --json`: the home's set-up and the agents.
type initJSON struct {
	*session.InitResult
	Agents []agentJSON `json:"agents,omitempty"`
}

type agentJSON struct {
	agents.Manifest
	Dir        string `json:"dir"`
	BinaryPath string `json:"binary_path"`
	Fresh      bool   `json:"fresh"`
}

func init() {
	commands = append(commands, &cli.Command{
		Name:  "init",
		Usage: "set up ~/.vibedom: MITM CA, deploy key, DLP audit key, allowlist, agents; check the hypervisor and image",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.StringFlag{Name: "agents", Usage: "fetch and verify these agents (comma-separated: " + strings.Join(agents.Names(), ",") + ")"},
			&cli.BoolFlag{Name: "update-agents", Usage: "install the agent versions this vibedom pins for every agent already installed"},
			&cli.StringFlag{Name: "registry", Value: agents.DefaultRegistry, Usage: "npm registry to fetch agents from (tarballs must be on its host)"},
			&cli.StringFlag{Name: "agent-libc", Value: agents.LibcMusl, Usage: "guest C library the agents are built for: musl (the Alpine guest) or glibc"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, err := session.DefaultHome()
			if err != nil {
				return err
			}
			// Bad input is refused before anything is written.
			names, err := agents.ParseList(c.String("agents"))
			if err != nil {
				return err
			}
			arch, err := agents.GuestArch(runtime.GOARCH)
			if err != nil {
				return err
			}
			if err := agents.CheckRegistry(c.String("registry")); err != nil {
				return err
			}
			libc := c.String("agent-libc")
			var pins []agents.Pin
			for _, n := range names {
				p, err := agents.Lookup(n, arch, libc)
				if err != nil {
					return err
				}
				pins = append(pins, p)
			}
			if c.Bool("update-agents") {
				fmt.Fprintf(c.Root().ErrWriter, "Agent versions and their SHA-512 integrities are compiled into vibedom %s, never taken from the registry's \"latest\"; they move only with a vibedom release. After updating vibedom, --update-agents installs its pins for every agent you have installed. Pinned for %s-%s: %s\n",
					version, arch, libc, pinSummary(arch, libc))
				have, err := agents.InstalledNames(string(home), arch, libc)
				if err != nil {
					return err
				}
				for _, n := range have {
					p, err := agents.Lookup(n, arch, libc)
					if err == nil && !containsPin(pins, p) {
						pins = append(pins, p)
					}
				}
			}
			r, err := session.Init(ctx, home)
			if err != nil {
				return err
			}
			var installed []agents.Result
			if len(pins) > 0 {
				ew := c.Root().ErrWriter
				tty := false
				if f, ok := ew.(*os.File); ok {
					tty = term.IsTerminal(int(f.Fd()))
				}
				installed, err = agents.Install(ctx, agents.Options{
					Home:     string(home),
					Registry: c.String("registry"),
					Progress: alpine.NewProgress(ew, tty),
				}, pins)
				if err != nil {
					if tty {
						fmt.Fprintln(ew) // end the progress bar's line
					}
					return err
				}
			}
			w := c.Root().Writer
			if c.Bool("json") {
				out := initJSON{InitResult: r}
				for _, a := range installed {
					out.Agents = append(out.Agents, agentJSON{Manifest: a.Manifest, Dir: a.Dir, BinaryPath: a.BinaryPath(), Fresh: a.Fresh})
				}
				if err := writeJSON(w, out); err != nil {
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
				for _, a := range installed {
					fmt.Fprintf(w, "Agent %s %s (%s-%s): %s, verified\n", a.Agent, a.Version, a.Arch, a.Libc, a.Dir)
				}
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

func pinSummary(arch, libc string) string {
	var s []string
	for _, n := range agents.Names() {
		if p, err := agents.Lookup(n, arch, libc); err == nil {
			s = append(s, n+" "+p.Version+" ("+p.String()+")")
		}
	}
	return strings.Join(s, ", ")
}

func containsPin(pins []agents.Pin, p agents.Pin) bool {
	for _, q := range pins {
		if q == p {
			return true
		}
	}
	return false
}
