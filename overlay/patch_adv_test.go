package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPatchHugeHostFileAdv (adversarial): a workspace file far larger than
// the patch carries (a sparse file of many GiB in a downloaded archive, or
// a big data file) that the agent deletes or truncates had the host read it
// whole into memory to write the deletion, at every session's end: the
// agent picks when the host runs out of memory. The new side was bounded
// (MaxFileSize), the old side not. Such a path is now not carried, with
// the reason.
func TestPatchHugeHostFileAdv(t *testing.T) {
	for _, tc := range []struct {
		name  string
		agent func(t *testing.T, a string)
	}{
		{"deleted", func(t *testing.T, a string) {}},
		{"truncated", func(t *testing.T, a string) { writeFile(t, filepath.Join(a, "big.bin"), "small now\n", 0o644) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t, tree{"a.txt": "file:a\n"})
			big := filepath.Join(s.ws, "big.bin")
			if err := os.WriteFile(big, []byte("head"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Over the 256 MiB carried; kept small enough that the
			// unfixed code's read does no harm.
			if err := os.Truncate(big, 300<<20); err != nil {
				t.Skipf("no sparse file here: %v", err)
			}
			if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir+"2"), BaselineOptions{}); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(filepath.Join(s.dir, BaselineDir))
			if err := os.Rename(filepath.Join(s.dir, BaselineDir+"2"), filepath.Join(s.dir, BaselineDir)); err != nil {
				t.Fatal(err)
			}
			// The agent's tree by hand (a copy would fill the disk).
			a := filepath.Join(t.TempDir(), "agent")
			os.Mkdir(a, 0o755)
			writeFile(t, filepath.Join(a, "a.txt"), "A\n", 0o644)
			tc.agent(t, a)
			info := s.finish(t, a)
			var why string
			for _, n := range info.NotCarried {
				if n.Path == "big.bin" {
					why = n.Reason
				}
			}
			if why == "" || !strings.Contains(why, "larger than") {
				t.Errorf("big.bin: not carried %q, want a reason naming its size; patch is %d bytes", why, len(s.patch(t)))
			}
			if p := string(s.patch(t)); !strings.Contains(p, "a.txt") || strings.Contains(p, "big.bin") {
				t.Errorf("the patch should hold a.txt and not big.bin:\n%.300s", p)
			}
		})
	}
}
