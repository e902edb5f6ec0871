// Package fence holds the test that keeps vibedom's package dependencies
// pointing the way ARCHITECTURE.md's package table says. It has no code of
// its own.
//
// The fence is kept on purpose: a new package, or a new arrow between two
// packages, is a design decision. Make it by editing the table below (and
// ARCHITECTURE.md), not by working around the test.
package fence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// module is the project's module path.
const module = "github.com/vibedom/vibedom"

// vzModule may be imported by vm/vz alone.
const vzModule = "github.com/Code-Hex/vz/v3"

// anything marks a package that may import every project package the
// global rules below do not forbid.
const anything = "*"

// table is docs/architecture.md's package table (TestArchitectureDoc keeps
// the two equal): each project package (path below the module, "tools/..." for every
// package under tools/) and the project packages it may import directly.
// guest/proto, the pure host–guest contract, may be imported by every
// package except those whose list is closed: the three that import nothing
// of ours (dlp, termtext, atomicfile), vm and keys (atomicfile only: vm
// writes the record of a saved machine state), preflight and overlay
// (termtext and atomicfile only), netfilter (its rooms, logredact,
// credentials, dlp, keys and atomicfile only) and its rooms.
// termtext, the one sanitizer of text printed on a terminal, may be
// imported by any package that prints; atomicfile, the one writer of whole
// files (and bounded reader of small ones), by any package that replaces
// or reads files; childenv, the one builder of a child process's
// environment, by any package that starts a program; home, the one spelling
// of the names under ~/.vibedom, by any package that finds a path there (it
// imports nothing, so it stays the bottom of the house); progress, the one
// download progress contract, by the fetchers. guestlink (the host's SSH
// client of the control channel), boot (the one boot function) and
// boot/vmtest (the backends' conformance suite) are host-side: they sit
// above vm and image, and nothing under vm or guest imports them.
//
// Global rules hold on top of the table, for every package (tools too):
//   - only vm/vz imports github.com/Code-Hex/vz/v3;
//   - nothing but cmd/vibedom imports session;
//   - nothing imports a package under cmd/;
//   - dlp, netfilter, preflight and overlay never depend on vm or vm/vz,
//     not even through another package.
var table = map[string][]string{
	"cmd/vibedom":       {anything},
	"cmd/vibedom-guest": {"guest", "guest/proto"},
	"agents":            {"home", "progress", "atomicfile"},
	"agents/agentstest": {"agents"},
	"session": {
		"preflight", "image", "keys", "vm", "vm/vz", "vm/qemu", "netfilter", "dlp",
		"overlay", "guest", "boot", "guestlink", "guest/proto", "review", "termtext",
		"image/alpine", "image/rootfs", "image/ext4", "image/assets", "agents", "credentials",
		"atomicfile", "sshagent", "home", "netfilter/egress", "netfilter/mitm", "logredact", "policy", "wstrust", "childenv",
	},
	"policy":      {"wstrust", "netfilter", "netfilter/egress", "netfilter/mitm", "dlp", "overlay", "preflight", "home"},
	"wstrust":     {"overlay", "home", "atomicfile"},
	"vm":          {"atomicfile"},
	"vm/vz":       {"vm", "guest/proto", "childenv"},
	"vm/qemu":     {"vm", "guest/proto", "childenv"},
	"guest":       {"overlay", "guest/proto", "atomicfile"},
	"guest/proto": {},
	"guestlink":   {"keys", "guest/proto"},
	"boot":        {"vm", "guestlink", "termtext"},
	"boot/vmtest": {"boot", "guestlink", "image", "image/assets", "keys", "keys/keystest", "vm", "guest/proto"},
	"image": {
		"vm", "guest/proto", "image/alpine", "image/rootfs", "image/kernel", "image/initramfs",
		"image/assets", "home", "progress", "atomicfile",
	},
	"image/kernel":            {"vm", "childenv"},
	"image/assets":            {"vm", "image/kernel", "home", "atomicfile"},
	"image/initramfs":         {},
	"image/alpine":            {"progress", "atomicfile"},
	"image/alpine/alpinetest": {"image/alpine"},
	"image/ext4":              {},
	"image/rootfs":            {"image/alpine", "image/ext4", "atomicfile"},
	"credentials":             {"dlp", "atomicfile", "childenv"},
	"atomicfile":              {},
	"childenv":                {},
	"home":                    {},
	"progress":                {},
	"keys":                    {"atomicfile"},
	"keys/keystest":           {"keys"},
	"netfilter":               {"netfilter/egress", "netfilter/netstack", "netfilter/mitm", "netfilter/mitmproxy", "logredact", "credentials", "dlp", "keys", "atomicfile", "childenv"},
	"dlp":                     {},
	"sshagent":                {},
	"preflight":               {"termtext", "atomicfile"},
	"overlay":                 {"termtext", "atomicfile", "childenv"},
	"review":                  {"overlay", "guest/proto", "termtext", "childenv"},
	"termtext":                {},
	"tools/...":               {anything},

	// netfilter's rooms (netfilter itself wires them) and the log redactor.
	"netfilter/egress":             {},
	"netfilter/netstack":           {"netfilter/egress"},
	"netfilter/mitm":               {"netfilter/egress", "netfilter/netstack", "credentials", "keys"},
	"netfilter/mitmproxy":          {"netfilter/mitm", "netfilter/egress", "netfilter/netstack", "credentials", "atomicfile", "childenv"},
	"netfilter/internal/nftest":    {},
	"netfilter/internal/mitmtest":  {"netfilter/mitm", "netfilter/egress", "netfilter/netstack", "netfilter/internal/nftest", "keys"},
	"netfilter/internal/stacktest": {"netfilter/egress"},
	"logredact":                    {"dlp"},
	// e2e/clitest drives the built command; the e2e packages hold only
	// tests, which drive that binary (their imports are test imports).
	"e2e":         {},
	"e2e/clitest": {"vm", "image/assets", "image/alpine", "image/alpine/alpinetest", "agents", "agents/agentstest"},
	"e2e/...":     {"e2e/clitest"},
}

// neverVM lists the packages that must not depend on vm or vm/vz at all.
var neverVM = []string{"dlp", "netfilter", "netfilter/egress", "netfilter/netstack", "netfilter/mitm", "netfilter/mitmproxy", "preflight", "overlay"}

// pkg is what the fence needs of `go list -json`.
type pkg struct {
	ImportPath string
	Imports    []string
}

// rel returns a project package's path below the module ("" for the module
// root) and whether path is a project package at all.
func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// allowed returns the table entry for a project package, following
// "dir/..." entries.
func allowed(r string) ([]string, bool) {
	if a, ok := table[r]; ok {
		return a, true
	}
	for key, a := range table {
		if prefix, ok := strings.CutSuffix(key, "/..."); ok && (r == prefix || strings.HasPrefix(r, prefix+"/")) {
			return a, true
		}
	}
	return nil, false
}

func isVZ(path string) bool { return path == vzModule || strings.HasPrefix(path, vzModule+"/") }

func isCmd(r string) bool { return r == "cmd" || strings.HasPrefix(r, "cmd/") }

// violations checks a package graph (every package reachable from the
// project, as `go list -deps` prints it) against the table and the global
// rules. Each message names the forbidden edge.
func violations(pkgs []pkg) []string {
	byPath := make(map[string]pkg, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
	}
	var out []string
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		allow, known := allowed(from)
		if !known {
			out = append(out, fmt.Sprintf("package %s is not in the fence table: add it to the table in tools/fence/fence_test.go, with the project packages it may import, and to the package table of docs/architecture.md", p.ImportPath))
		}
		for _, imp := range p.Imports {
			if isVZ(imp) && from != "vm/vz" {
				out = append(out, fmt.Sprintf("forbidden import %s -> %s: only vm/vz may import Code-Hex/vz", from, imp))
			}
			to, ok := rel(imp)
			if !ok {
				continue
			}
			switch {
			case isCmd(to):
				out = append(out, fmt.Sprintf("forbidden import %s -> %s: nothing imports cmd/...", from, to))
			case to == "session" && from != "cmd/vibedom":
				out = append(out, fmt.Sprintf("forbidden import %s -> session: only cmd/vibedom may import session", from))
			case known && !slices.Contains(allow, anything) && !slices.Contains(allow, to):
				out = append(out, fmt.Sprintf("forbidden import %s -> %s: %s may import only %s", from, to, from, list(allow)))
			}
		}
		if slices.Contains(neverVM, from) {
			for _, target := range []string{"vm", "vm/vz"} {
				if path := importChain(byPath, p.ImportPath, module+"/"+target); path != nil {
					out = append(out, fmt.Sprintf("forbidden dependency %s -> %s (through %s): %s must never depend on vm or vm/vz", from, target, chain(path), from))
				}
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func list(allow []string) string {
	if len(allow) == 0 {
		return "no project package"
	}
	return strings.Join(allow, ", ")
}

func chain(path []string) string {
	short := make([]string, len(path))
	for i, p := range path {
		short[i], _ = rel(p)
		if short[i] == "" {
			short[i] = p
		}
	}
	return strings.Join(short, " -> ")
}

// importChain returns a shortest import path from one package to another,
// or nil if from does not depend on to.
func importChain(byPath map[string]pkg, from, to string) []string {
	parent := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, imp := range byPath[cur].Imports {
			if _, seen := parent[imp]; seen {
				continue
			}
			parent[imp] = cur
			if imp == to {
				var path []string
				for p := imp; p != ""; p = parent[p] {
					path = append([]string{p}, path...)
				}
				return path
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

// goList lists ./... with its dependencies for one platform.
func goList(t *testing.T, env ...string) []pkg {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-e", "-deps", "-json=ImportPath,Imports", "./...")
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", env, err, &stderr)
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestFence checks the real import graph on the host platform and on
// darwin/arm64, where the vz backend's files come in.
func TestFence(t *testing.T) {
	platforms := []struct {
		name string
		env  []string
		// seen is an import only this platform's files make: proof the
		// listing really covered them.
		seen [2]string
	}{
		{"linux/amd64", []string{"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0"}, [2]string{}},
		{"darwin/arm64", []string{"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=1"}, [2]string{module + "/vm/vz", vzModule}},
	}
	for _, pl := range platforms {
		t.Run(pl.name, func(t *testing.T) {
			pkgs := goList(t, pl.env...)
			project := 0
			for _, p := range pkgs {
				if _, ok := rel(p.ImportPath); ok {
					project++
				}
			}
			if project == 0 {
				t.Fatalf("go list found no package of %s", module)
			}
			if from, to := pl.seen[0], pl.seen[1]; from != "" {
				found := false
				for _, p := range pkgs {
					if p.ImportPath == from && slices.Contains(p.Imports, to) {
						found = true
					}
				}
				if !found {
					t.Errorf("the %s listing has no import %s -> %s: it did not see the platform's own files", pl.name, from, to)
				}
			}
			for _, v := range violations(pkgs) {
				t.Error(v)
			}
		})
	}
}

// TestFenceRules feeds made-up graphs to the checker: every kind of
// forbidden edge is reported, and the allowed ones are not.
func TestFenceRules(t *testing.T) {
	p := func(from string, imports ...string) pkg {
		full := module + "/" + from
		if from == "" {
			full = module
		}
		var imps []string
		for _, i := range imports {
			if strings.Contains(i, ".") {
				imps = append(imps, i) // external or standard
			} else {
				imps = append(imps, module+"/"+i)
			}
		}
		return pkg{ImportPath: full, Imports: imps}
	}
	tests := []struct {
		name string
		pkgs []pkg
		want []string // substrings, one per expected violation, in sorted order
	}{
		{
			name: "the architecture as drawn",
			pkgs: []pkg{
				p("cmd/vibedom", "session", "vm"),
				p("cmd/vibedom-guest", "guest"),
				p("session", "preflight", "image", "keys", "vm", "vm/vz", "vm/qemu", "netfilter", "overlay", "boot", "guestlink"),
				p("vm/vz", "vm", vzModule),
				p("vm/qemu", "vm"),
				p("boot/vmtest", "boot", "guestlink", "vm", "image", "keys", "guest/proto"),
				p("boot", "vm", "guestlink", "termtext"),
				p("guest", "overlay", "guest/proto"),
				p("guestlink", "keys", "guest/proto"),
				p("image", "vm", "guest/proto"),
				p("netfilter", "dlp", "keys"),
				p("review", "overlay", "termtext"),
				p("tools/check-darwin", "vm"),
				p("vm"), p("keys"), p("dlp"), p("preflight", "termtext"), p("overlay", "termtext"), p("guest/proto"), p("termtext"),
				{ImportPath: vzModule, Imports: []string{vzModule + "/internal/objc"}},
			},
			want: nil,
		},
		{
			name: "vz outside vm/vz",
			pkgs: []pkg{p("session", vzModule), p("tools/x", vzModule+"/internal/objc")},
			want: []string{"forbidden import session -> " + vzModule, "forbidden import tools/x -> " + vzModule + "/internal/objc"},
		},
		{
			name: "session imported by another package",
			pkgs: []pkg{p("netfilter", "session"), p("tools/x", "session")},
			want: []string{"forbidden import netfilter -> session", "forbidden import tools/x -> session"},
		},
		{
			name: "cmd imported",
			pkgs: []pkg{p("session", "cmd/vibedom"), p("tools/x", "cmd/vibedom/internal/flags"), p("cmd/vibedom/internal/flags")},
			want: []string{"forbidden import session -> cmd/vibedom:", "forbidden import tools/x -> cmd/vibedom/internal/flags", "cmd/vibedom/internal/flags is not in the fence table"},
		},
		{
			name: "leaf packages import nothing of ours",
			pkgs: []pkg{p("dlp", "keys"), p("keys", "guest/proto"), p("preflight", "overlay"), p("overlay", "dlp"), p("vm", "guest/proto"), p("termtext", "overlay")},
			want: []string{
				"forbidden import dlp -> keys: dlp may import only no project package",
				"forbidden import keys -> guest/proto",
				"forbidden import overlay -> dlp",
				"forbidden import preflight -> overlay",
				"forbidden import termtext -> overlay: termtext may import only no project package",
				"forbidden import vm -> guest/proto",
			},
		},
		{
			name: "arrows the table does not draw",
			pkgs: []pkg{p("netfilter", "overlay", "guest/proto"), p("guest", "keys"), p("image", "keys"), p("vm/vz", "vm/qemu"), p("review", "dlp"), p("guestlink", "vm")},
			want: []string{
				"forbidden import guest -> keys",
				"forbidden import guestlink -> vm",
				"forbidden import image -> keys",
				"forbidden import netfilter -> guest/proto",
				"forbidden import netfilter -> overlay",
				"forbidden import review -> dlp",
				"forbidden import vm/vz -> vm/qemu",
			},
		},
		{
			name: "no import runs up the image rooms; home and progress stay leaves",
			pkgs: []pkg{
				p("image", "image/kernel", "image/initramfs", "image/assets", "home"),
				p("image/kernel", "image"), p("image/initramfs", "image/kernel"), p("image/assets", "image/kernel", "home"),
				p("home", "keys"), p("progress", "atomicfile"),
			},
			want: []string{
				"forbidden import home -> keys: home may import only no project package",
				"forbidden import image/initramfs -> image/kernel",
				"forbidden import image/kernel -> image: image/kernel may import only vm",
				"forbidden import progress -> atomicfile",
			},
		},
		{
			name: "no import runs up from vm or guest to the host-side boot rooms",
			pkgs: []pkg{
				p("vm", "boot"), p("vm/qemu", "boot/vmtest"), p("guest", "guestlink"),
				p("guestlink", "boot"), p("boot", "image"),
			},
			want: []string{
				"forbidden import boot -> image",
				"forbidden import guest -> guestlink",
				"forbidden import guestlink -> boot",
				"forbidden import vm -> boot",
				"forbidden import vm/qemu -> boot/vmtest",
			},
		},
		{
			name: "vm reached indirectly",
			pkgs: []pkg{p("netfilter", "dlp", "keys"), p("dlp", "golang.org/x/sneaky"), {ImportPath: "golang.org/x/sneaky", Imports: []string{module + "/vm/vz"}}, p("vm/vz", "vm"), p("vm")},
			want: []string{
				"forbidden dependency dlp -> vm (through dlp -> golang.org/x/sneaky -> vm/vz -> vm)",
				"forbidden dependency dlp -> vm/vz (through dlp -> golang.org/x/sneaky -> vm/vz)",
				"forbidden dependency netfilter -> vm (through netfilter -> dlp -> golang.org/x/sneaky -> vm/vz -> vm)",
				"forbidden dependency netfilter -> vm/vz",
			},
		},
		{
			name: "unknown package",
			pkgs: []pkg{p("netfilter/dns"), p(""), p("cmd/vibedom", "netfilter/dns")},
			want: []string{
				"package " + module + " is not in the fence table",
				"package " + module + "/netfilter/dns is not in the fence table",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := violations(tt.pkgs)
			if len(got) != len(tt.want) {
				t.Fatalf("violations: got %d, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, want := range tt.want {
				if !strings.Contains(got[i], want) {
					t.Errorf("violation %d: got %q, want it to contain %q", i, got[i], want)
				}
			}
		})
	}
}
