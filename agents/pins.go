package agents

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Guest architectures, as the guest's kernel names them.
const (
	ArchX86_64  = "x86_64"
	ArchAArch64 = "aarch64"
)

// Guest C libraries: musl for the Alpine guest, glibc for the
// Debian-sourced test guest.
const (
	LibcMusl  = "musl"
	LibcGlibc = "glibc"
)

// Pin is one agent's npm platform package for one guest architecture and C
// library: what to fetch and what it must hash to.
type Pin struct {
	Agent string // "claude", "codex", "opencode"
	Arch  string // ArchX86_64 or ArchAArch64
	Libc  string // LibcMusl or LibcGlibc
	// Package and Version name the npm package version holding the binary.
	Package string
	Version string
	// Integrity is the tarball's dist.integrity, "sha512-" and base64.
	Integrity string
	// Size is the tarball's length in bytes.
	Size int64
	// Binary is the agent's executable inside the package, relative to
	// the package root (npm's "package/" directory stripped).
	Binary string
}

// Pins lists every agent build vibedom knows, checked against
// registry.npmjs.org when they were pinned. Codex publishes one static musl
// build per architecture, used for both C libraries. OpenCode's platform
// packages lag the main package and differ between architectures; 1.18.18
// is the newest version present for all four platforms.
var Pins = []Pin{
	{"claude", ArchX86_64, LibcMusl, "@anthropic-ai/claude-code-linux-x64-musl", "2.1.330",
		"sha512-OnduSSPY1b59FA8jTbq20Y1XkDUV0S1OVyvYBNslEbpX79P81JF7Ih4lgYvDKiFnnSv75z4Kv6qLE5DQqogYXA==", 167628161, "claude"},
	{"claude", ArchAArch64, LibcMusl, "@anthropic-ai/claude-code-linux-arm64-musl", "2.1.330",
		"sha512-NemfeTqZ30tQDhAeumZgDYoX4ewhAHkN3dbcsyvlgb+yvpKUlcYu5Bor8K+Du5azGe3uy9sftlJxbGhTsCR7zA==", 167937672, "claude"},
	{"claude", ArchX86_64, LibcGlibc, "@anthropic-ai/claude-code-linux-x64", "2.1.330",
		"sha512-9Gn+V7DtJ8M1nztP9CeDVl9g3RtrepI7rOFTyPRRnZe8D6zebIHKmC7OvBauucuAP0X0k85SDN/LPVZyjsGezQ==", 175385311, "claude"},
	{"claude", ArchAArch64, LibcGlibc, "@anthropic-ai/claude-code-linux-arm64", "2.1.330",
		"sha512-V4yanAY5EA5UpwwRPtjSfqDbNqAlUJeVn3NYZw2AgmRHjdpSsLtHAzbxRXfkAnbjwTXzE0uedjQxUY02ARPcsA==", 176189557, "claude"},

	{"codex", ArchX86_64, LibcMusl, "@openai/codex", "0.169.0-linux-x64",
		"sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww==", 167001509, "vendor/x86_64-unknown-linux-musl/bin/codex"},
	{"codex", ArchAArch64, LibcMusl, "@openai/codex", "0.169.0-linux-arm64",
		"sha512-NZ/DaQUpcQmxmqee7Z9uC1rzw3GhSbooawcaTe1LN5Yk+WlinUKGdTXJgClRT/9ogQEEM9TWxYzvxPfj5G/xFg==", 171743625, "vendor/aarch64-unknown-linux-musl/bin/codex"},
	{"codex", ArchX86_64, LibcGlibc, "@openai/codex", "0.169.0-linux-x64",
		"sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww==", 167001509, "vendor/x86_64-unknown-linux-musl/bin/codex"},
	{"codex", ArchAArch64, LibcGlibc, "@openai/codex", "0.169.0-linux-arm64",
		"sha512-NZ/DaQUpcQmxmqee7Z9uC1rzw3GhSbooawcaTe1LN5Yk+WlinUKGdTXJgClRT/9ogQEEM9TWxYzvxPfj5G/xFg==", 171743625, "vendor/aarch64-unknown-linux-musl/bin/codex"},

	{"opencode", ArchX86_64, LibcMusl, "opencode-linux-x64-musl", "1.18.18",
		"sha512-lWiWxotqyVTJYiu2dN90KDNDSrwmyhZk8ajzyfAFjwms2TBVx4L0Ly6gkdhz8nxsxwPRv751W8+yUpzetB8AMA==", 62384992, "bin/opencode"},
	{"opencode", ArchAArch64, LibcMusl, "opencode-linux-arm64-musl", "1.18.18",
		"sha512-Dp3XByFRRZngPAQotNbOwr22HgZej4r9Ck0Iv/rOVU+oO5fLD9YSpHEwx80FTZOZmFmd/vriCdrR/dGdzabICw==", 61926428, "bin/opencode"},
	{"opencode", ArchX86_64, LibcGlibc, "opencode-linux-x64", "1.18.18",
		"sha512-WmeUnhljYJ252wywKTiW4bNDzsas2njpjPUEh0jM6HKNI4vFxJtREtzaWViY4AKEAcOkLWT8Ll17ixvcHz3AnA==", 60031988, "bin/opencode"},
	{"opencode", ArchAArch64, LibcGlibc, "opencode-linux-arm64", "1.18.18",
		"sha512-e8D3g0qJEIzawEg2+ygW3vkZjAYL2ssyAx4GbihjwXwZFvlZZy5zRWWzdz5KLBoHSTl0FB73vNtnNeXONyHpVQ==", 59813303, "bin/opencode"},
}

// ErrUnknownAgent is returned for an agent name no pin has.
var ErrUnknownAgent = errors.New("unknown agent")

// Names returns the native agents' names (those with Pins), sorted.
func Names() []string {
	var n []string
	for _, p := range Pins {
		if !slices.Contains(n, p.Agent) {
			n = append(n, p.Agent)
		}
	}
	slices.Sort(n)
	return n
}

// AllNames returns every named agent, native and node (NPMAgents), sorted.
func AllNames() []string {
	n := Names()
	for _, a := range NPMAgents {
		n = append(n, a.Agent)
	}
	slices.Sort(n)
	return n
}

// IsNode reports whether agent runs on the guest's node: a named node
// agent or npm:PACKAGE.
func IsNode(agent string) bool {
	_, named := LookupNPMAgent(agent)
	return named || strings.HasPrefix(agent, NPMPrefix)
}

// Lookup returns the pin of agent for a guest of arch and libc.
func Lookup(agent, arch, libc string) (Pin, error) {
	if IsNode(agent) {
		return Pin{}, fmt.Errorf("%s runs on the guest's node: it has no native build (NodeRequest)", agent)
	}
	if !slices.Contains(Names(), agent) {
		return Pin{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownAgent, agent, strings.Join(Names(), ", "))
	}
	for _, p := range Pins {
		if p.Agent == agent && p.Arch == arch && p.Libc == libc {
			return p, nil
		}
	}
	return Pin{}, fmt.Errorf("no %s build pinned for %s-%s (architectures: %s, %s; C libraries: %s, %s)",
		agent, arch, libc, ArchX86_64, ArchAArch64, LibcMusl, LibcGlibc)
}

// ParseList splits a comma-separated list of agent names ("claude,codex"),
// dropping blanks and repeats. An unknown name is ErrUnknownAgent listing
// the known ones.
func ParseList(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" || slices.Contains(out, f) {
			continue
		}
		if strings.HasPrefix(f, NPMPrefix) {
			if _, err := ParseNPMSpec(f, false); err != nil {
				return nil, err
			}
		} else if !slices.Contains(AllNames(), f) {
			return nil, fmt.Errorf("%w %q (known: %s, or npm:PACKAGE@VERSION)", ErrUnknownAgent, f, strings.Join(AllNames(), ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// GuestArch maps a Go architecture (runtime.GOARCH) to the guest
// architecture vibedom runs on it.
func GuestArch(goarch string) (string, error) {
	switch goarch {
	case "amd64":
		return ArchX86_64, nil
	case "arm64":
		return ArchAArch64, nil
	}
	return "", fmt.Errorf("no guest architecture for %s: vibedom runs on amd64 and arm64 hosts", goarch)
}

// validate checks what Install relies on: a pin names one directory,
// a clean relative binary path, a size and a sha512 integrity.
func (p Pin) validate() error {
	d := p.Dir()
	if p.Agent == "" || p.Package == "" || p.Version == "" || strings.ContainsAny(d, "/\\\x00") || strings.HasPrefix(d, ".") {
		return fmt.Errorf("pin %s %s: not a usable agent, package or version", p.Agent, p)
	}
	if p.Binary == "" || path.Clean(p.Binary) != p.Binary || path.IsAbs(p.Binary) || p.Binary == ".." || strings.HasPrefix(p.Binary, "../") {
		return fmt.Errorf("pin %s: binary %q is not a clean relative path", p, p.Binary)
	}
	if p.Size <= 0 {
		return fmt.Errorf("pin %s: no tarball size", p)
	}
	_, err := pinnedDigest(p)
	return err
}

// Dir is the name of the directory an installed pin lives in:
// <agent>-<version>-<arch>-<libc>.
func (p Pin) Dir() string { return p.Agent + "-" + p.Version + "-" + p.Arch + "-" + p.Libc }

// String names the package version, e.g. "opencode-linux-x64@1.18.18".
func (p Pin) String() string { return p.Package + "@" + p.Version }
