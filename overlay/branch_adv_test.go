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

// TestBranchRefDevicesAdv (adversarial): apply --branch reads the branch
// it is to make and every branch in its way (for-each-ref over the name and
// its prefixes): a FIFO there (planted in the repository, beside the name
// the user is likely to pick) hung it until the git deadline, and a
// symlink to /dev/zero would have git read without end. It is refused at
// once, without running git on it.
func TestBranchRefDevicesAdv(t *testing.T) {
	have(t, "git")
	shortGitTimeout(t, 5*time.Second)
	for _, tc := range []struct{ name, planted, branch string }{
		{"the name itself", "refs/heads/vibedom-change", "vibedom-change"},
		{"under the name", "refs/heads/vibedom/x", "vibedom"},
		{"a prefix of the name", "refs/heads/vibedom", "vibedom/change"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := branchRepo(t, tree{"a.txt": "file:a\n"}, nil)
			a := s.agentTree(t)
			writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
			s.finish(t, a)
			p := filepath.Join(s.ws, ".git", filepath.FromSlash(tc.planted))
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := unix.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err := Branch(t.Context(), BranchOptions{Apply: ApplyOptions{Workspace: s.ws, SessionDir: s.dir}, Branch: tc.branch})
			if err == nil || strings.Contains(err.Error(), "did not finish") || time.Since(start) >= gitTimeout {
				t.Errorf("Branch: %v after %v, want a refusal before git reads the FIFO", err, time.Since(start))
			}
		})
	}
}
