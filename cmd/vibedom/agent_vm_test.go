package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/agents/agentstest"
	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// guestImageHome inits a home with the test mirror's guest image for the
// host arch (see TestGuestImageVM) and returns it with the test build.
func guestImageHome(t *testing.T, extraInit ...string) (*cliRun, string) {
	t.Helper()
	requireVM(t)
	arch, err := alpine.GuestArch(runtime.GOARCH)
	if err != nil {
		t.Skip(err)
	}
	assets, err := alpinetest.FindAssets(arch)
	if err != nil {
		t.Skipf("no Debian userland for %s (scripts/fetch-assets.sh): %v", arch, err)
	}
	key, err := alpinetest.NewKey("agent-e2e@vibedom-1.rsa.pub")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := alpinetest.BuildDebianRepo(alpinetest.DebianOptions{Arch: arch, Assets: assets, Root: t.TempDir(), Key: key,
		CacheDir: alpinetest.CacheDirFor(assets)})
	if err != nil {
		t.Fatal(err)
	}
	srv := repo.Serve()
	t.Cleanup(srv.Close)
	keys := t.TempDir()
	os.MkdirAll(filepath.Join(keys, arch), 0o755)
	os.WriteFile(filepath.Join(keys, arch, key.Name), key.PublicPEM, 0o644)
	c := newCLI(t)
	c.env = append(c.env, "VIBEDOM_TEST_ALPINE_KEYS="+keys)
	bin := vibedomTestKeysBin(t)
	stdout, stderr, code := c.runWith(t, bin, "", append([]string{"init", "--mirror", srv.URL}, extraInit...)...)
	if code != 0 {
		t.Fatalf("init: exit %d\n%s\n%s", code, stdout, stderr)
	}
	return c, bin
}

// TestAgentCodexVM: `vibedom init --agents codex` from a local registry
// (the real package, fetched with npm pack), then `vibedom run --agent
// codex` runs the real codex binary from its own read-only layer, as the
// agent user, with vibedom's flags.
func TestAgentCodexVM(t *testing.T) {
	arch, _ := agents.GuestArch(runtime.GOARCH)
	// The test guest's userland is glibc; codex's build is static musl and
	// runs on either.
	p, err := agents.Lookup("codex", arch, agents.LibcGlibc)
	if err != nil {
		t.Fatal(err)
	}
	reg := agentstest.Serve(t, map[agents.Pin]string{p: agentstest.Tarball(t, p)})
	c, bin := guestImageHome(t, "--agents", "codex", "--registry", reg.URL)
	ws := sampleWorkspace(t)
	// The config's default agent is used when no command is given; here
	// the flag wins, and the words after -- are codex's.
	os.WriteFile(filepath.Join(c.home, "config"), []byte("agent = shell\n"), 0o600)
	stdout, stderr, code := c.runWith(t, bin, "", "run", ws, "--agent", "codex", "--no-network", "--no-review", "--", "--version")
	if code != 0 || !strings.Contains(stdout, "codex-cli "+p.Version[:strings.Index(p.Version, "-")]) {
		t.Fatalf("codex --version in the VM: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// The layer image sits beside the agent's directory and is reused.
	layers, _ := filepath.Glob(filepath.Join(c.home, "agents", "*.ext4"))
	if len(layers) != 1 {
		t.Errorf("agent layers: %v", layers)
	} else {
		e2fsckImage(t, layers[0])
	}
	// Bad input: an agent not fetched, an unknown one.
	_, stderr, code = c.runWith(t, bin, "", "run", ws, "--agent", "claude", "--no-network", "--", "--version")
	if code == 0 || !strings.Contains(stderr, "vibedom init --agents claude") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("claude not fetched: exit %d %q", code, stderr)
	}
	_, stderr, code = c.runWith(t, bin, "", "run", ws, "--agent", "gpt", "--no-network", "--", "--version")
	if code == 0 || !strings.Contains(stderr, `unknown agent "gpt"`) {
		t.Errorf("unknown agent: exit %d %q", code, stderr)
	}
	c.assertNothingLeft(t)
}

// TestAgentTerminalVM: `vibedom run --agent codex` on a real
// pseudo-terminal starts codex's full-screen UI in the VM (offline and
// without a key it opens on its sign-in screen), Ctrl-C reaches it, and the
// session ends in the review.
func TestAgentTerminalVM(t *testing.T) {
	arch, _ := agents.GuestArch(runtime.GOARCH)
	p, err := agents.Lookup("codex", arch, agents.LibcGlibc)
	if err != nil {
		t.Fatal(err)
	}
	reg := agentstest.Serve(t, map[agents.Pin]string{p: agentstest.Tarball(t, p)})
	c, bin := guestImageHome(t, "--agents", "codex", "--registry", reg.URL)
	ws := sampleWorkspace(t)
	cmd := exec.Command(bin, "run", ws, "--agent", "codex", "--no-network")
	cmd.Env = c.env
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	seen := func(re *regexp.Regexp, d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			mu.Lock()
			ok := re.Match(out.Bytes())
			mu.Unlock()
			if ok {
				return true
			}
		}
		return false
	}
	dump := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	// codex's UI: its sign-in or welcome screen draws its name.
	if !seen(regexp.MustCompile(`(?i)codex|sign in|openai`), 3*time.Minute) {
		t.Fatalf("codex's UI never appeared:\n%s", dump())
	}
	// Ctrl-C until codex leaves; then the review.
	for end := time.Now().Add(60 * time.Second); ; {
		ptmx.Write([]byte{3})
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
	c.assertNothingLeft(t)
}
