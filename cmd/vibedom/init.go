package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
	"github.com/vibedom/vibedom/progress"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
)

// initJSON is `vibedom init --json`: the home's set-up and the agents.
type initJSON struct {
	*session.InitResult
	Agents    []agentJSON          `json:"agents,omitempty"`
	Mitmproxy *mitmproxy.Installed `json:"mitmproxy,omitempty"`
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
		Usage: "set up ~/.vibedom: MITM CA, deploy key, DLP audit key, allowlist, the guest image, agents; check the hypervisor",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
			&cli.BoolFlag{Name: "update", Usage: "move the guest image to the newest packages of the pinned Alpine release"},
			&cli.StringFlag{Name: "mirror", Usage: "Alpine mirror `URL` (default $VIBEDOM_ALPINE_MIRROR, else Alpine's CDN); everything is verified against Alpine's keys either way"},
			&cli.BoolFlag{Name: "no-image", Usage: "set up keys and folders only; do not build the guest image"},
			&cli.StringFlag{Name: "arch", Usage: "guest architecture of the image: amd64 or arm64 (default: the host's)"},
			&cli.StringFlag{Name: "agents", Usage: "fetch and verify these agents (comma-separated: " + strings.Join(agents.AllNames(), ",") + ", or npm:PACKAGE@VERSION)"},
			&cli.BoolFlag{Name: "update-agents", Usage: "install the agent versions this vibedom pins for every agent already installed"},
			&cli.StringFlag{Name: "registry", Value: agents.DefaultRegistry, Usage: "npm registry to fetch agents from (tarballs must be on its host)"},
			&cli.StringFlag{Name: "agent-libc", Value: agents.LibcMusl, Usage: "guest C library the agents are built for: musl (the Alpine guest) or glibc"},
			&cli.BoolFlag{Name: "with-mitmproxy", Usage: "also fetch mitmproxy " + mitmproxy.Release + " (standalone, checked against its pinned SHA-256) into ~/.vibedom/mitmproxy for --proxy-engine mitmproxy; preferred over mitmdump on PATH"},
			&cli.StringFlag{Name: "mitmproxy-mirror", Usage: "where --with-mitmproxy fetches from: `URL` (default $" + mitmproxy.MirrorEnv + ", else " + mitmproxy.DefaultMirror + "); checked against the pinned SHA-256 either way"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, err := home.Default()
			if err != nil {
				return err
			}
			// Bad input is refused before anything is written.
			names, err := agents.ParseList(c.String("agents"))
			if err != nil {
				return err
			}
			garch := vm.Arch(c.String("arch"))
			if garch == "" {
				garch = session.HostArch()
			}
			if garch != vm.ArchAMD64 && garch != vm.ArchARM64 {
				return fmt.Errorf("--arch must be amd64 or arm64, got %q", termtext.Inline(string(garch)))
			}
			arch, err := agents.GuestArch(string(garch))
			if err != nil {
				return err
			}
			if err := agents.CheckRegistry(c.String("registry")); err != nil {
				return err
			}
			libc := c.String("agent-libc")
			var pins []agents.Pin
			var nodeAgents []string // run on the guest's node: one tree each, any arch
			for _, n := range names {
				if agents.IsNode(n) {
					if _, _, _, err := agents.NodeRequest(n, true); err != nil {
						return err
					}
					nodeAgents = append(nodeAgents, n)
					continue
				}
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
			ew := c.Root().ErrWriter
			tty := false
			if f, ok := ew.(*os.File); ok {
				tty = term.IsTerminal(int(f.Fd()))
			}
			r, err := session.Init(ctx, home, session.InitOptions{
				NoImage: c.Bool("no-image"),
				Image: image.GuestOptions{
					Arch: garch, Mirror: c.String("mirror"), Update: c.Bool("update"), Keys: session.TestKeyring(),
					Progress: ew, TTY: tty,
				},
			})
			if err != nil {
				return err
			}
			// Agents are fetched for the guest image's C library unless
			// --agent-libc says otherwise.
			if l := image.GuestLibc(home, garch); l != "" && l != libc && !c.IsSet("agent-libc") {
				libc = l
				for i, p := range pins {
					if pins[i], err = agents.Lookup(p.Agent, arch, libc); err != nil {
						return err
					}
				}
			}
			var installed []agents.Result
			if len(pins) > 0 {
				installed, err = agents.Install(ctx, agents.Options{
					Home:     string(home),
					Registry: c.String("registry"),
					Progress: progress.NewText(ew, tty),
				}, pins)
				if err != nil {
					if tty {
						fmt.Fprintln(ew) // end the progress bar's line
					}
					return err
				}
			}
			for _, n := range nodeAgents {
				name, spec, integrity, _ := agents.NodeRequest(n, true)
				fmt.Fprintf(ew, "Resolving %s %s from %s (dependencies from the packuments, every tarball checked against its sha512 integrity, no install scripts)…\n", name, spec.Version, c.String("registry"))
				res, err := agents.InstallNPM(ctx, agents.Options{Home: string(home), Registry: c.String("registry")}, agentOrEmpty(n), spec, integrity)
				if err != nil {
					return err
				}
				installed = append(installed, res)
			}
			var mitm *mitmproxy.Installed
			if c.Bool("with-mitmproxy") {
				fmt.Fprintf(ew, "Fetching mitmproxy %s…\n", mitmproxy.Release)
				in, err := mitmproxy.Install(ctx, mitmproxy.InstallOptions{
					Root: filepath.Join(string(home), mitmproxy.DirName), Mirror: c.String("mitmproxy-mirror")})
				if err != nil {
					return err
				}
				mitm = &in
			}
			w := c.Root().Writer
			if c.Bool("json") {
				out := initJSON{InitResult: r, Mitmproxy: mitm}
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
				printImage(w, r)
				for _, a := range installed {
					if a.Runtime == agents.RuntimeNode {
						fmt.Fprintf(w, "Agent %s %s (%s, on the guest's node): %s, verified; lockfile %s\n", a.Agent, a.Version, a.Package, a.Dir, filepath.Join(a.Dir, agents.LockFile))
						continue
					}
					fmt.Fprintf(w, "Agent %s %s (%s-%s): %s, verified\n", a.Agent, a.Version, a.Arch, a.Libc, a.Dir)
				}
				if mitm != nil {
					fmt.Fprintf(w, "mitmproxy %s (%s): %s, SHA-256 verified; --proxy-engine mitmproxy runs it\n", mitm.Version, mitm.Platform, mitm.Dir)
				}
				for _, p := range r.Problems {
					fmt.Fprintf(w, "\nBefore `vibedom run` works: %s\n", p)
				}
			}
			warnUnneededImages(ctx, c.Root().ErrWriter, home)
			if len(r.Problems) > 0 {
				return exitCode(1)
			}
			return nil
		},
	})
}

// agentOrEmpty is a named node agent's name, "" for npm:PACKAGE.
func agentOrEmpty(n string) string {
	if _, ok := agents.LookupNPMAgent(n); ok {
		return n
	}
	return ""
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

// printImage says which guest image sessions will boot.
func printImage(w io.Writer, r *session.InitResult) {
	switch {
	case r.Image != nil:
		im := r.Image
		state := "up to date"
		if im.Built {
			state = "built"
		} else if im.Fresh {
			state = "resolved again, unchanged"
		}
		fmt.Fprintf(w, "Guest image: Alpine %s, %d packages, root image %s (%s), %s in %s\n",
			im.Arch, im.Packages, short(im.RootSHA), humanSize(im.RootSize), state, im.Took.Round(10*time.Millisecond))
		for _, c := range im.Changes {
			fmt.Fprintf(w, "  %s\n", termtext.Inline(c))
		}
		if len(im.Extra) > 0 {
			fmt.Fprintf(w, "  extra packages (packages.txt): %s\n", termtext.Inline(fmt.Sprint(im.Extra)))
		}
	case r.Fallback != "":
		fmt.Fprintf(w, "Guest image: not built (%s)\n  sessions use the Linux test image (%s) instead\n", termtext.Inline(r.ImageError), r.Fallback)
	}
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}
