package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestDoctor drives `vibedom doctor` as a user would: before init, after
// init, and after each of the mistakes it must catch.
func TestDoctor(t *testing.T) {
	t.Parallel()
	c := clitest.New(t)
	type check struct{ Name, Status, Detail, Fix string }
	report := func(t *testing.T) (map[string]check, int) {
		t.Helper()
		stdout, stderr, code := c.Run(t, "", "doctor", "--json")
		var r struct {
			Home   string  `json:"home"`
			Checks []check `json:"checks"`
		}
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("doctor --json: %v\n%s\n%s", err, stdout, stderr)
		}
		if r.Home != c.Home {
			t.Errorf("home %q, want %q", r.Home, c.Home)
		}
		m := map[string]check{}
		for _, ck := range r.Checks {
			m[ck.Name] = ck
		}
		return m, code
	}
	mine := []string{"vibedom home", "deploy key", "DLP audit key", "MITM CA key", "allowlist"}

	t.Run("before init", func(t *testing.T) {
		m, code := report(t)
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if m["vibedom home"].Status != "ok" { // the test's home folder exists, empty
			t.Errorf("vibedom home: %+v", m["vibedom home"])
		}
		for _, n := range mine[1:4] {
			if m[n].Status != "fail" || !strings.Contains(m[n].Fix, "vibedom init") {
				t.Errorf("%s: %+v, want a failure fixed by vibedom init", n, m[n])
			}
		}
		stdout, _, _ := c.Run(t, "", "doctor")
		if !strings.Contains(stdout, "FAIL  deploy key") || !strings.Contains(stdout, "fix: run `vibedom init`") {
			t.Errorf("text report:\n%s", stdout)
		}
	})
	if _, stderr, code := c.Run(t, "", "init"); code != 0 && code != 1 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	t.Run("after init", func(t *testing.T) {
		m, _ := report(t)
		for _, n := range mine {
			if m[n].Status != "ok" {
				t.Errorf("%s: %+v, want ok", n, m[n])
			}
		}
	})
	t.Run("the kernel sessions boot", func(t *testing.T) {
		m, _ := report(t)
		gi := m["guest image"]
		if clitest.GuestKernelBuilt("amd64") && gi.Status == "ok" && strings.Contains(gi.Detail, "test image") &&
			!strings.Contains(gi.Detail, filepath.Join("amd64", "guest-kernel")) {
			t.Errorf("guest image: %+v, want the guest kernel named", gi)
		}
		cmd := c.Command(t, []string{"VIBEDOM_KERNEL=vibedom"}, "doctor", "--json")
		out, _ := cmd.Output()
		if !strings.Contains(string(out), "use auto") || !strings.Contains(string(out), "unset VIBEDOM_KERNEL") {
			t.Errorf("a VIBEDOM_KERNEL typo:\n%s", out)
		}
	})
	t.Run("a key readable by others", func(t *testing.T) {
		p := filepath.Join(c.Home, "keys", "id_ed25519_vibedom")
		os.Chmod(p, 0o644)
		defer os.Chmod(p, 0o600)
		m, code := report(t)
		if code != 1 || m["deploy key"].Status != "fail" || m["deploy key"].Fix != "chmod 600 "+p {
			t.Errorf("exit %d, %+v", code, m["deploy key"])
		}
	})
	t.Run("a key that is a symlink", func(t *testing.T) {
		p := filepath.Join(c.Home, "keys", "dlp_audit.key")
		os.Rename(p, p+".real")
		os.Symlink(p+".real", p)
		defer func() { os.Remove(p); os.Rename(p+".real", p) }()
		m, code := report(t)
		if code != 1 || m["DLP audit key"].Status != "fail" || !strings.Contains(m["DLP audit key"].Detail, "not a regular file") {
			t.Errorf("exit %d, %+v", code, m["DLP audit key"])
		}
	})
	t.Run("a home others can write", func(t *testing.T) {
		fi, _ := os.Stat(c.Home)
		os.Chmod(c.Home, 0o777)
		defer os.Chmod(c.Home, fi.Mode().Perm())
		m, code := report(t)
		if code != 1 || m["vibedom home"].Status != "fail" || m["vibedom home"].Fix != "chmod go-w "+c.Home {
			t.Errorf("exit %d, %+v", code, m["vibedom home"])
		}
	})
	t.Run("an allowlist that does not parse", func(t *testing.T) {
		p := filepath.Join(c.Home, "trusted_domains.txt")
		old, _ := os.ReadFile(p)
		os.WriteFile(p, []byte("api.example.com\nnot a rule at all !!\n"), 0o600)
		defer os.WriteFile(p, old, 0o600)
		m, code := report(t)
		if code != 1 || m["allowlist"].Status != "fail" || !strings.Contains(m["allowlist"].Fix, p) {
			t.Errorf("exit %d, %+v", code, m["allowlist"])
		}
	})
}
