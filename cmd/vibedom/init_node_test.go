package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// packTiny writes an npm pack'd-style tarball of a package with files.
func packTiny(t *testing.T, dir, name, version string, pj map[string]any, files map[string]string) string {
	t.Helper()
	pj["name"], pj["version"] = name, version
	b, _ := json.Marshal(pj)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	add := func(n, body string, mode int64) {
		tw.WriteHeader(&tar.Header{Name: "package/" + n, Mode: mode, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	add("package.json", string(b), 0o644)
	for n, body := range files {
		add(n, body, 0o755)
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(name, "@"), "/", "-")+"-"+version+".tgz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// `vibedom init --agents gemini,npm:PACKAGE@VERSION` installs both trees
// from a local registry; `vibedom run --agent …` refuses a tampered file
// or lockfile with one line before anything starts.
func TestInitNodeAgents(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	reg := agentstest.ServeNPM(t, agentstest.GeminiTarball(t),
		packTiny(t, dir, "tiny-agent", "1.0.0", map[string]any{"bin": "cli.js", "dependencies": map[string]string{"tiny-dep": "^1.0.0"}},
			map[string]string{"cli.js": "#!/usr/bin/env node\nconsole.log(require('tiny-dep'))\n"}),
		packTiny(t, dir, "tiny-dep", "1.2.0", map[string]any{}, map[string]string{"index.js": "module.exports = 'dep 1.2.0'\n"}),
		packTiny(t, dir, "tiny-dep", "2.0.0", map[string]any{}, map[string]string{"index.js": "module.exports = 'dep 2'\n"}),
	)
	c := clitest.New(t)
	stdout, stderr, code := c.Run(t, "", "init", "--no-image", "--json", "--agents", "gemini,npm:tiny-agent@1.0.0", "--registry", reg.URL)
	if code != 0 && code != 1 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	var r struct {
		Agents []agents.Manifest `json:"agents"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || len(r.Agents) != 2 {
		t.Fatalf("init --json: %v\n%s", err, stdout)
	}
	for _, a := range r.Agents {
		if a.Runtime != agents.RuntimeNode || a.LockSHA256 == "" {
			t.Errorf("agent %+v", a)
		}
	}
	lock, err := os.ReadFile(filepath.Join(c.Home, "agents", agents.NPMDir("npm:tiny-agent", "1.0.0"), agents.LockFile))
	if err != nil || !strings.Contains(string(lock), `"node_modules/tiny-dep"`) || !strings.Contains(string(lock), `"1.2.0"`) {
		t.Fatalf("lock: %v\n%s", err, lock)
	}
	ws := t.TempDir()
	// Intact: the agent passes; the missing guest image is what stops it.
	_, stderr, _ = c.Run(t, "", "run", ws, "--agent", "gemini")
	if !strings.Contains(stderr, "guest image") {
		t.Fatalf("run --agent gemini, intact: %q", stderr)
	}
	tamper := func(p string, f func([]byte) []byte) {
		os.Chmod(filepath.Dir(p), 0o755)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, 0o644)
		if err := os.WriteFile(p, f(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gem := filepath.Join(c.Home, "agents", agents.NPMDir("gemini", "0.61.0"), "package/node_modules/@google/gemini-cli/bundle/gemini.js")
	tamper(gem, func(b []byte) []byte { return append(b, "\nfetch('https://evil')\n"...) })
	tiny := filepath.Join(c.Home, "agents", agents.NPMDir("npm:tiny-agent", "1.0.0"), agents.LockFile)
	tamper(tiny, func(b []byte) []byte { return bytes.Replace(b, []byte("1.2.0"), []byte("2.0.0"), 1) })
	for agent, want := range map[string]string{"gemini": "no longer match the lock", "npm:tiny-agent": "lockfile"} {
		_, stderr, code := c.Run(t, "", "run", ws, "--agent", agent)
		if code == 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "integrity mismatch") ||
			strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("run --agent %s, tampered: exit %d %q", agent, code, stderr)
		}
	}
}

func TestInitNodeAgentsBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := packTiny(t, dir, "tiny-agent", "1.0.0", map[string]any{"bin": "cli.js"}, map[string]string{"cli.js": "x"})
	// The registry's tarball changes after its packument was made.
	bad := agentstest.ServeNPM(t, good)
	os.WriteFile(good, []byte("tampered"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no version", []string{"--agents", "npm:tiny-agent"}, "name the exact version"},
		{"range", []string{"--agents", "npm:tiny-agent@^1.0.0"}, "must be exact"},
		{"bad name", []string{"--agents", "npm:../../etc@1.0.0"}, "not an npm package name"},
		{"tampered tarball", []string{"--agents", "npm:tiny-agent@1.0.0", "--registry", bad.URL}, "integrity mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clitest.New(t)
			_, stderr, code := c.Run(t, "", append([]string{"init", "--no-image"}, tc.args...)...)
			// One error line (after the "Resolving …" note).
			if code != 2 || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "vibedom: ") != 1 {
				t.Errorf("exit %d %q, want %q", code, stderr, tc.want)
			}
			ents, _ := os.ReadDir(filepath.Join(c.Home, "agents"))
			for _, e := range ents {
				if e.Name() != ".lock" {
					t.Errorf("left in agents/: %s", e.Name())
				}
			}
		})
	}
}
