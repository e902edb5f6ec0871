//go:build unix

package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func numbered(n int, edits map[int]string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if e, ok := edits[i]; ok {
			b.WriteString(e + "\n")
			continue
		}
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// gitSession is a test session whose workspace is a git repository with
// everything committed before the baseline, so old contents are known.
func gitSession(t *testing.T, base tree) testSession {
	t.Helper()
	have(t, "git")
	root := t.TempDir()
	s := testSession{ws: filepath.Join(root, "ws"), dir: filepath.Join(root, "session"), bases: map[string]baseRec{}}
	os.Mkdir(s.ws, 0o755)
	os.Mkdir(s.dir, 0o755)
	writeTree(t, s.ws, base)
	mustRun(t, s.ws, "git", "init", "-q")
	mustRun(t, s.ws, "git", "add", "-A")
	mustRun(t, s.ws, "git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
	if _, err := TakeBaseline(t.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConflicts(t *testing.T) {
	t.Parallel()
	base := tree{
		"both.txt":     "file:" + numbered(20, nil),
		"deluser.txt":  "file:" + numbered(5, nil),
		"delagent.txt": "file:" + numbered(5, nil),
		"other.txt":    "file:unrelated\n",
	}
	type tcase struct {
		name    string
		git     bool
		agent   func(t *testing.T, a string)
		user    func(t *testing.T, ws string)
		resolve Resolution
		path    string
		status  Status
		kind    ConflictKind
		want    *string // content of path after apply; nil: absent
	}
	str := func(s string) *string { return &s }
	agentEdit := func(t *testing.T, a string) {
		writeFile(t, filepath.Join(a, "both.txt"), numbered(20, map[int]string{2: "agent 2"}), 0o644)
	}
	tests := []tcase{
		{name: "clean merge", git: true, agent: agentEdit,
			user: func(t *testing.T, ws string) {
				writeFile(t, filepath.Join(ws, "both.txt"), numbered(20, map[int]string{18: "user 18"}), 0o644)
			},
			path: "both.txt", status: StatusMerged, want: str(numbered(20, map[int]string{2: "agent 2", 18: "user 18"}))},
		{name: "same change on both sides", git: true, agent: agentEdit,
			user: func(t *testing.T, ws string) {
				writeFile(t, filepath.Join(ws, "both.txt"), numbered(20, map[int]string{2: "agent 2"}), 0o644)
			},
			path: "both.txt", status: StatusAlready, want: str(numbered(20, map[int]string{2: "agent 2"}))},
	}
	userSame := func(t *testing.T, ws string) {
		writeFile(t, filepath.Join(ws, "both.txt"), numbered(20, map[int]string{2: "user 2"}), 0o644)
	}
	for _, r := range []struct {
		res  Resolution
		want *string
	}{
		{KeepMine, str(numbered(20, map[int]string{2: "user 2"}))},
		{TakeAgent, str(numbered(20, map[int]string{2: "agent 2"}))},
		{WriteMarks, str("line 1\n" + markerMine + "\nuser 2\n" + markerBase + "\nline 2\n" + markerSep + "\nagent 2\n" + markerTheirs + "\n" + strings.TrimPrefix(numbered(20, nil), "line 1\nline 2\n"))},
	} {
		tests = append(tests, tcase{name: "real conflict, " + r.res.String(), git: true, agent: agentEdit, user: userSame,
			resolve: r.res, path: "both.txt", status: StatusConflict, kind: BothModified, want: r.want})
	}
	for _, r := range []struct {
		res  Resolution
		want *string
	}{{KeepMine, nil}, {TakeAgent, str(numbered(5, map[int]string{3: "agent 3"}))}} {
		tests = append(tests, tcase{name: "you deleted, agent edited, " + r.res.String(), git: true,
			agent: func(t *testing.T, a string) {
				writeFile(t, filepath.Join(a, "deluser.txt"), numbered(5, map[int]string{3: "agent 3"}), 0o644)
			},
			user:    func(t *testing.T, ws string) { os.Remove(filepath.Join(ws, "deluser.txt")) },
			resolve: r.res, path: "deluser.txt", status: StatusConflict, kind: DeletedByYou, want: r.want})
	}
	for _, r := range []struct {
		res  Resolution
		want *string
	}{{KeepMine, str(numbered(5, map[int]string{1: "user 1"}))}, {TakeAgent, nil}} {
		tests = append(tests, tcase{name: "agent deleted, you edited, " + r.res.String(), git: true,
			agent: func(t *testing.T, a string) { os.Remove(filepath.Join(a, "delagent.txt")) },
			user: func(t *testing.T, ws string) {
				writeFile(t, filepath.Join(ws, "delagent.txt"), numbered(5, map[int]string{1: "user 1"}), 0o644)
			},
			resolve: r.res, path: "delagent.txt", status: StatusConflict, kind: DeletedByAgent, want: r.want})
	}
	tests = append(tests,
		tcase{name: "untracked file without a baseline copy", git: false, agent: agentEdit,
			user: func(t *testing.T, ws string) {
				writeFile(t, filepath.Join(ws, "both.txt"), numbered(20, map[int]string{18: "user 18"}), 0o644)
			},
			resolve: KeepMine, path: "both.txt", status: StatusConflict, kind: BaseUnknown, want: str(numbered(20, map[int]string{18: "user 18"}))},
		tcase{name: "both added", git: true,
			agent:   func(t *testing.T, a string) { writeFile(t, filepath.Join(a, "new.txt"), "a\nagent\nz\n", 0o644) },
			user:    func(t *testing.T, ws string) { writeFile(t, filepath.Join(ws, "new.txt"), "a\nuser\nz\n", 0o644) },
			resolve: WriteMarks, path: "new.txt", status: StatusConflict, kind: BothAdded,
			want: str("a\n" + markerMine + "\nuser\n" + markerSep + "\nagent\n" + markerTheirs + "\nz\n")},
	)
	for _, tc := range tests {
		for _, when := range []string{"during the session", "after the session"} {
			t.Run(tc.name+" "+when, func(t *testing.T) {
				var s testSession
				if tc.git {
					s = gitSession(t, base)
				} else {
					s = newTestSession(t, base)
				}
				a := s.agentTree(t)
				tc.agent(t, a)
				if when == "during the session" {
					tc.user(t, s.ws)
					s.finish(t, a)
				} else {
					s.finish(t, a)
					tc.user(t, s.ws)
				}
				if tc.kind == BaseUnknown && when == "after the session" {
					t.Skip("after the session the baseline copy was taken while the file was unchanged")
				}
				if bl, _ := OpenBaseline(filepath.Join(s.dir, BaselineDir)); tc.kind == BaseUnknown && bl.Mode() == BaselineClone {
					// A clone keeps the old content: the merge is clean.
					tc.status, tc.kind = StatusMerged, ""
					tc.want = str(numbered(20, map[int]string{2: "agent 2", 18: "user 18"}))
				}
				before := treeHash(t, s.ws)
				var asked []*Conflict
				rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Resolve: func(c *Conflict) Resolution {
					asked = append(asked, c)
					return tc.resolve
				}})
				if err != nil {
					t.Fatalf("apply: %v", err)
				}
				var pf *PlannedFile
				for _, f := range rep.Plan.Files {
					if f.Path == tc.path {
						pf = f
					}
				}
				if pf == nil && tc.status == StatusAlready {
					// The agent's copy equals the host's: nothing to carry.
					pf = &PlannedFile{Status: StatusAlready}
				}
				if pf == nil {
					t.Fatalf("%s not in the plan", tc.path)
				}
				if pf.Status != tc.status {
					t.Errorf("status: got %s, want %s (%s)", pf.Status, tc.status, pf.Why)
				}
				if tc.status == StatusConflict {
					if len(asked) != 1 || asked[0].Kind != tc.kind {
						t.Fatalf("asked %+v, want one %q conflict", asked, tc.kind)
					}
					if !slices.Contains(asked[0].Options, tc.resolve) {
						t.Errorf("options %v lack %v", asked[0].Options, tc.resolve)
					}
				}
				data, err := os.ReadFile(filepath.Join(s.ws, tc.path))
				switch {
				case tc.want == nil && err == nil:
					t.Errorf("%s: exists, want it absent", tc.path)
				case tc.want != nil && err != nil:
					t.Errorf("%s: %v", tc.path, err)
				case tc.want != nil && string(data) != *tc.want:
					t.Errorf("%s:\n got %q\nwant %q", tc.path, data, *tc.want)
				}
				if rep.BackupID != "" {
					if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
						t.Fatalf("undo: %v", err)
					}
				}
				if got := treeHash(t, s.ws); got != before {
					t.Errorf("undo: tree differs from before the apply:\n%s", treeListing(t, s.ws))
				}
			})
		}
	}
}

// TestNoResolverKeepsYours: without a resolver, conflicts keep the host's
// version and are reported, never dropped silently.
func TestNoResolverKeepsYours(t *testing.T) {
	t.Parallel()
	s := gitSession(t, tree{"f.txt": "file:" + numbered(5, nil)})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "f.txt"), numbered(5, map[int]string{3: "agent"}), 0o644)
	s.finish(t, a)
	writeFile(t, filepath.Join(s.ws, "f.txt"), numbered(5, map[int]string{3: "mine"}), 0o644)
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Results["f.txt"], "conflict: kept yours"; got != want {
		t.Errorf("result: got %q, want %q", got, want)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), numbered(5, map[int]string{3: "mine"}); got != want {
		t.Errorf("content: got %q, want %q", got, want)
	}
}

// TestUndoKeepsLaterEdits: undo does not clobber a file the user changed
// after the apply, unless forced.
func TestUndoKeepsLaterEdits(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"f.txt": "file:one\n", "g.txt": "file:g\n"})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "f.txt"), "agent\n", 0o644)
	writeFile(t, filepath.Join(a, "g.txt"), "agent g\n", 0o644)
	s.finish(t, a)
	if _, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(s.ws, "f.txt"), "edited after apply\n", 0o644)
	rep, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Kept) != 1 || rep.Kept[0].Path != "f.txt" {
		t.Errorf("kept: got %v, want f.txt", rep.Kept)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "f.txt")), "edited after apply\n"; got != want {
		t.Errorf("f.txt: got %q, want %q", got, want)
	}
	if got, want := readFile(t, filepath.Join(s.ws, "g.txt")), "g\n"; got != want {
		t.Errorf("g.txt: got %q, want %q", got, want)
	}
}
