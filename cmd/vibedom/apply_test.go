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

// changesFixture makes $VIBEDOM_HOME with one ended session whose agent
// edited a.txt, deleted b.txt and tried to plant a git hook.
func changesFixture(t *testing.T) (home, ws string) {
	t.Helper()
	root := t.TempDir()
	home, ws = filepath.Join(root, "home"), filepath.Join(root, "ws")
	agent := filepath.Join(root, "agent")
	dir := filepath.Join(home, "sessions", "ws-0001")
	for _, d := range []string{ws, agent, dir, filepath.Join(ws, ".git"), filepath.Join(agent, ".git", "hooks")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][2]string{ // path: workspace, agent ("" = absent)
		"a.txt":                 {"a\n", "a by the agent\n"},
		"b.txt":                 {"b\n", ""},
		".git/hooks/pre-commit": {"", "#!/bin/sh\necho pwned\n"},
	}
	for p, c := range files {
		if c[0] != "" {
			os.WriteFile(filepath.Join(ws, p), []byte(c[0]), 0o644)
		}
	}
	st, _ := json.Marshal(map[string]any{"name": "ws-0001", "workspace": ws, "created": time.Now().UTC(), "status": "stopped", "log_dir": ""})
	os.WriteFile(filepath.Join(dir, "state.json"), st, 0o600)
	if _, err := overlay.TakeBaseline(t.Context(), ws, filepath.Join(dir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	for p, c := range files {
		if c[1] != "" {
			os.WriteFile(filepath.Join(agent, p), []byte(c[1]), 0o755)
		}
	}
	cs, err := overlay.DiffTrees(ws, agent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := overlay.WriteSessionPatch(t.Context(), dir, cs, overlay.DirSource(agent), nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIBEDOM_HOME", home)
	return home, ws
}

// capture runs the CLI with args and returns its exit code and stdout.
func capture(t *testing.T, args ...string) (int, string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = f
	code := run(t.Context(), append([]string{"vibedom"}, args...))
	os.Stdout = old
	f.Close()
	data, _ := os.ReadFile(f.Name())
	return code, string(data)
}

func TestChangesCommands(t *testing.T) {
	_, ws := changesFixture(t)
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join(ws, p))
		if err != nil {
			return "<absent>"
		}
		return string(data)
	}

	code, patch := capture(t, "diff")
	if code != 0 || !strings.Contains(patch, "diff --git a/a.txt b/a.txt") || strings.Contains(patch, "\x1b[") {
		t.Fatalf("diff: exit %d, output:\n%s", code, patch)
	}
	if _, err := exec.LookPath("git"); err == nil {
		// (git refuses .git paths itself)
		cmd := exec.Command("git", "apply", "--check", "--exclude=.git/hooks/pre-commit", "-")
		cmd.Dir, cmd.Stdin = ws, strings.NewReader(patch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("vibedom diff | git apply --check: %v\n%s", err, out)
		}
	}

	// Without a terminal, review applies nothing.
	if code, out := capture(t, "review", "ws-0001"); code != 0 || !strings.Contains(out, "Nothing applied") || read("a.txt") != "a\n" {
		t.Errorf("review without a terminal: exit %d, a.txt %q, output:\n%s", code, read("a.txt"), out)
	}

	// apply: the hook is refused (exit 1), the rest applied.
	code, out := capture(t, "apply")
	if code != 1 || !strings.Contains(out, "protected") {
		t.Errorf("apply: exit %d, want 1 with the hook refused; output:\n%s", code, out)
	}
	if got := read("a.txt"); got != "a by the agent\n" {
		t.Errorf("a.txt after apply: %q", got)
	}
	if got := read("b.txt"); got != "<absent>" {
		t.Errorf("b.txt after apply: %q", got)
	}
	if got := read(".git/hooks/pre-commit"); got != "<absent>" {
		t.Errorf("hook planted: %q", got)
	}

	if code, out := capture(t, "undo"); code != 0 || !strings.Contains(out, "restored") {
		t.Errorf("undo: exit %d, output:\n%s", code, out)
	}
	if read("a.txt") != "a\n" || read("b.txt") != "b\n" {
		t.Errorf("after undo: a.txt %q, b.txt %q", read("a.txt"), read("b.txt"))
	}
	if code, _ := capture(t, "undo"); code != 2 {
		t.Errorf("second undo: exit %d, want 2 (nothing to undo)", code)
	}
	if code, _ := capture(t, "apply", "nosuchsession"); code != 2 {
		t.Errorf("apply of a missing session: exit %d, want 2", code)
	}
}

// TestUndoForceAdvice is the red team's sequence through the CLI: apply a
// selection, apply the rest, edit a file of each apply, undo (which keeps
// the edited file of the latest apply), then follow the printed advice. The
// earlier apply is never undone over the user's edit, and what a forced
// undo overwrites comes back with the ID it prints.
func TestUndoForceAdvice(t *testing.T) {
	_, ws := changesFixture(t)
	read := func(p string) string {
		data, err := os.ReadFile(filepath.Join(ws, p))
		if err != nil {
			return "<absent>"
		}
		return string(data)
	}
	write := func(p, s string) {
		if err := os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	capture(t, "apply", "--files", "a.txt")
	capture(t, "apply", "--files", "b.txt")
	write("a.txt", "user's later edit of a\n")
	write("b.txt", "user's b, made again\n")

	code, out := capture(t, "undo")
	if code != 1 || !strings.Contains(out, "b.txt") {
		t.Fatalf("undo: exit %d, want 1 keeping b.txt; output:\n%s", code, out)
	}
	if code, _ := capture(t, "undo", "--force"); code == 0 {
		t.Errorf("undo --force without --backup: exit 0, want a refusal")
	}
	if got := read("a.txt"); got != "user's later edit of a\n" {
		t.Fatalf("a.txt: %q; the earlier apply was force-undone over the user's edit", got)
	}
	i := strings.Index(out, "--force --backup ")
	if i < 0 {
		t.Fatalf("no advice naming the apply in:\n%s", out)
	}
	id := strings.Fields(out[i+len("--force --backup "):])[0]
	id = strings.TrimRight(id, ")")
	code, out = capture(t, "undo", "--force", "--backup", id)
	if code != 0 || read("b.txt") != "b\n" || read("a.txt") != "user's later edit of a\n" {
		t.Fatalf("undo --force --backup %s: exit %d, a.txt %q, b.txt %q; output:\n%s", id, code, read("a.txt"), read("b.txt"), out)
	}
	i = strings.Index(out, "`vibedom undo --backup ")
	if i < 0 {
		t.Fatalf("the forced undo does not say how to put back what it overwrote:\n%s", out)
	}
	undoID := strings.TrimSuffix(strings.Fields(out[i+len("`vibedom undo --backup "):])[0], "`")
	if code, out := capture(t, "undo", "--backup", undoID); code != 0 || read("b.txt") != "user's b, made again\n" {
		t.Errorf("undo --backup %s: exit %d, b.txt %q; output:\n%s", undoID, code, read("b.txt"), out)
	}
	if code, out := capture(t, "undo", "--list"); code != 0 || !strings.Contains(out, "undo of "+id) {
		t.Errorf("undo --list: exit %d, output:\n%s", code, out)
	}
}
