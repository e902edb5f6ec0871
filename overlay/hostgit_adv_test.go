//go:build unix

package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFindGitRepoRefusesHugeOrDeviceAdv (adversarial): the files host git
// reads whole into memory can be made endless in ways the first check
// missed: an objects/info/alternates that is regular but names another
// object store whose alternates is /dev/zero or a FIFO (git follows the
// chain), and sparse regular files of many GiB as the alternates, the
// branch ref, HEAD, commondir or config (git reads each into memory). Such
// a repository counts as none; checked without running git.
func TestFindGitRepoRefusesHugeOrDeviceAdv(t *testing.T) {
	t.Parallel()
	have(t, "git")
	sparse := func(t *testing.T, p, head string) {
		t.Helper()
		os.Remove(p)
		if err := os.WriteFile(p, []byte(head), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 8<<30); err != nil {
			t.Skipf("no sparse file here: %v", err)
		}
	}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, ws, git string)
	}{
		{"alternates-chain-to-dev-zero", func(t *testing.T, ws, git string) {
			os.MkdirAll(filepath.Join(ws, "other/objects/info"), 0o755)
			os.Symlink("/dev/zero", filepath.Join(ws, "other/objects/info/alternates"))
			writeFile(t, filepath.Join(git, "objects/info/alternates"), "../../other/objects\n", 0o644)
		}},
		{"alternates-chain-absolute-to-fifo", func(t *testing.T, ws, git string) {
			os.MkdirAll(filepath.Join(ws, "a/objects/info"), 0o755)
			os.MkdirAll(filepath.Join(ws, "b/objects/info"), 0o755)
			writeFile(t, filepath.Join(git, "objects/info/alternates"), "# a comment\n"+filepath.Join(ws, "a/objects")+"\n", 0o644)
			writeFile(t, filepath.Join(ws, "a/objects/info/alternates"), "../../b/objects\n", 0o644)
			if err := unix.Mkfifo(filepath.Join(ws, "b/objects/info/alternates"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"alternates-cr-decoy", func(t *testing.T, ws, git string) {
			// git keeps a carriage return in the path: "objects\r" is
			// another folder than the benign "objects".
			os.MkdirAll(filepath.Join(ws, "decoy/objects/info"), 0o755)
			os.MkdirAll(filepath.Join(ws, "decoy/objects\r/info"), 0o755)
			os.Symlink("/dev/zero", filepath.Join(ws, "decoy/objects\r/info/alternates"))
			writeFile(t, filepath.Join(git, "objects/info/alternates"), "../../decoy/objects\r\n", 0o644)
		}},
		{"sparse-alternates", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "objects/info/alternates"), "")
		}},
		{"sparse-branch-ref", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "refs/heads/main"), "")
		}},
		{"sparse-branch-ref-head-without-blank", func(t *testing.T, ws, git string) {
			writeFile(t, filepath.Join(git, "HEAD"), "ref:\trefs/heads/main\n", 0o644)
			sparse(t, filepath.Join(git, "refs/heads/main"), "")
		}},
		{"symref-chain-to-dev-zero", func(t *testing.T, ws, git string) {
			writeFile(t, filepath.Join(git, "refs/heads/main"), "ref: refs/heads/other\n", 0o644)
			os.Symlink("/dev/zero", filepath.Join(git, "refs/heads/other"))
		}},
		{"sparse-commit-graph-chain", func(t *testing.T, ws, git string) {
			os.MkdirAll(filepath.Join(git, "objects/info/commit-graphs"), 0o755)
			sparse(t, filepath.Join(git, "objects/info/commit-graphs/commit-graph-chain"), "")
		}},
		{"sparse-grafts", func(t *testing.T, ws, git string) {
			os.MkdirAll(filepath.Join(git, "info"), 0o755)
			sparse(t, filepath.Join(git, "info/grafts"), "")
		}},
		{"sparse-head", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "HEAD"), "ref: refs/heads/main\n")
		}},
		{"sparse-commondir", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "commondir"), ".\n")
		}},
		{"sparse-config", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "config"), "[core]\n\tbare = false\n[a]\n\tb = ")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
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
			os.MkdirAll(filepath.Join(real, ".git/objects/info"), 0o755)
			tc.plant(t, real, filepath.Join(real, ".git"))
			if _, ok := findGitRepo(real); ok {
				t.Errorf("the repository is used: host git would read without end")
			}
		})
	}
	// A legitimate chain (a clone with --reference) is still a repository.
	t.Run("alternates-legit", func(t *testing.T) {
		t.Parallel()
		root := t.TempDir()
		src := filepath.Join(root, "src")
		os.Mkdir(src, 0o755)
		writeTree(t, src, tree{"f.txt": "file:one\n"})
		mustRun(t, src, "git", "init", "-q", "-b", "main")
		mustRun(t, src, "git", "add", "-A")
		mustRun(t, src, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
		mustRun(t, root, "git", "clone", "-q", "--shared", src, "ws")
		real, _ := filepath.EvalSymlinks(filepath.Join(root, "ws"))
		if _, ok := findGitRepo(real); !ok {
			t.Errorf("a clone --shared (objects/info/alternates naming its source) is not found")
		}
	})
}

// TestRepoConfigRefusesDeviceIncludesAdv (adversarial): `git config
// --list` and `git rev-parse`, which apply runs with the repository's own
// config, read every file it includes to the end: an include.path (or an
// includeIf's, whatever its condition) naming a FIFO, a nested include of
// one, or a sparse file of many GiB had host git hang until its deadline
// or allocate without end. Such a config is refused at once, before git
// runs; an ordinary include still works.
func TestRepoConfigRefusesDeviceIncludesAdv(t *testing.T) {
	have(t, "git")
	shortGitTimeout(t, 5*time.Second)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, ws, git string) string // the config text appended
	}{
		{"fifo", func(t *testing.T, ws, git string) string {
			unix.Mkfifo(filepath.Join(ws, "inc"), 0o644)
			return "[include]\n\tpath = ../inc\n"
		}},
		{"includeif-fifo", func(t *testing.T, ws, git string) string {
			unix.Mkfifo(filepath.Join(ws, "inc"), 0o644)
			return "[includeIf \"onbranch:main\"]\n\tpath = " + filepath.Join(ws, "inc") + "\n"
		}},
		{"nested-fifo", func(t *testing.T, ws, git string) string {
			unix.Mkfifo(filepath.Join(ws, "inc2"), 0o644)
			writeFile(t, filepath.Join(git, "inc1"), "[include]\n\tpath = ../inc2\n", 0o644)
			return "[include]\n\tpath = inc1\n"
		}},
		{"sparse", func(t *testing.T, ws, git string) string {
			p := filepath.Join(ws, "inc")
			writeFile(t, p, "[a]\n\tb = ", 0o644)
			// 256 MiB: more than enough to refuse, little for git to read
			// should the check be missing.
			if err := os.Truncate(p, 256<<20); err != nil {
				t.Skipf("no sparse file here: %v", err)
			}
			return "[include]\n\tpath = ../inc\n"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			writeTree(t, ws, tree{"f.txt": "file:one\n"})
			mustRun(t, ws, "git", "init", "-q", "-b", "main")
			mustRun(t, ws, "git", "add", "f.txt")
			mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
			real, _ := filepath.EvalSymlinks(ws)
			appendGitConfig(t, real, tc.plant(t, real, filepath.Join(real, ".git")))
			start := time.Now()
			_, _, err := repoConfig(t.Context(), real)
			if err == nil || strings.Contains(err.Error(), "did not finish") || time.Since(start) > gitTimeout {
				t.Errorf("repoConfig: %v after %v, want a refusal before git runs", err, time.Since(start))
			}
		})
	}
	t.Run("ordinary-include", func(t *testing.T) {
		ws := t.TempDir()
		mustRun(t, ws, "git", "init", "-q", "-b", "main")
		real, _ := filepath.EvalSymlinks(ws)
		writeFile(t, filepath.Join(real, ".git", "inc1"), "[core]\n\thooksPath = tools/hooks\n", 0o644)
		appendGitConfig(t, real, "[include]\n\tpath = inc1\n[includeIf \"gitdir:/nowhere/\"]\n\tpath = /nowhere/x\n")
		_, entries, err := repoConfig(t.Context(), real)
		found := false
		for _, e := range entries {
			found = found || e.key == "core.hookspath" && e.value == "tools/hooks"
		}
		if err != nil || !found {
			t.Errorf("repoConfig: %v, hooksPath from the include found: %v", err, found)
		}
	})
}

// appendGitConfig appends text to the .git/config of the repository at ws.
func appendGitConfig(t *testing.T, ws, text string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(ws, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// TestBaselineFIFOAttributesAdv (adversarial): a .gitattributes that is a
// FIFO, in the work tree's top or beside a tracked file, with an index
// older than the files (racily clean entries git hashes again, reading the
// attributes on their way): the baseline's diff-files waited on it until
// the git deadline at every session start. The baseline goes on without
// git data at once.
func TestBaselineFIFOAttributesAdv(t *testing.T) {
	have(t, "git")
	shortGitTimeout(t, 5*time.Second)
	for _, at := range []string{".gitattributes", "sub/.gitattributes"} {
		t.Run(at, func(t *testing.T) {
			root := t.TempDir()
			ws := filepath.Join(root, "ws")
			os.Mkdir(ws, 0o755)
			writeTree(t, ws, tree{"f.txt": "file:one\n", "sub/g.txt": "file:two\n"})
			mustRun(t, ws, "git", "init", "-q", "-b", "main")
			mustRun(t, ws, "git", "add", "-A")
			mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
			if err := unix.Mkfifo(filepath.Join(ws, at), 0o644); err != nil {
				t.Fatal(err)
			}
			long := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
			if err := os.Chtimes(filepath.Join(ws, ".git", "index"), long, long); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := TakeBaseline(t.Context(), ws, filepath.Join(root, "baseline"), BaselineOptions{Mode: BaselineManifest}); err != nil {
				t.Fatalf("TakeBaseline: %v", err)
			}
			if d := time.Since(start); d >= gitTimeout {
				t.Errorf("TakeBaseline took %v: it waited on the FIFO until the git deadline", d)
			}
		})
	}
}

// TestFindGitRepoLongCommondirAdv (adversarial): git follows a commondir
// file of any length (it trims only the newlines at its end); one padded
// past the 4 KiB findGitRepo reads was ignored, so the checks ran on the
// wrong folder while git used the one it names, here a repository whose
// alternates is /dev/zero. Such a repository counts as none.
func TestFindGitRepoLongCommondirAdv(t *testing.T) {
	t.Parallel()
	have(t, "git")
	root := t.TempDir()
	other := filepath.Join(root, "other")
	os.Mkdir(other, 0o755)
	mustRun(t, other, "git", "init", "-q", "-b", "main")
	os.MkdirAll(filepath.Join(other, ".git/objects/info"), 0o755)
	if err := os.Symlink("/dev/zero", filepath.Join(other, ".git/objects/info/alternates")); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o755)
	writeTree(t, ws, tree{"f.txt": "file:one\n"})
	mustRun(t, ws, "git", "init", "-q", "-b", "main")
	writeFile(t, filepath.Join(ws, ".git/commondir"), filepath.Join(other, ".git")+strings.Repeat("\n", 5000), 0o644)
	real, _ := filepath.EvalSymlinks(ws)
	if r, ok := findGitRepo(real); ok {
		t.Errorf("the repository is used with common dir %s; git uses %s", r.commonDir, filepath.Join(other, ".git"))
	}
}

// TestFindGitRepoGitfileAsGitReadsItAdv (adversarial): git takes a .git
// file's whole text after "gitdir: " as the path (newlines trimmed only at
// its end), so "gitdir: A\n/../B" is the folder A\n/../B to git, while
// findGitRepo read only A: its checks ran on a decoy. It now reads the
// path as git does (or counts the repository as none).
func TestFindGitRepoGitfileAsGitReadsItAdv(t *testing.T) {
	t.Parallel()
	have(t, "git")
	root := t.TempDir()
	decoy := filepath.Join(root, "decoy")
	os.Mkdir(decoy, 0o755)
	mustRun(t, decoy, "git", "init", "-q", "-b", "main")
	// The path git follows: decoy/".git\n"/../evil/.git = decoy/evil/.git.
	os.Mkdir(filepath.Join(decoy, ".git\n"), 0o755)
	evil := filepath.Join(decoy, "evil")
	os.Mkdir(evil, 0o755)
	mustRun(t, evil, "git", "init", "-q", "-b", "main")
	os.MkdirAll(filepath.Join(evil, ".git/objects/info"), 0o755)
	if err := os.Symlink("/dev/zero", filepath.Join(evil, ".git/objects/info/alternates")); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o755)
	writeFile(t, filepath.Join(ws, ".git"), "gitdir: "+filepath.Join(decoy, ".git")+"\n/../evil/.git\n", 0o644)
	real, _ := filepath.EvalSymlinks(ws)
	if r, ok := findGitRepo(real); ok {
		t.Errorf("the repository is used with git dir %q; git uses %s", r.gitDir, filepath.Join(evil, ".git"))
	}
}

// TestBaselineSparseIndexAdv (adversarial): an index that is a sparse file
// of many GiB whose header claims millions of entries has git parse them
// all into memory (3 million took git 540 MB before it gave up; the count
// goes to 2^31). The baseline does not run git on it: a git that records
// being run stands in for the real one.
func TestBaselineSparseIndexAdv(t *testing.T) {
	have(t, "git")
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o755)
	writeTree(t, ws, tree{"f.txt": "file:one\n"})
	mustRun(t, ws, "git", "init", "-q", "-b", "main")
	mustRun(t, ws, "git", "add", "-A")
	idx := filepath.Join(ws, ".git", "index")
	hdr := []byte{'D', 'I', 'R', 'C', 0, 0, 0, 2, 0x7f, 0xff, 0xff, 0xff}
	if err := os.WriteFile(idx, hdr, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(idx, 64<<30); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	bin := filepath.Join(root, "bin")
	os.Mkdir(bin, 0o755)
	mark := filepath.Join(root, "ran")
	writeFile(t, filepath.Join(bin, "git"), "#!/bin/sh\necho \"$@\" >> "+mark+"\nexit 1\n", 0o755)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if _, err := TakeBaseline(t.Context(), ws, filepath.Join(root, "baseline"), BaselineOptions{Mode: BaselineManifest}); err != nil {
		t.Fatalf("TakeBaseline: %v", err)
	}
	if ran, _ := os.ReadFile(mark); strings.Contains(string(ran), "ls-files") || strings.Contains(string(ran), "diff-files") {
		t.Errorf("git ran on the sparse index: %s", ran)
	}
}

// TestBaselineConfigIncludeFIFOAdv (adversarial): the baseline asks git
// for the session's base commit with the repository's own git directory,
// so git reads its config and every file that includes: a FIFO there held
// each session's start until the git deadline (and /dev/tty would have
// git read the user's keystrokes). The include is checked first.
func TestBaselineConfigIncludeFIFOAdv(t *testing.T) {
	have(t, "git")
	shortGitTimeout(t, 5*time.Second)
	root := t.TempDir()
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o755)
	writeTree(t, ws, tree{"f.txt": "file:one\n"})
	mustRun(t, ws, "git", "init", "-q", "-b", "main")
	mustRun(t, ws, "git", "add", "-A")
	mustRun(t, ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	if err := unix.Mkfifo(filepath.Join(ws, "inc"), 0o644); err != nil {
		t.Fatal(err)
	}
	appendGitConfig(t, ws, "[include]\n\tpath = ../inc\n")
	start := time.Now()
	if _, err := TakeBaseline(t.Context(), ws, filepath.Join(root, "baseline"), BaselineOptions{Mode: BaselineManifest}); err != nil {
		t.Fatalf("TakeBaseline: %v", err)
	}
	if d := time.Since(start); d >= gitTimeout {
		t.Errorf("TakeBaseline took %v: git waited on the included FIFO until its deadline", d)
	}
}
