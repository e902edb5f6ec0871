package lifecycle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestDetachedPreflightOnceVM: `run --detach` scans the workspace for
// secrets once, on the user's terminal side; the session host does not scan
// again, yet its log folder holds the scan's report and the host's options
// file is gone from the session folder once it runs.
func TestDetachedPreflightOnceVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	// A token shaped like GitHub's, made at run time.
	token := "ghp_" + strings.Repeat("R8mKq2Lx7Vn4", 3)
	if err := os.WriteFile(filepath.Join(ws, "deploy.sh"), []byte("export GITHUB_TOKEN="+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--no-review", "--preflight=warn", "--detach", "--name", "scanned")
	if code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, stderr)
	}
	t.Cleanup(func() { c.Run(t, "", "stop", "scanned") })
	if strings.TrimSpace(out) != "scanned" {
		t.Errorf("run --detach printed %q, want the name", out)
	}
	if n := strings.Count(stderr, "for secrets (gitleaks)"); n != 1 {
		t.Errorf("the workspace was scanned %d times, want once:\n%s", n, stderr)
	}
	if strings.Contains(stderr, token) {
		t.Error("the token was printed")
	}
	if _, err := os.Stat(filepath.Join(c.Home, "sessions", "scanned", "host.json")); !os.IsNotExist(err) {
		t.Errorf("the host's options file is still in the session folder: %v", err)
	}
	st := state(t, c, "scanned")
	logDir, _ := st["log_dir"].(string)
	rep, err := os.ReadFile(filepath.Join(logDir, "gitleaks_report.json"))
	if err != nil || !strings.Contains(string(rep), "deploy.sh") || strings.Contains(string(rep), token) {
		t.Errorf("gitleaks_report.json (%v):\n%s", err, rep)
	}
	host, _ := os.ReadFile(filepath.Join(c.Home, "logs", "host-scanned.log"))
	if strings.Contains(string(host), "for secrets (gitleaks)") || strings.Contains(string(host), "preflight:") {
		t.Errorf("the session host scanned again:\n%s", host)
	}
	if _, stderr, code := c.Run(t, "", "stop", "scanned"); code != 0 {
		t.Errorf("stop: exit %d\n%s", code, stderr)
	}
}
