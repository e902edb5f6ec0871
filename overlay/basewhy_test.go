//go:build unix

package overlay

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestBaseUnknownSaysWhy (issue 18 item 3): a base-unknown conflict says
// what happened. A base the host does not hold, on a file the user never
// touched, is not "changed on the host during the session"; a copy-up with
// no recorded read, on a file the user did change, says so.
func TestBaseUnknownSaysWhy(t *testing.T) {
	t.Parallel()
	t.Run("a base the host does not hold", func(t *testing.T) {
		s := gitSession(t, tree{"f.txt": "file:one\ntwo\n"})
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "f.txt"), "one\nTWO\n", 0o644)
		s.bases["f.txt"] = baseRec{sha256hex([]byte("never on the host\n")), 0o644}
		s.finish(t, a)
		_, asked := applyAll(t, s)
		if len(asked) != 1 || asked[0].Kind != BaseUnknown {
			t.Fatalf("asked %+v, want one %q conflict", asked, BaseUnknown)
		}
		if w := asked[0].Why; !strings.Contains(w, "neither the session-start file nor yours") || strings.Contains(w, "you changed it") {
			t.Errorf("why: %q", w)
		}
	})
	t.Run("no recorded read, the user changed it", func(t *testing.T) {
		s := gitSession(t, tree{"f.txt": "file:one\ntwo\n"})
		s.bases = nil
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "f.txt"), "one\nTWO\n", 0o644)
		writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nuser\n", 0o644)
		s.finish(t, a)
		_, asked := applyAll(t, s)
		if len(asked) != 1 || !strings.Contains(asked[0].Why, "without a recorded read") {
			t.Fatalf("asked %+v, want a conflict saying the copy had no recorded read", asked)
		}
	})
}
