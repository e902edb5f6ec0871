package kernel

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// configLine is one option of the guest kernel's option files.
var configLine = regexp.MustCompile(`^(CONFIG_[A-Z0-9_]+=(y|[0-9]+|"[^"]*")|# CONFIG_[A-Z0-9_]+ is not set)$`)

// readOptions reads an option file of image/kernel/config: comments and
// blank lines aside, every line must be an option set to a value.
func readOptions(t *testing.T, p string) []string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") && !strings.HasSuffix(l, " is not set") {
			continue
		}
		if !configLine.MatchString(l) {
			t.Errorf("%s:%d: %q is not CONFIG_NAME=value", p, n, l)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGuestKernelConfig checks the guest kernel's option files, and, when
// scripts/build-kernel.sh has built the kernel, that the built kernel is
// the one they describe: every option holds in its .config and every
// driver the guest needs is built in (the kernel loads no modules).
func TestGuestKernelConfig(t *testing.T) {
	common := readOptions(t, filepath.Join("config", "common.config"))
	for _, arch := range []vm.Arch{vm.ArchAMD64} {
		t.Run(string(arch), func(t *testing.T) {
			opts := append(slices.Clone(common), readOptions(t, filepath.Join("config", string(arch)+".config"))...)
			seen := map[string]bool{}
			for _, o := range opts {
				name, _, _ := strings.Cut(strings.TrimPrefix(o, "# "), "=")
				name, _, _ = strings.Cut(name, " ")
				if seen[name] {
					t.Errorf("%s is set twice", name)
				}
				seen[name] = true
			}
			if !seen["CONFIG_FANOTIFY_ACCESS_PERMISSIONS"] || !seen["CONFIG_UNIX98_PTYS"] {
				t.Error("the options lack what the guest agent relies on")
			}
			dir := testAssetDir(arch, "guest-kernel")
			if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
				t.Skipf("the guest kernel is not built (%v): run `make kernel`", err)
			}
			vmlinuz, release, err := Find(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(release, "-vibedom") {
				t.Errorf("release %q", release)
			}
			if _, err := os.Stat(vmlinuz); err != nil {
				t.Fatal(err)
			}
			cfg, err := os.ReadFile(filepath.Join(dir, "boot", "config-"+release))
			if err != nil {
				t.Fatal(err)
			}
			have := strings.Split(string(cfg), "\n")
			for _, o := range opts {
				if off, ok := strings.CutPrefix(o, "# "); ok && !slices.ContainsFunc(have, func(l string) bool {
					name, _, _ := strings.Cut(off, " ")
					return strings.HasPrefix(l, name+"=")
				}) {
					continue // off, or absent because what it needs is off
				}
				if !slices.Contains(have, o) {
					t.Errorf("the built kernel lacks %s: run `make kernel` (it rebuilds when the options change)", o)
				}
			}
			if !slices.Contains(opts, "# CONFIG_MODULES is not set") || !slices.Contains(have, "# CONFIG_MODULES is not set") {
				t.Error("the guest kernel can load modules")
			}
			m, err := ResolveModuleList(filepath.Join(dir, "lib", "modules", release), arch, GuestModules)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Order) != 0 {
				t.Errorf("modules to pack: %v", m.Order)
			}
			for _, r := range GuestModules.Required {
				if !slices.Contains(m.Builtin, r) {
					t.Errorf("%s is not built in", r)
				}
			}
		})
	}
}
