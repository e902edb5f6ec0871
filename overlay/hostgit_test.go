//go:build unix

package overlay

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHostGitRunsNothingTheWorkspaceConfigures is issue 18 item 7: the
// workspace's repository plants, in .git/config, a clean and a smudge
// filter (selected by .gitattributes), core.fsmonitor, an external diff,
// a textconv, a credential helper, an ssh command, an include with more of
// the same, and every hook git has. Each writes a marker file when run. A
// session's baseline (manifest: the git calls), the patch (old contents
// from the object store), the plan and the apply (hooks directory, old
// contents, a three-way merge) must run none of them.
func TestHostGitRunsNothingTheWorkspaceConfigures(t *testing.T) {
	t.Parallel()
	have(t, "git")
	root := t.TempDir()
	marks := filepath.Join(root, "marks")
	os.Mkdir(marks, 0o755)
	planted := func(name string) string { return "touch " + filepath.Join(marks, name) + " #" }
	s := testSession{ws: filepath.Join(root, "ws"), dir: filepath.Join(root, "session"), bases: map[string]baseRec{}}
	os.Mkdir(s.ws, 0o755)
	os.Mkdir(s.dir, 0o755)
	writeTree(t, s.ws, tree{"f.txt": "file:one\ntwo\nthree\nfour\nfive\n", "dirty.txt": "file:d\n", "g.txt": "file:g\n"})
	mustRun(t, s.ws, "git", "init", "-q")
	mustRun(t, s.ws, "git", "add", "-A")
	mustRun(t, s.ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	// Planted after the commit, so setting up runs none of it.
	writeFile(t, filepath.Join(s.ws, ".gitattributes"), "* filter=evil diff=evil\n", 0o644)
	writeFile(t, filepath.Join(s.ws, ".git/included"), "[core]\n\tfsmonitor = "+planted("include-fsmonitor")+"\n", 0o644)
	cfg := "[filter \"evil\"]\n\tclean = " + planted("clean") + "\n\tsmudge = " + planted("smudge") + "\n\tprocess = " + planted("process") + "\n\trequired = true\n" +
		"[core]\n\tfsmonitor = " + planted("fsmonitor") + "\n\tsshCommand = " + planted("ssh") + "\n\tpager = " + planted("pager") + "\n" +
		"[diff]\n\texternal = " + planted("diff-external") + "\n[diff \"evil\"]\n\ttextconv = " + planted("textconv") + "\n\tcommand = " + planted("diff-command") + "\n" +
		"[credential]\n\thelper = !" + planted("credential") + "\n" +
		"[include]\n\tpath = included\n"
	f, err := os.OpenFile(filepath.Join(s.ws, ".git/config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(cfg)
	f.Close()
	for _, h := range []string{"pre-commit", "post-checkout", "post-merge", "pre-auto-gc", "post-index-change", "reference-transaction", "fsmonitor-watchman", "post-rewrite", "pre-push"} {
		writeFile(t, filepath.Join(s.ws, ".git/hooks", h), "#!/bin/sh\n"+planted("hook-"+h)+"\n", 0o755)
	}
	// A file git must hash again (content changed, same size) and one it
	// must check (stat changed): diff-files runs the clean filter on these.
	writeFile(t, filepath.Join(s.ws, "dirty.txt"), "D\n", 0o644)
	now := testTime
	os.Chtimes(filepath.Join(s.ws, "g.txt"), now, now)

	bl, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{Mode: BaselineManifest})
	if err != nil {
		t.Fatal(err)
	}
	noneRan := func(when string) {
		t.Helper()
		ran, _ := os.ReadDir(marks)
		for _, e := range ran {
			t.Errorf("%s: vibedom's git ran the workspace's %s", when, e.Name())
		}
	}
	noneRan("baseline")
	if !bl.meta.Git {
		t.Fatal("the baseline used no git data: the test exercises nothing")
	}
	// The user edits f.txt during the session: its start content comes
	// from the object store; the agent edits another line: a merge.
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "f.txt"), "one\ntwo\nthree\nfour\nFIVE\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "f.txt"), "ONE\ntwo\nthree\nfour\nfive\n", 0o644)
	s.finish(t, a)
	if old, err := bl.Old("f.txt"); err != nil || string(old.Content) != "one\ntwo\nthree\nfour\nfive\n" || old.Unknown {
		t.Fatalf("the start content of f.txt from git: %q %v %v", old.Content, old.Unknown, err)
	}
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(s.ws, "f.txt")); got != "ONE\ntwo\nthree\nfour\nFIVE\n" {
		t.Errorf("f.txt: %q (%v)", got, rep.Results)
		for _, f := range rep.Plan.Files {
			t.Logf("%+v", f.Conflict)
		}
	}
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
		t.Fatal(err)
	}
	noneRan("patch, apply, undo")
	// The planted commands are live: git run the ordinary way runs them.
	cmd := exec.Command("git", "diff-files")
	cmd.Dir = s.ws
	cmd.Run()
	if ran, _ := os.ReadDir(marks); len(ran) == 0 {
		t.Errorf("plain git ran none of the planted commands: the test proves nothing")
	} else {
		var names []string
		for _, e := range ran {
			names = append(names, e.Name())
		}
		t.Logf("plain git diff-files ran: %s", strings.Join(names, ", "))
	}
}

// TestFindGitRepo: the repository of a work tree, a linked worktree (a
// gitdir: file with commondir) and a .git symlink, found without git.
func TestFindGitRepo(t *testing.T) {
	t.Parallel()
	have(t, "git")
	root := t.TempDir()
	main := filepath.Join(root, "main")
	os.Mkdir(main, 0o755)
	mustRun(t, main, "git", "init", "-q")
	writeFile(t, filepath.Join(main, "a"), "a\n", 0o644)
	mustRun(t, main, "git", "add", "a")
	mustRun(t, main, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "a")
	mustRun(t, main, "git", "worktree", "add", "-q", filepath.Join(root, "wt"))
	os.Mkdir(filepath.Join(root, "linked"), 0o755)
	os.Symlink(filepath.Join(main, ".git"), filepath.Join(root, "linked", ".git"))
	for _, tc := range []struct{ ws, common string }{
		{filepath.Join(main, "sub"), filepath.Join(main, ".git")},
		{filepath.Join(root, "wt"), filepath.Join(main, ".git")},
		{filepath.Join(root, "linked"), filepath.Join(root, "linked", ".git")},
	} {
		os.MkdirAll(tc.ws, 0o755)
		r, ok := findGitRepo(tc.ws)
		if !ok || filepath.Clean(r.commonDir) != tc.common {
			t.Errorf("findGitRepo(%s): %+v %v, want common dir %s", tc.ws, r, ok, tc.common)
		}
	}
	if blobs := gitCleanBlobs(t.Context(), filepath.Join(root, "wt")); blobs["a"] == "" {
		t.Errorf("no blob ids in a linked worktree: %v", blobs)
	}
}

// shortGitTimeout cuts the deadline on host git for one test that expects
// git to hang (a FIFO it waits on), restoring it after. Such tests are not
// parallel: gitTimeout is the package's.
func shortGitTimeout(t *testing.T, d time.Duration) {
	t.Helper()
	old := gitTimeout
	gitTimeout = d
	t.Cleanup(func() { gitTimeout = old })
}

// TestBaselineFIFOInGitDir: a repository whose .git holds a FIFO (as its
// config, its HEAD, or deeper, as a branch's ref) must not hang the
// baseline: a FIFO among the files git opens first makes the workspace
// count as no repository; one deeper is cut off by gitTimeout.
func TestBaselineFIFOInGitDir(t *testing.T) {
	have(t, "git")
	shortGitTimeout(t, 3*time.Second)
	for _, fifo := range []string{"config", "HEAD", "refs/heads/main"} {
		t.Run(fifo, func(t *testing.T) {
			root := t.TempDir()
			ws := filepath.Join(root, "ws")
			os.Mkdir(ws, 0o755)
			writeTree(t, ws, tree{"f.txt": "file:one\n"})
			mustRun(t, ws, "git", "init", "-q", "-b", "main")
			mustRun(t, ws, "git", "add", "-A")
			mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
			p := filepath.Join(ws, ".git", filepath.FromSlash(fifo))
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := TakeBaseline(t.Context(), ws, filepath.Join(root, "baseline"), BaselineOptions{Mode: BaselineManifest})
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("TakeBaseline: %v", err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatal("TakeBaseline hangs on a FIFO in .git")
			}
		})
	}
}

// TestFindGitRepoRefusesDeviceFiles: a repository whose alternates file or
// current branch's ref is a symlink to a device (git would read /dev/zero
// into memory without end) counts as none. Checked without running git.
func TestFindGitRepoRefusesDeviceFiles(t *testing.T) {
	have(t, "git")
	for _, planted := range []string{"objects/info/alternates", "refs/heads/main"} {
		t.Run(planted, func(t *testing.T) {
			ws := t.TempDir()
			writeTree(t, ws, tree{"f.txt": "file:one\n"})
			mustRun(t, ws, "git", "init", "-q", "-b", "main")
			mustRun(t, ws, "git", "add", "-A")
			mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
			real, err := filepath.EvalSymlinks(ws)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := findGitRepo(real); !ok {
				t.Fatal("the plain repository is not found")
			}
			p := filepath.Join(ws, ".git", filepath.FromSlash(planted))
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.Remove(p)
			if err := os.Symlink("/dev/zero", p); err != nil {
				t.Fatal(err)
			}
			if _, ok := findGitRepo(real); ok {
				t.Errorf("a repository whose %s is /dev/zero is used", planted)
			}
		})
	}
}
