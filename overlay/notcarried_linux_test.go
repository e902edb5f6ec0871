package overlay

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// notCarried returns the not-carried reasons of a patch by path.
func notCarried(info *PatchInfo) map[string]string {
	m := map[string]string{}
	for _, n := range info.NotCarried {
		m[n.Path] += n.Reason + ";"
	}
	return m
}

// TestBuildPatchSpecialBitsNotCarried: setuid, setgid and sticky bits the
// patch cannot carry are each reported, not dropped in silence.
func TestBuildPatchSpecialBitsNotCarried(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"run.sh": "file:#!/bin/sh\n", "keep": "file:k\n"})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "run.sh"), "#!/bin/sh\necho root\n", 0o755)
	writeFile(t, filepath.Join(a, "sg"), "setgid\n", 0o755)
	writeFile(t, filepath.Join(a, "tmp/f"), "f\n", 0o644)
	for p, m := range map[string]os.FileMode{"run.sh": 0o755 | os.ModeSetuid, "sg": 0o755 | os.ModeSetgid, "tmp": 0o777 | os.ModeSticky} {
		if err := os.Chmod(filepath.Join(a, p), m); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := DiffTrees(s.ws, a)
	if err != nil {
		t.Fatal(err)
	}
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		t.Fatal(err)
	}
	info, err := BuildPatch(t.Context(), cs, DirSource(a), bl, io.Discard, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := notCarried(info)
	for p, want := range map[string]string{"run.sh": "setuid bit (mode 4755, was 0644)", "sg": "setgid bit (mode 2755)", "tmp": "sticky bit (mode 1777)"} {
		if !strings.Contains(got[p], want) {
			t.Errorf("%s: not carried %q, want it to say %q", p, got[p], want)
		}
	}
	if _, ok := got["keep"]; ok {
		t.Errorf("an unchanged file is reported: %v", got)
	}
}

// TestScanChangesLongPath: a path longer than the change set allows, or
// one the guest cannot even open, is reported as not carried; the rest of
// the tree is collected.
func TestScanChangesLongPath(t *testing.T) {
	t.Parallel()
	old, agent := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(agent, "ok.txt"), "fine\n", 0o644)
	// 25 levels of 180-byte names: past PATH_MAX for the scan's full paths
	// and past MaxPathLen for the change set.
	sh(t, agent, `d=$(printf 'd%.0s' $(seq 180)); i=0; while [ $i -lt 25 ]; do mkdir $d; cd -P $d; echo x > f; i=$((i+1)); done`)
	cs, err := DiffTrees(old, agent)
	if err != nil {
		t.Fatalf("the whole scan failed: %v", err)
	}
	data, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseChangeSet(data); err != nil {
		t.Fatalf("the host refuses the scan: %v", err)
	}
	var ok, skipped bool
	for _, c := range cs.Changes {
		switch {
		case c.Path == "ok.txt" && c.Op == OpAdd:
			ok = true
		case c.Op == OpSkip && (strings.Contains(c.Reason, "longer than 4096 bytes") || strings.Contains(c.Reason, "file name too long")):
			skipped = true
		case c.Op != OpSkip && len(c.Path) > MaxPathLen:
			t.Errorf("a path of %d bytes is carried", len(c.Path))
		}
	}
	if !ok || !skipped {
		t.Errorf("ok.txt added: %v; deep path reported as not carried: %v\n%v", ok, skipped, summary(cs))
	}
}

// TestScanChangesXattrs: extended attributes set in the guest are reported
// as not carried; the overlay's own and those copied up unchanged are not.
func TestScanChangesXattrs(t *testing.T) {
	t.Parallel()
	lower, upper := overlayMount(t, tree{"old.txt": "file:old\n", "same.txt": "file:same\n"}, func(t *testing.T, merged string) {
		sh(t, merged, `echo new > new.txt; echo more >> old.txt; echo same > same.txt`)
		for _, x := range []struct{ file, name string }{{"new.txt", "user.origin"}, {"old.txt", "user.note"}} {
			if err := unix.Setxattr(filepath.Join(merged, x.file), x.name, []byte("v"), 0); err != nil {
				t.Skipf("no user xattrs here: %v", err)
			}
		}
	})
	cs, err := ScanChanges(lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range cs.Changes {
		if c.Op == OpSkip {
			got[c.Path] = c.Reason
		}
	}
	want := map[string]string{"new.txt": "extended attributes are not carried: user.origin", "old.txt": "extended attributes are not carried: user.note"}
	if len(got) != len(want) || got["new.txt"] != want["new.txt"] || got["old.txt"] != want["old.txt"] {
		t.Errorf("skip entries %q, want %q", got, want)
	}
}
