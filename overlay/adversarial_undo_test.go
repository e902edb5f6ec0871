//go:build unix

package overlay

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUndoForceTouchesOnlyTheNamedApply is the red team's sequence: two
// applies (a selection, then the rest), the user edits a file of each, an
// undo keeps the edited file of the latest apply, and the advice it prints
// (--force) must not undo the apply before over the user's later edit.
// Every overwrite of the undo is backed up and can be put back.
func TestUndoForceTouchesOnlyTheNamedApply(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"f1.txt": "one\n", "f2.txt": "two\n"}.files())
	ag := s.agentTree(t)
	writeFile(t, filepath.Join(ag, "f1.txt"), "agent one\n", 0o644)
	writeFile(t, filepath.Join(ag, "f2.txt"), "agent two\n", 0o644)
	s.finish(t, ag)
	opts := ApplyOptions{Workspace: s.ws, SessionDir: s.dir}
	opts.Files = []string{"f1.txt"}
	a1, err := Apply(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Files = nil
	a2, err := Apply(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if a1.BackupID == "" || a2.BackupID == "" || a1.BackupID == a2.BackupID {
		t.Fatalf("backups: %q, %q", a1.BackupID, a2.BackupID)
	}
	writeFile(t, filepath.Join(s.ws, "f1.txt"), "user's later edit of one\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "f2.txt"), "user's later edit of two\n", 0o644)
	read := func(p string) string { return readFile(t, filepath.Join(s.ws, p)) }

	rep, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.BackupID != a2.BackupID || len(rep.Kept) != 1 || rep.Kept[0].Path != "f2.txt" {
		t.Fatalf("undo: backup %s, kept %v; want %s keeping f2.txt", rep.BackupID, rep.Kept, a2.BackupID)
	}
	if !strings.Contains(rep.Kept[0].Err.Error(), "--backup "+a2.BackupID) {
		t.Errorf("advice does not name the apply: %v", rep.Kept[0].Err)
	}
	// The advice as the red team read it: undo --force.
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{Force: true}); !errors.Is(err, ErrForceNeedsBackup) {
		t.Errorf("undo --force without naming the apply: got %v, want ErrForceNeedsBackup", err)
	}
	// Undo again without force: still the same apply, still kept.
	if rep, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil || rep.BackupID != a2.BackupID {
		t.Errorf("second undo: %v, %+v; want %s again (it kept a path)", err, rep, a2.BackupID)
	}
	if got := read("f1.txt"); got != "user's later edit of one\n" {
		t.Fatalf("f1.txt: got %q; the earlier apply was undone over the user's edit", got)
	}
	// The advice as printed: --force --backup <the latest apply>.
	rep, err = Undo(t.Context(), s.dir, s.ws, UndoOptions{Force: true, BackupID: a2.BackupID})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := read("f2.txt"), "two\n"; got != want {
		t.Errorf("f2.txt after the forced undo: got %q, want %q", got, want)
	}
	if got := read("f1.txt"); got != "user's later edit of one\n" {
		t.Errorf("f1.txt: got %q; --force touched an apply it was not given", got)
	}
	if rep.UndoBackupID == "" {
		t.Fatal("the forced undo overwrote an edit without backing it up")
	}
	// What the forced undo overwrote comes back by name.
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{BackupID: rep.UndoBackupID}); err != nil {
		t.Fatal(err)
	}
	if got, want := read("f2.txt"), "user's later edit of two\n"; got != want {
		t.Errorf("f2.txt after undoing the undo: got %q, want %q", got, want)
	}
	// A plain undo now reaches the first apply (an undo's backup is only
	// ever undone by name), and keeps the user's edit there.
	rep, err = Undo(t.Context(), s.dir, s.ws, UndoOptions{})
	if err != nil || rep.BackupID != a1.BackupID || len(rep.Kept) != 1 {
		t.Errorf("undo after: %v, %+v; want %s keeping f1.txt", err, rep, a1.BackupID)
	}
	if got := read("f1.txt"); got != "user's later edit of one\n" {
		t.Errorf("f1.txt: got %q", got)
	}
}

// files turns a plain path -> content map into a tree of files.
func (tr tree) files() tree {
	out := tree{}
	for p, c := range tr {
		out[p] = "file:" + c
	}
	return out
}

// TestUndoBacksUpEveryOverwrite: a forced undo of an apply with a written,
// a created and a deleted path backs up everything it changes, and undoing
// that undo gives back exactly the tree before it.
func TestUndoBacksUpEveryOverwrite(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"m.txt": "file:m\n", "d.txt": "file:d\n", "dir/x.txt": "file:x\n"})
	ag := s.agentTree(t)
	writeFile(t, filepath.Join(ag, "m.txt"), "agent m\n", 0o644)
	writeFile(t, filepath.Join(ag, "new/n.txt"), "agent n\n", 0o644)
	os.Remove(filepath.Join(ag, "d.txt"))
	os.RemoveAll(filepath.Join(ag, "dir"))
	s.finish(t, ag)
	a, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(s.ws, "m.txt"), "user m\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "new/n.txt"), "user n\n", 0o644)
	writeFile(t, filepath.Join(s.ws, "d.txt"), "user recreated d\n", 0o644)
	before := treeListing(t, s.ws)
	rep, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{Force: true, BackupID: a.BackupID})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Kept) != 0 {
		t.Errorf("forced undo kept %v", rep.Kept)
	}
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{BackupID: rep.UndoBackupID}); err != nil {
		t.Fatal(err)
	}
	if got := treeListing(t, s.ws); got != before {
		t.Errorf("undoing the forced undo:\n got %s\nwant %s", got, before)
	}
}

// TestKilledApplyLeavesNoTemporaries kills (SIGKILL) a process in the
// middle of an apply, with its temporary files staged, then applies again:
// nothing named .vibedom-tmp-* is left in the workspace, and the result is
// the whole patch. Undo twice then returns to the start, clean too.
func TestKilledApplyLeavesNoTemporaries(t *testing.T) {
	t.Parallel()
	if os.Getenv("VIBEDOM_TEST_KILLED_APPLY") != "" {
		t.Skip("helper process")
	}
	s := newTestSession(t, tree{"a.txt": "file:a\n", "sub/b.txt": "file:b\n"})
	ag := s.agentTree(t)
	for i := range 20 {
		writeFile(t, filepath.Join(ag, "sub", "n"+itoa(i)+".txt"), "new "+itoa(i)+"\n", 0o644)
	}
	writeFile(t, filepath.Join(ag, "a.txt"), "agent a\n", 0o644)
	writeFile(t, filepath.Join(ag, "deep/new/c.txt"), "agent c\n", 0o644)
	s.finish(t, ag)
	start := treeListing(t, s.ws)
	killApply(t, s, false)
	temps := func() []string {
		var found []string
		filepath.Walk(s.ws, func(p string, fi os.FileInfo, err error) error {
			if err == nil && strings.HasPrefix(fi.Name(), tempPrefix) {
				found = append(found, p)
			}
			return nil
		})
		return found
	}
	if len(temps()) == 0 {
		t.Fatal("the killed apply left no temporary file: the test did not kill it mid-apply")
	}
	if _, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir}); err != nil {
		t.Fatalf("apply again: %v", err)
	}
	if left := temps(); len(left) > 0 {
		t.Errorf("temporary files left after apply again: %v", left)
	}
	if got, want := treeListing(t, s.ws), treeListing(t, ag); got != want {
		t.Errorf("after apply again:\n got %s\nwant %s", got, want)
	}
	for range 2 {
		if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := treeListing(t, s.ws); got != start {
		t.Errorf("after two undos:\n got %s\nwant %s", got, start)
	}
}

// killApply runs an apply of the session's patch in another process and
// kills it (SIGKILL) once it has staged (mid: one file staged, its batch
// not yet made durable).
func killApply(t *testing.T, s testSession, mid bool) {
	t.Helper()
	staged := filepath.Join(t.TempDir(), "staged")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledApplyHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "VIBEDOM_TEST_KILLED_APPLY="+s.ws, "VIBEDOM_TEST_KILLED_SESSION="+s.dir, "VIBEDOM_TEST_KILLED_STAGED="+staged)
	if mid {
		cmd.Env = append(cmd.Env, "VIBEDOM_TEST_KILLED_MID=1")
	}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
wait:
	for {
		select {
		case err := <-done:
			t.Fatalf("helper ended before staging: %v\n%s", err, out)
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("helper did not stage within 2 minutes\n%s", out)
		case <-time.After(20 * time.Millisecond):
			if _, err := os.Stat(staged); err == nil {
				break wait
			}
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-done
}

// TestKilledApplyThenUndoLeavesNoFolder (issue 18 item 7): an apply killed
// after it made a new directory for a file, before its journal reached the
// disk, then undone: the workspace is as before, with no empty directory
// left behind.
func TestKilledApplyThenUndoLeavesNoFolder(t *testing.T) {
	t.Parallel()
	if os.Getenv("VIBEDOM_TEST_KILLED_APPLY") != "" {
		t.Skip("helper process")
	}
	s := newTestSession(t, tree{"a.txt": "file:a\n"})
	ag := s.agentTree(t)
	writeFile(t, filepath.Join(ag, "deep/new/c.txt"), "agent c\n", 0o644)
	writeFile(t, filepath.Join(ag, "deep/other/d.txt"), "agent d\n", 0o644)
	s.finish(t, ag)
	start := treeListing(t, s.ws)
	killApply(t, s, true)
	if _, err := os.Stat(filepath.Join(s.ws, "deep")); err != nil {
		t.Fatalf("the killed apply made no directory: the test did not kill it mid-apply (%v)", err)
	}
	if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := treeListing(t, s.ws); got != start {
		t.Errorf("after undo:\n got %s\nwant %s", got, start)
	}
}

// TestKilledApplyHelper is the process TestKilledApplyLeavesNoTemporaries
// kills: it applies, and stops for good once the first batch is staged.
func TestKilledApplyHelper(t *testing.T) {
	ws, dir, staged := os.Getenv("VIBEDOM_TEST_KILLED_APPLY"), os.Getenv("VIBEDOM_TEST_KILLED_SESSION"), os.Getenv("VIBEDOM_TEST_KILLED_STAGED")
	if ws == "" {
		t.Skip("run by TestKilledApplyLeavesNoTemporaries")
	}
	stop := func() {
		if err := os.WriteFile(staged, nil, 0o600); err != nil {
			t.Error(err)
		}
		time.Sleep(time.Hour) // until killed
	}
	if os.Getenv("VIBEDOM_TEST_KILLED_MID") != "" {
		testHookStaged = stop // one file staged, the batch not yet synced
	} else {
		testHookAfterStage = stop
	}
	Apply(t.Context(), ApplyOptions{Workspace: ws, SessionDir: dir})
	t.Error("apply returned")
}
