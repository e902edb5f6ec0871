//go:build unix

package overlay

import (
	"os"
	"path/filepath"
	"testing"

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
		{"sparse-alternates", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "objects/info/alternates"), "")
		}},
		{"sparse-branch-ref", func(t *testing.T, ws, git string) {
			sparse(t, filepath.Join(git, "refs/heads/main"), "")
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
