package lifecycle

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestTouchThenUserEditVM (issue 18 item 2): in the guest, busybox touch
// and chmod copy two files up without opening them (no base is recorded);
// the user then edits both on the host during the session. `vibedom apply
// --on-conflict agent` keeps both edits, and carries the chmod.
func TestTouchThenUserEditVM(t *testing.T) {
	clitest.RequireVM(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	c := clitest.New(t)
	ws := filepath.Join(t.TempDir(), "app")
	os.Mkdir(ws, 0o755)
	for name, content := range map[string]string{"f.txt": "one\n", "g.sh": "echo one\n"} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Committed, so a manifest baseline knows the start content.
	clitest.CommitAll(t, ws, "start")
	script := `set -e
cd /work
touch f.txt
chmod +x g.sh
echo COPIED-UP
n=0; until grep -q user /mnt/workspace/f.txt && grep -q user /mnt/workspace/g.sh; do n=$((n+1)); [ $n -lt 1500 ] || exit 9; sleep 0.2; done
echo DONE`
	cmd := exec.Command(clitest.Bin(t), "run", ws, "--memory", "512M", "--no-network", "--", "sh", "-c", script)
	cmd.Env = c.Env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	copied := make(chan struct{})
	var out bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if sc.Text() == "COPIED-UP" {
				close(copied)
			}
		}
	}()
	select {
	case <-copied:
	case <-time.After(10 * time.Minute):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the guest did not copy up:\n%s", stderr.String())
	}
	for name, content := range map[string]string{"f.txt": "one\nuser\n", "g.sh": "echo one\necho user\n"} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("vibedom run: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	so, se, code := c.Run(t, "", "apply", "--on-conflict", "agent")
	if code != 0 {
		t.Fatalf("vibedom apply: exit %d\n%s\n%s", code, so, se)
	}
	for name, want := range map[string]string{"f.txt": "one\nuser\n", "g.sh": "echo one\necho user\n"} {
		if got, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q (%v), want the user's %q\n%s\n%s", name, got, err, want, so, se)
		}
	}
	if fi, err := os.Stat(filepath.Join(ws, "g.sh")); err != nil || fi.Mode()&0o100 == 0 {
		t.Errorf("g.sh: the agent's chmod +x not applied (%v, %v)\n%s", fi.Mode(), err, so)
	}
	c.AssertNothingLeft(t)
}
