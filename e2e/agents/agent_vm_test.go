package agents

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// agentHome is clitest.GuestImageHome with the agents names (glibc builds,
// as the test guest's userland is glibc) fetched by `vibedom init --agents`
// from a local registry of their real npm packages; it returns their pins
// in the order of names.
func agentHome(t *testing.T, names ...string) (*clitest.CLI, string, []agents.Pin) {
	t.Helper()
	arch, _ := agents.GuestArch(runtime.GOARCH)
	files := map[agents.Pin]string{}
	var pins []agents.Pin
	for _, name := range names {
		p, err := agents.Lookup(name, arch, agents.LibcGlibc)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = agentstest.Tarball(t, p)
		pins = append(pins, p)
	}
	reg := agentstest.Serve(t, files)
	c, bin := clitest.GuestImageHome(t, "--agents", strings.Join(names, ","), "--registry", reg.URL)
	return c, bin, pins
}

// guestImageHomeB is clitest.GuestImageHome for a benchmark, with a home
// of its own (no shared image cache).
func guestImageHomeB(b *testing.B, extraInit ...string) (*clitest.CLI, string) {
	c := &clitest.CLI{Home: b.TempDir(), Tmp: b.TempDir()}
	c.Env = append(os.Environ(), "VIBEDOM_HOME="+c.Home, "TMPDIR="+c.Tmp, "NO_COLOR=1", "VIBEDOM_ALPINE_MIRROR=http://127.0.0.1:9/alpine")
	return clitest.InitGuestImage(b, clitest.TestKeysBin(b), c, extraInit...)
}

// TestAgentCodexVM: `vibedom init --agents codex` from a local registry
// (the real package, fetched with npm pack), then `vibedom run --agent
// codex` runs the real codex binary from its own read-only layer, as the
// agent user, with vibedom's flags.
func TestAgentCodexVM(t *testing.T) {
	// The test guest's userland is glibc; codex's build is static musl and
	// runs on either.
	c, bin, pins := agentHome(t, "codex")
	p := pins[0]
	ws := clitest.SampleWorkspace(t)
	// The config's default agent is used when no command is given; here
	// the flag wins, and the words after -- are codex's.
	os.WriteFile(filepath.Join(c.Home, "config"), []byte("agent = shell\n"), 0o600)
	stdout, stderr, code := c.RunWith(t, bin, "", "run", ws, "--agent", "codex", "--no-network", "--no-review", "--", "--version")
	if code != 0 || !strings.Contains(stdout, "codex-cli "+p.Version[:strings.Index(p.Version, "-")]) {
		t.Fatalf("codex --version in the VM: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// The layer image sits beside the agent's directory and is reused.
	layers, _ := filepath.Glob(filepath.Join(c.Home, "agents", "*.ext4"))
	if len(layers) != 1 {
		t.Errorf("agent layers: %v", layers)
	} else {
		e2fsckImage(t, layers[0])
	}
	// Bad input: an agent not fetched, an unknown one.
	_, stderr, code = c.RunWith(t, bin, "", "run", ws, "--agent", "claude", "--no-network", "--", "--version")
	if code == 0 || !strings.Contains(stderr, "vibedom init --agents claude") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("claude not fetched: exit %d %q", code, stderr)
	}
	_, stderr, code = c.RunWith(t, bin, "", "run", ws, "--agent", "gpt", "--no-network", "--", "--version")
	if code == 0 || !strings.Contains(stderr, `unknown agent "gpt"`) {
		t.Errorf("unknown agent: exit %d %q", code, stderr)
	}
	// With network and no key on the host: one line, nothing started.
	cc := *c
	cc.Env = append(append([]string(nil), c.Env...), "OPENAI_API_KEY=")
	_, stderr, code = cc.RunWith(t, bin, "", "run", ws, "--agent", "codex", "--", "--version")
	if code == 0 || !strings.Contains(stderr, "vibedom auth set openai") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("no key: exit %d %q", code, stderr)
	}
	c.AssertNothingLeft(t)
}

// TestAgentTerminalVM: `vibedom run --agent codex|claude` on a real
// pseudo-terminal starts the agent's full-screen UI in the VM (offline and
// without a key each opens on its first screen), Ctrl-C reaches it, and the
// session ends in the review.
func TestAgentTerminalVM(t *testing.T) {
	c, bin, _ := agentHome(t, "codex", "claude")
	for _, tc := range []struct {
		agent string
		ui    *regexp.Regexp // what its first screen draws
	}{
		// After the session's "ready" line (the workspace path, which
		// holds the test's name, comes before it).
		{"codex", regexp.MustCompile(`(?s)ready in .*(?i:codex|sign in|openai)`)},
		{"claude", regexp.MustCompile(`(?s)ready in .*(?i:claude|welcome|theme|log ?in)`)},
	} {
		t.Run(tc.agent, func(t *testing.T) {
			ws := clitest.SampleWorkspace(t)
			cmd := exec.Command(bin, "run", ws, "--agent", tc.agent, "--no-network")
			cmd.Env = c.Env
			term := clitest.StartOnPTY(t, cmd, 40, 120)
			seen, dump := term.Seen, term.Text
			if !seen(tc.ui, 3*time.Minute) {
				t.Fatalf("%s's UI never appeared:\n%s", tc.agent, dump())
			}
			// Ctrl-C until the agent leaves; then the review.
			for end := time.Now().Add(60 * time.Second); ; {
				term.File.Write([]byte{3})
				if seen(regexp.MustCompile(`changed nothing|Apply|apply`), 3*time.Second) {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("no review after Ctrl-C:\n%s", dump())
				}
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				t.Fatalf("vibedom did not exit:\n%s", dump())
			}
		})
	}
	c.AssertNothingLeft(t)
}

// BenchmarkAgentStartup compares, in one run, a session that starts the
// real codex (a 290 MB binary read from its layer image) with a plain-shell
// session doing nothing: the difference is the agent's start-up in the VM.
func BenchmarkAgentStartup(b *testing.B) {
	arch, _ := agents.GuestArch(runtime.GOARCH)
	p, err := agents.Lookup("codex", arch, agents.LibcGlibc)
	if err != nil {
		b.Fatal(err)
	}
	tgz := filepath.Join(agentstest.PackDir(), agents.TarballName(p))
	if _, err := os.Stat(tgz); err != nil {
		b.Skipf("no codex tarball in .cache/npm (go test ./e2e/agents -run TestAgentCodexVM fetches it): %v", err)
	}
	reg := agentstest.Serve(b, map[agents.Pin]string{p: tgz})
	c, bin := guestImageHomeB(b, "--agents", "codex", "--registry", reg.URL)
	ws := b.TempDir()
	os.WriteFile(filepath.Join(ws, "README"), []byte("x\n"), 0o644)
	timeRun := func(args ...string) time.Duration {
		start := time.Now()
		cmd := exec.Command(bin, append([]string{"run", ws, "--no-network", "--preflight=off", "--no-review"}, args...)...)
		cmd.Env = c.Env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", args, err, out)
		}
		return time.Since(start)
	}
	var shell, agent time.Duration
	for i := 0; i < b.N; i++ {
		shell += timeRun("--agent", "shell", "--", "true")
		agent += timeRun("--agent", "codex", "--", "--version")
	}
	n := float64(b.N)
	b.ReportMetric(shell.Seconds()/n, "s-session-shell")
	b.ReportMetric(agent.Seconds()/n, "s-session-codex")
	b.ReportMetric((agent-shell).Seconds()/n, "s-codex-startup")
}
