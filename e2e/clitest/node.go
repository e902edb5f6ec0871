package clitest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// GuestImageHomeNode is GuestImageHome with Node.js 20 in the guest image
// (/usr/bin/node): the test mirror's nodejs is then the official build,
// not the empty stand-in (alpinetest.NodePin). Other tests' mirrors and
// their caches are not affected. It skips, with one line, when the files
// are neither in .cache nor fetchable.
func GuestImageHomeNode(t *testing.T, extraInit ...string) (*CLI, string) {
	t.Helper()
	RequireVM(t)
	return initGuestImage(t, TestKeysBin(t), New(t), true, extraInit...)
}

// NodeFiles returns the pinned files the test mirror's Node.js is made
// from for an Alpine arch: npm's node-linux-<arch> tarball in .cache/npm
// (fetched with `npm pack` when absent) and Debian's libstdc++6 and
// libgcc-s1 in .cache/nodedebs/<debian arch> (fetched with `apt-get
// download` when absent, on a Debian host of that arch). BuildDebianRepo
// checks them against the pins. It skips, with one line, when a file is
// absent and cannot be fetched.
func NodeFiles(t testing.TB, arch string) *alpinetest.NodeFiles {
	t.Helper()
	pin, err := alpinetest.NodePinFor(arch)
	if err != nil {
		t.Skip(err)
	}
	tgz := agentstest.Tarball(t, agents.Pin{Package: pin.Package, Version: alpinetest.NodeVersion, Size: -1})
	da, _ := alpinetest.DebianArch(arch)
	dir := filepath.Join(filepath.Dir(filepath.Dir(tgz)), "nodedebs", da)
	var missing []string
	for name := range pin.Debs {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			// libstdc++6_12.2.0-14+deb12u1_amd64.deb: libstdc++6=12.2.0-14+deb12u1
			f := strings.Split(strings.TrimSuffix(name, ".deb"), "_")
			missing = append(missing, f[0]+"="+strings.ReplaceAll(f[1], "%3a", ":"))
		}
	}
	if len(missing) == 0 {
		return &alpinetest.NodeFiles{Tarball: tgz, DebDir: dir}
	}
	if out, err := exec.Command("dpkg", "--print-architecture").Output(); err != nil || strings.TrimSpace(string(out)) != da {
		t.Skipf("%s not in %s, and this host cannot apt-get download %s packages", strings.Join(missing, " "), dir, da)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, missing...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		t.Skipf("apt-get download %s cannot fetch them: %v: %s", strings.Join(missing, " "), err, line)
	}
	return &alpinetest.NodeFiles{Tarball: tgz, DebDir: dir}
}
