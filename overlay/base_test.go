//go:build unix

package overlay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// applyAll applies the session's patch with a resolver that records the
// conflicts and keeps the host's version.
func applyAll(t *testing.T, s testSession) (*Report, []*Conflict) {
	t.Helper()
	var asked []*Conflict
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Resolve: func(c *Conflict) Resolution {
		asked = append(asked, c)
		return KeepMine
	}})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return rep, asked
}

// TestMergeBaseIsTheCopyUp is the red team's case: the user deletes one of
// three identical lines on the host during the session; the agent, reading
// the live workspace, starts from that version and edits the header. A
// merge against the session-start baseline applies the deletion twice (git
// itself does: one line is left); against the version the agent's copy
// started from, the result is the agent's file, with both edits once.
func TestMergeBaseIsTheCopyUp(t *testing.T) {
	t.Parallel()
	for _, mode := range []BaselineMode{BaselineClone, BaselineManifest} {
		t.Run(string(mode), func(t *testing.T) {
			s := newTestSession(t, tree{"f.txt": "file:header\nx\nx\nx\n"})
			if bl, _ := OpenBaseline(filepath.Join(s.dir, BaselineDir)); bl.Mode() != mode {
				s = manifestSession(t, s, mode)
			}
			writeFile(t, filepath.Join(s.ws, "f.txt"), "header\nx\nx\n", 0o644) // the user, during the session
			a := s.agentTree(t)                                                 // the agent's copy-up sees it
			writeFile(t, filepath.Join(a, "f.txt"), "HEADER\nx\nx\n", 0o644)
			s.finish(t, a)
			rep, asked := applyAll(t, s)
			if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "HEADER\nx\nx\n"; got != want {
				t.Errorf("f.txt: got %q, want %q (%v, asked %v)", got, want, rep.Results, asked)
			}
			if len(asked) != 0 {
				t.Errorf("asked %v, want no conflict", asked)
			}
		})
	}
}

// manifestSession retakes a session's baseline in the given mode.
func manifestSession(t *testing.T, s testSession, mode BaselineMode) testSession {
	t.Helper()
	os.RemoveAll(filepath.Join(s.dir, BaselineDir))
	if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{Mode: mode}); err != nil {
		t.Skipf("baseline mode %s: %v", mode, err)
	}
	return s
}

// TestMergeBaseUnknownIsAConflict: when the guest names no base and the
// host file changed during the session, the agent's copy may or may not
// hold the user's edit: it is a conflict, never a merge that could apply
// the edit twice (the old behaviour lost a line here).
func TestMergeBaseUnknownIsAConflict(t *testing.T) {
	t.Parallel()
	s := gitSession(t, tree{"f.txt": "file:header\nx\nx\nx\n"})
	s.bases = nil // a guest that records nothing
	writeFile(t, filepath.Join(s.ws, "f.txt"), "header\nx\nx\n", 0o644)
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "f.txt"), "HEADER\nx\nx\n", 0o644)
	s.finish(t, a)
	_, asked := applyAll(t, s)
	if len(asked) != 1 || asked[0].Kind != BaseUnknown {
		t.Fatalf("asked %+v, want one %q conflict", asked, BaseUnknown)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "header\nx\nx\n"; got != want {
		t.Errorf("f.txt: got %q, want the user's %q kept", got, want)
	}
}

// TestCopyUpUnchangedIsNoChange: a file the overlay copied up (touched,
// chmod-ed and back, opened for writing) whose content and mode equal the
// version it was copied from is not an agent edit, even when the user
// changed the host file afterwards: it must not show as an edit reverting
// the user's.
func TestCopyUpUnchangedIsNoChange(t *testing.T) {
	t.Parallel()
	s := gitSession(t, tree{"f.txt": "file:one\ntwo\n", "g.txt": "file:g\n"})
	writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nuser 1\n", 0o644) // before the copy-up
	a := s.agentTree(t)                                                     // copied up, unchanged
	writeFile(t, filepath.Join(a, "g.txt"), "agent g\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nuser 1\nuser 2\n", 0o644) // after the copy-up
	info := s.finish(t, a)
	for _, f := range info.Files {
		if f.Path == "f.txt" {
			t.Errorf("f.txt is in the patch (%+v); the agent did not change it", f)
		}
	}
	applyAll(t, s)
	if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "one\ntwo\nuser 1\nuser 2\n"; got != want {
		t.Errorf("f.txt: got %q, want the user's %q", got, want)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "g.txt")), "agent g\n"; got != want {
		t.Errorf("g.txt: got %q, want %q", got, want)
	}
}

// TestLyingBase: the base is the guest's word. A base the host does not
// hold is a conflict; a base naming the host's current file is only a diff
// of the agent's content against it, shown in review and checked against
// the host's file again at apply; a base on anything but a file modify is
// refused.
func TestLyingBase(t *testing.T) {
	t.Parallel()
	t.Run("unknown content", func(t *testing.T) {
		s := gitSession(t, tree{"f.txt": "file:one\ntwo\nthree\n"})
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "f.txt"), "one\nTWO\nthree\n", 0o644)
		writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nthree\nuser\n", 0o644)
		s.bases["f.txt"] = baseRec{sha256hex([]byte("something the host never had\n")), 0o644}
		s.finish(t, a)
		_, asked := applyAll(t, s)
		if len(asked) != 1 || asked[0].Kind != BaseUnknown {
			t.Fatalf("asked %+v, want one %q conflict", asked, BaseUnknown)
		}
	})
	t.Run("the host's file, changed again before apply", func(t *testing.T) {
		s := gitSession(t, tree{"f.txt": "file:one\ntwo\nthree\n"})
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "f.txt"), "one\nTWO\nthree\n", 0o644)
		writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nthree\nuser\n", 0o644)
		s.bases["f.txt"] = baseRec{sha256hex([]byte("one\ntwo\nthree\nuser\n")), 0o644}
		s.finish(t, a)
		// The patch shows exactly what replaces the user's file.
		if p := string(s.patch(t)); !strings.Contains(p, "-user\n") {
			t.Errorf("the patch hides the removal of the user's line:\n%s", p)
		}
		writeFile(t, filepath.Join(s.ws, "f.txt"), "one\ntwo\nthree\nuser\nlater\n", 0o644)
		_, asked := applyAll(t, s)
		if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "one\ntwo\nthree\nuser\nlater\n"; got != want || len(asked) != 1 {
			t.Errorf("f.txt: got %q, want %q kept with a conflict (asked %v)", got, want, asked)
		}
	})
	t.Run("a base mode does not make a file executable unflagged", func(t *testing.T) {
		s := gitSession(t, tree{"run.sh": "file:echo hi\n"})
		a := s.agentTree(t)
		writeFile(t, filepath.Join(a, "run.sh"), "echo pwned\n", 0o755)
		s.bases["run.sh"] = baseRec{sha256hex([]byte("echo hi\n")), 0o755} // it was not executable
		s.finish(t, a)
		rep, _ := applyAll(t, s)
		fi, err := os.Stat(filepath.Join(s.ws, "run.sh"))
		if err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(s.ws, "run.sh")); got != "echo pwned\n" {
			t.Fatalf("run.sh: %q; the test needs the agent's content applied", got)
		}
		for _, f := range rep.Plan.Files {
			if f.Path == "run.sh" && fi.Mode()&0o111 != 0 && f.Attention == AttentionNone {
				t.Errorf("run.sh became executable without a flag (mode %v, %s)", fi.Mode(), f.Why)
			}
		}
	})
	t.Run("refused where it does not belong", func(t *testing.T) {
		sha := sha256hex(nil)
		for name, js := range map[string]string{
			"on an add":    `{"version":1,"changes":[{"path":"f","op":"add","type":"file","mode":420,"size":0,"sha256":"` + sha + `","base_sha256":"` + sha + `"}]}`,
			"on a symlink": `{"version":1,"changes":[{"path":"f","op":"modify","type":"symlink","mode":511,"old_mode":511,"target":"x","base_sha256":"` + sha + `"}]}`,
			"bad hash":     `{"version":1,"changes":[{"path":"f","op":"modify","type":"file","mode":420,"old_mode":420,"size":0,"sha256":"` + sha + `","base_sha256":"ABC"}]}`,
			"mode only":    `{"version":1,"changes":[{"path":"f","op":"modify","type":"file","mode":420,"old_mode":420,"size":0,"sha256":"` + sha + `","base_mode":420}]}`,
			"big mode":     `{"version":1,"changes":[{"path":"f","op":"modify","type":"file","mode":420,"old_mode":420,"size":0,"sha256":"` + sha + `","base_sha256":"` + sha + `","base_mode":70000}]}`,
		} {
			if _, err := ParseChangeSet([]byte(js)); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}
		ok := `{"version":1,"changes":[{"path":"f","op":"modify","type":"file","mode":420,"old_mode":420,"size":0,"sha256":"` + sha + `","base_sha256":"` + sha + `","base_mode":420}]}`
		if _, err := ParseChangeSet([]byte(ok)); err != nil {
			t.Errorf("a valid base refused: %v", err)
		}
	})
}

// TestScanCarriesBases: the scan puts the recorded base on a modify, and a
// file equal to its base is no change although the lower moved on (the user
// edited the workspace after the copy-up).
func TestScanCarriesBases(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	lower, upper := filepath.Join(root, "lower"), filepath.Join(root, "upper")
	writeTree(t, lower, tree{"edited": "file:user 2\n", "unchanged": "file:user 2\n", "chmod": "file:same\n"})
	writeTree(t, upper, tree{"edited": "file:agent\n", "unchanged": "file:user 1\n", "chmod": "file:same\n"})
	os.Chmod(filepath.Join(upper, "chmod"), 0o755)
	bases := map[string]Base{
		"edited":    {sha256hex([]byte("user 1\n")), 0o644},
		"unchanged": {sha256hex([]byte("user 1\n")), 0o644},
		"chmod":     {sha256hex([]byte("same\n")), 0o644},
	}
	cs, err := scanWith(allOpaque{}, lower, upper, bases)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Change{}
	for _, c := range cs.Changes {
		got[c.Path] = c
	}
	if c := got["edited"]; c.Op != OpModify || c.BaseSHA256 != bases["edited"].SHA256 || c.BaseMode != 0o644 {
		t.Errorf("edited: %+v, want a modify with its base", c)
	}
	if c, ok := got["unchanged"]; ok {
		t.Errorf("unchanged: %+v, want no change", c)
	}
	if c := got["chmod"]; c.Op != OpModify || c.Mode != 0o755 || c.BaseMode != 0o644 {
		t.Errorf("chmod: %+v, want a mode change against its base", c)
	}
}
