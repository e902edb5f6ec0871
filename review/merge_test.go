package review

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/overlay"
)

func gitBlobID(s string) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00%s", len(s), s)
	return hex.EncodeToString(h.Sum(nil))
}

func sha256of(s string) string {
	return fmt.Sprintf("%x", sha256.Sum256([]byte(s)))
}

// TestForgedBaseMergeShowsTheResult is issue 18 item 3. The user deletes
// one of three equal rows during the session; the agent, reading the live
// workspace, starts from that version and edits the header. A root guest
// then names the session-start content as the base: the host holds it, so
// the patch is start -> agent and apply merges the user's file against it,
// dropping a second row neither side dropped. That cannot be told from an
// honest base; so the review must show what the merge does to the user's
// file (and the list above the prompt says which files are merged), not
// the agent's patch.
func TestForgedBaseMergeShowsTheResult(t *testing.T) {
	t.Parallel()
	start, user, agent := "header\nx\nx\nx\n", "header\nx\nx\n", "HEADER\nx\nx\n"
	f := newFixtureWith(t, map[string]string{"f.txt": start}, map[string]string{"f.txt": user}, map[string]string{"f.txt": agent},
		func(cs *overlay.ChangeSet) {
			for i := range cs.Changes {
				if cs.Changes[i].Path == "f.txt" {
					cs.Changes[i].BaseSHA256, cs.Changes[i].BaseMode = sha256of(start), 0o644
				}
			}
		})
	pl, err := overlay.MakePlan(t.Context(), f.options())
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.Files) != 1 || pl.Files[0].Status != overlay.StatusMerged {
		t.Fatalf("the forged base did not make a merge here (%s %s)", pl.Files[0].Status, pl.Files[0].Why)
	}
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	sum := tm.expect("[d]iscard? ")
	if !strings.Contains(sum, "Merged with your changes") {
		t.Errorf("the list above the prompt does not say f.txt is merged:\n%s", sum)
	}
	tm.send("r")
	shown := tm.expect("[d]iscard? ")
	tm.send("a")
	r := wait(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	merged := read(t, filepath.Join(f.ws, "f.txt"))
	if want := "index " + gitBlobID(user) + ".." + gitBlobID(merged); !strings.Contains(shown, want) {
		t.Errorf("the review shows not the merged result against the user's file (%q):\n%s", want, shown)
	}
	if !strings.Contains(shown, "merged with your changes") {
		t.Errorf("the review does not say the diff is the merge's result:\n%s", shown)
	}
}

// TestFlaggedConflictSaysWhy (issue 18 item 6): a flagged file that also
// conflicts is listed under both, and the flagged list says why it is
// flagged, not only that it conflicts; the conflict's question says so too.
func TestFlaggedConflictSaysWhy(t *testing.T) {
	t.Parallel()
	f := newFixture(t, map[string]string{"Makefile": "all:\n\techo 1\n"}, map[string]string{"Makefile": "all:\n\techo agent\n"})
	write(t, filepath.Join(f.ws, "Makefile"), "all:\n\techo mine\n")
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	sum := tm.expect("[d]iscard? ")
	flagged := sum[strings.Index(sum, "Flagged"):]
	if !strings.Contains(flagged, "make") {
		t.Errorf("the flagged list does not say why the Makefile is flagged:\n%s", sum)
	}
	if !strings.Contains(sum, "Conflicts") {
		t.Errorf("the conflict is not listed:\n%s", sum)
	}
	tm.send("a")
	q := tm.expect("[v]iew? ")
	if !strings.Contains(q, "flagged") {
		t.Errorf("the conflict's question does not say it is flagged:\n%s", q)
	}
	tm.send("m")
	wait(t, done)
}
