package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// Set at link time with -ldflags "-X main.version=… -X main.commit=…"
// (the Makefile does). Unset, commit and buildDate come from the build
// information Go records (vcs.revision, vcs.time); vzVersion from the
// linked module (darwin only) or the Makefile's `go list -m`.
var (
	version   = "dev"
	commit    = ""
	buildDate = ""
	vzVersion = ""
)

// Module paths whose versions are pins reported by `vibedom version`.
const (
	gitleaksModule = "github.com/zricethezav/gitleaks/v8"
	vzModule       = "github.com/Code-Hex/vz/v3"
)

// versionInfo is what `vibedom version --json` prints.
type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	BuildDate string `json:"build_date,omitempty"`
	Go        string `json:"go"`
	Platform  string `json:"platform"`
	// GuestAgents are the sha256 of the guest agents built in, by arch;
	// empty in a development build, which uses `make guest`'s bin/.
	GuestAgents map[string]string `json:"guest_agents,omitempty"`
	Pins        versionPins       `json:"pins"`
}

// versionPins are the versions vibedom pins, read from where each is
// pinned: the Alpine branch, the agents' npm pins, the mitmproxy release,
// the Go modules of gitleaks and vz.
type versionPins struct {
	Alpine    string              `json:"alpine"`
	Agents    map[string][]string `json:"agents"`
	Mitmproxy string              `json:"mitmproxy"`
	Gitleaks  string              `json:"gitleaks"`
	Vz        string              `json:"vz"`
}

func readVersion() versionInfo {
	v := versionInfo{Version: version, Commit: commit, BuildDate: buildDate, Go: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	v.Pins = versionPins{Alpine: alpine.Branch, Agents: map[string][]string{}, Mitmproxy: mitmproxy.Release, Vz: vzVersion}
	for _, p := range agents.Pins {
		if !slices.Contains(v.Pins.Agents[p.Agent], p.Version) {
			v.Pins.Agents[p.Agent] = append(v.Pins.Agents[p.Agent], p.Version)
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && v.Commit == "":
				v.Commit = s.Value
			case s.Key == "vcs.time" && v.BuildDate == "":
				v.BuildDate = s.Value
			case s.Key == "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			switch d.Path {
			case gitleaksModule:
				v.Pins.Gitleaks = d.Version
			case vzModule:
				v.Pins.Vz = d.Version
			}
		}
	}
	if sums := assets.EmbeddedGuestSums(); sums != nil {
		v.GuestAgents = map[string]string{}
		for a, s := range sums {
			v.GuestAgents[string(a)] = "sha256:" + s
		}
	}
	return v
}

// text is the human form of v.
func (v versionInfo) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "vibedom %s (%s, %s)\n", v.Version, v.Go, v.Platform)
	if v.Commit != "" {
		dirty := ""
		if v.Modified {
			dirty = ", modified"
		}
		fmt.Fprintf(&b, "  commit       %s%s\n", v.Commit, dirty)
	}
	if v.BuildDate != "" {
		fmt.Fprintf(&b, "  built        %s\n", v.BuildDate)
	}
	if len(v.GuestAgents) == 0 {
		b.WriteString("  guest agent  not built in (development build: bin/ from `make guest`)\n")
	} else {
		arches := make([]string, 0, len(v.GuestAgents))
		for a := range v.GuestAgents {
			arches = append(arches, a)
		}
		slices.Sort(arches)
		for _, a := range arches {
			fmt.Fprintf(&b, "  guest agent  linux/%s %s (built in)\n", a, v.GuestAgents[a])
		}
	}
	fmt.Fprintf(&b, "  alpine       %s\n", v.Pins.Alpine)
	names := make([]string, 0, len(v.Pins.Agents))
	for n := range v.Pins.Agents {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-12s %s\n", n, strings.Join(v.Pins.Agents[n], ", "))
	}
	fmt.Fprintf(&b, "  mitmproxy    %s\n", v.Pins.Mitmproxy)
	fmt.Fprintf(&b, "  gitleaks     %s\n", orUnknown(v.Pins.Gitleaks))
	fmt.Fprintf(&b, "  vz           %s\n", orUnknown(v.Pins.Vz))
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown (not linked into this build)"
	}
	return s
}

func init() {
	commands = append(commands, &cli.Command{
		Name:  "version",
		Usage: "print the version of vibedom, its build and the versions it pins",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print it as JSON"}},
		Action: func(_ context.Context, c *cli.Command) error {
			v := readVersion()
			if c.Bool("json") {
				return writeJSON(c.Root().Writer, v)
			}
			_, err := fmt.Fprint(c.Root().Writer, v.text())
			return err
		},
	})
}
