package review

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPromptBranch: in a git workspace the review offers [b]ranch; the
// answer commits the changes to a new branch (default name from the
// session) and leaves the workspace alone; a name already taken is one
// line, and the prompt comes back. Outside a repository there is no
// [b]ranch.
func TestPromptBranch(t *testing.T) {
	f := newFixtureWith(t, base, map[string]string{"c.txt": "c mine\n"}, agentChanges, nil)
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = f.ws
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
		return string(out)
	}
	git("branch", "taken")
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	tm.expect("[a]pply all, [b]ranch, [r]eview")
	tm.expect("[d]iscard? ")
	tm.send("b")
	tm.expect("New branch name [vibedom/ws-1a2b]: ")
	tm.send("taken")
	if got := tm.expect("[d]iscard? "); !strings.Contains(got, "taken is already a branch") {
		t.Errorf("a taken name: %q", got)
	}
	tm.send("b")
	tm.expect("New branch name [vibedom/ws-1a2b]: ")
	tm.send("")
	r := wait(t, done)
	if r.err != nil || r.out != Branched {
		t.Fatalf("got %v %v, want branched", r.out, r.err)
	}
	tm.expect("git log -p vibedom/ws-1a2b")
	if got := read(t, filepath.Join(f.ws, "a.txt")); got != "a\n" {
		t.Errorf("the workspace changed: a.txt %q", got)
	}
	if got := git("diff", "--name-status", "HEAD", "vibedom/ws-1a2b"); got != "M\ta.txt\nD\tb.txt\nA\tnew.txt\n" {
		t.Errorf("the branch against HEAD:\n%s", got)
	}

	g := newFixture(t, base, agentChanges)
	tm, tty = newTerm(t)
	done = runOnTTY(t, Options{Apply: g.options()}, tty)
	if got := tm.expect("[d]iscard? "); strings.Contains(got, "[b]ranch") {
		t.Errorf("[b]ranch offered outside a repository: %q", got)
	}
	tm.send("k")
	wait(t, done)
}
