//go:build unix

package overlay

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTouchedThenUserEdited is issue 18 item 2: busybox touch, chmod and
// chown copy a file up without opening it, so the guest records no base.
// When the user then edits the file on the host, the agent's copy still
// holds the session-start content: that is no change of the agent's, and
// taking "the agent's" side must not revert the user's edit. A chmod is
// carried on its own, as a mode change.
func TestTouchedThenUserEdited(t *testing.T) {
	t.Parallel()
	for _, mode := range []BaselineMode{BaselineClone, BaselineManifest} {
		for _, chmod := range []bool{false, true} {
			name := string(mode) + "/touch"
			if chmod {
				name = string(mode) + "/chmod"
			}
			t.Run(name, func(t *testing.T) {
				s := gitSession(t, tree{"f.txt": "file:one\ntwo\n"})
				if bl, _ := OpenBaseline(filepath.Join(s.dir, BaselineDir)); bl.Mode() != mode {
					s = manifestSession(t, s, mode)
				}
				s.bases = nil // touch/chmod: no open, no base record
				a := s.agentTree(t)
				perm := os.FileMode(0o644)
				if chmod {
					perm = 0o755
				}
				writeFile(t, filepath.Join(a, "f.txt"), "one\ntwo\n", perm)                // the copy-up, content as at start
				writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nuser line\n", 0o644) // the user, during the session
				info := s.finish(t, a)
				for _, f := range info.Files {
					if f.Path == "f.txt" && (f.BaseUnknown || f.Added+f.Deleted > 0) {
						t.Errorf("f.txt in the patch as %+v; want no content change", f)
					}
				}
				rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir,
					Resolve: func(*Conflict) Resolution { return TakeAgent }})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "one\ntwo\nuser line\n"; got != want {
					t.Errorf("f.txt: got %q, want the user's %q (%v)", got, want, rep.Results)
				}
				fi, err := os.Stat(filepath.Join(s.ws, "f.txt"))
				if err != nil {
					t.Fatal(err)
				}
				if exec := fi.Mode()&0o100 != 0; exec != chmod {
					t.Errorf("f.txt mode %v: the agent's chmod (%v) not carried on its own (%v)", fi.Mode(), chmod, rep.Results)
				}
			})
		}
	}
}
