package branch

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestApplyBranchVM: an agent in a real VM edits, adds, deletes, changes a
// mode and makes a symlink and a binary; `vibedom apply --branch` makes it
// one commit on the commit the session started from; `git log -p` and
// `git diff main...agent` show it; the work tree, index and HEAD are as
// before, and a planted post-commit hook and fsmonitor did not run.
func TestApplyBranchVM(t *testing.T) {
	clitest.RequireVM(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	git(t, ws, "init", "-q", "-b", "main")
	git(t, ws, "add", "-A")
	git(t, ws, "commit", "-qm", "start")
	start := strings.TrimSpace(git(t, ws, "rev-parse", "HEAD"))
	marks := t.TempDir()
	hook := "#!/bin/sh\ntouch " + filepath.Join(marks, "hook") + "\n"
	os.WriteFile(filepath.Join(ws, ".git/hooks/post-commit"), []byte(hook), 0o755)
	os.WriteFile(filepath.Join(ws, ".git/hooks/reference-transaction"), []byte(hook), 0o755)
	git(t, ws, "config", "core.fsmonitor", "touch "+filepath.Join(marks, "fsmonitor")+" #")

	script := `set -e
echo 'edited by the agent' >> notes.txt
printf 'new file\n' > added.txt
rm obsolete.txt
chmod 755 notes.txt
printf '\000\001\002\377binary\000' > blob.bin
ln -s notes.txt link-to-notes`
	if _, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--preflight=off", "--", "sh", "-c", script); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	before := map[string]string{}
	for _, f := range []string{".git/index", ".git/HEAD", "notes.txt", "obsolete.txt"} {
		b, _ := os.ReadFile(filepath.Join(ws, f))
		before[f] = string(b)
	}
	out, stderr, code := c.Run(t, "", "apply", "--branch", "agent", "-m", "The agent's work")
	if code != 0 {
		t.Fatalf("apply --branch: exit %d\n%s\n%s", code, out, stderr)
	}
	if ran, _ := os.ReadDir(marks); len(ran) != 0 {
		t.Errorf("the workspace's hook or fsmonitor ran: %v", ran)
	}
	for f, b := range before {
		if a, _ := os.ReadFile(filepath.Join(ws, f)); string(a) != b {
			t.Errorf("%s changed", f)
		}
	}
	if got := strings.TrimSpace(git(t, ws, "rev-parse", "agent^")); got != start {
		t.Errorf("the branch's parent is %s, want the session's start %s", got, start)
	}
	if st := git(t, ws, "diff", "--name-status", "main...agent"); st != "A\tadded.txt\nA\tblob.bin\nA\tlink-to-notes\nM\tnotes.txt\nD\tobsolete.txt\n" {
		t.Errorf("git diff main...agent:\n%s", st)
	}
	logp := git(t, ws, "log", "-p", "-1", "agent")
	for _, want := range []string{"The agent's work", "+edited by the agent", "old mode 100644\nnew mode 100755", "new file mode 120000", "Binary files"} {
		if !strings.Contains(logp, want) {
			t.Errorf("git log -p lacks %q:\n%s", want, logp)
		}
	}
}
