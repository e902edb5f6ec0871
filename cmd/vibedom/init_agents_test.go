package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// `vibedom init --agents` fetches a real agent package from a local
// registry, and a later init needs no registry at all.
func TestInitAgents(t *testing.T) {
	t.Parallel()
	p, reg := agentstest.ServeSmallest(t)
	c := clitest.New(t)
	stdout, stderr, code := c.Run(t, "", "init", "--json", "--agents", p.Agent, "--registry", reg.URL)
	if code != 0 && code != 1 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	var r struct {
		DeployKey string `json:"deploy_key"`
		Agents    []struct {
			Agent, Package, Version, Integrity, Dir, Arch, Libc string
			Binary                                              string `json:"binary"`
			BinaryPath                                          string `json:"binary_path"`
			BinarySHA256                                        string `json:"binary_sha256"`
			Fresh                                               bool   `json:"fresh"`
		} `json:"agents"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("init --json: %v\n%s", err, stdout)
	}
	if !strings.HasPrefix(r.DeployKey, "ssh-ed25519 ") || len(r.Agents) != 1 {
		t.Fatalf("init --json: %s", stdout)
	}
	a := r.Agents[0]
	if a.Agent != p.Agent || a.Package != p.Package || a.Version != p.Version || a.Integrity != p.Integrity || !a.Fresh ||
		a.Dir != filepath.Join(c.Home, "agents", p.Dir()) || a.BinaryPath != filepath.Join(a.Dir, "package", p.Binary) || len(a.BinarySHA256) != 64 {
		t.Errorf("agent: %+v", a)
	}
	if st, err := os.Stat(a.BinaryPath); err != nil || st.Mode().Perm() != 0o555 {
		t.Errorf("binary: %v %v", st, err)
	}
	if !strings.Contains(stderr, p.String()) {
		t.Errorf("no progress on stderr: %q", stderr)
	}
	// Again, with the registry gone: nothing to fetch.
	reg.Close()
	stdout, stderr, code = c.Run(t, "", "init", "--json", "--agents", p.Agent, "--registry", reg.URL)
	if (code != 0 && code != 1) || !strings.Contains(stdout, `"fresh": false`) {
		t.Fatalf("second init: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// --update-agents says how pins move and keeps the installed agent.
	out, stderr, code := c.Run(t, "", "init", "--update-agents", "--registry", reg.URL)
	if (code != 0 && code != 1) || !strings.Contains(stderr, "compiled into vibedom") || !strings.Contains(stderr, p.Version) ||
		!strings.Contains(out, "Agent "+p.Agent+" "+p.Version) {
		t.Errorf("--update-agents: exit %d\n%s\n%s", code, out, stderr)
	}
}

func TestInitAgentsBadInput(t *testing.T) {
	t.Parallel()
	arch, err := agents.GuestArch(runtime.GOARCH)
	if err != nil {
		t.Skip(err)
	}
	p, err := agents.Lookup("opencode", arch, agents.LibcMusl)
	if err != nil {
		t.Fatal(err)
	}
	// A registry whose packument disagrees with the pin; its tarball is
	// never asked for.
	wrong := "sha512-" + strings.Repeat("A", 86) + "=="
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.Path)
		json.NewEncoder(w).Encode(map[string]any{"versions": map[string]any{p.Version: map[string]any{
			"dist": map[string]string{"integrity": wrong, "tarball": "http://" + r.Host + "/x.tgz"}}}})
	}))
	defer srv.Close()
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown agent", []string{"--agents", "claude,gpt"}, []string{`unknown agent "gpt"`, "claude, codex, gemini, opencode"}},
		{"unknown libc", []string{"--agents", "claude", "--agent-libc", "uclibc"}, []string{"no claude build pinned"}},
		{"integrity mismatch", []string{"--agents", "opencode", "--registry", srv.URL}, []string{"integrity mismatch", p.String(), wrong, p.Integrity, "nothing installed"}},
		{"bad registry", []string{"--agents", "opencode", "--registry", "ftp://example.invalid"}, []string{"want an http(s) URL"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := clitest.New(t)
			_, stderr, code := c.Run(t, "", append([]string{"init", "--no-image"}, tc.args...)...)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("not one line: %q", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not say %q", stderr, w)
				}
			}
			ents, _ := os.ReadDir(filepath.Join(c.Home, "agents"))
			for _, e := range ents {
				if e.Name() != ".lock" {
					t.Errorf("left in agents/: %s", e.Name())
				}
			}
			// Input refused before anything was set up.
			if _, err := os.Stat(filepath.Join(c.Home, "keys")); tc.name != "integrity mismatch" && err == nil {
				t.Errorf("init went ahead before refusing its input")
			}
		})
	}
	for _, a := range asked {
		if strings.HasSuffix(a, ".tgz") {
			t.Errorf("the tarball was fetched despite the packument's integrity: %s", a)
		}
	}
}
