package wstrust

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/home"
)

// lines is a Parse for tests: "+x" widens, "-x" narrows, "!" is an error.
func lines(data []byte, source string) (widening, narrowing []string, err error) {
	for _, l := range strings.Fields(string(data)) {
		switch {
		case l == "!":
			return nil, nil, os.ErrInvalid
		case strings.HasPrefix(l, "+"):
			widening = append(widening, l[1:])
		default:
			narrowing = append(narrowing, l[1:])
		}
	}
	return widening, narrowing, nil
}

var parsers = map[string]Parse{PolicyRel: lines, DLPAllowlistRel: lines}

// TestApprovalFollowsContent: a widening file applies once approved and
// until its content changes; a narrowing-only file needs nothing; a
// symlink or an unparsable file is refused.
func TestApprovalFollowsContent(t *testing.T) {
	h := home.Home(t.TempDir())
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, ".vibedom"), 0o755)
	write := func(rel, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, rel), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	state := func(rel string) State {
		t.Helper()
		tr, err := Load(h, ws, parsers)
		if err != nil {
			t.Fatal(err)
		}
		return tr.File(rel).State
	}
	if got := state(PolicyRel); got != None {
		t.Errorf("absent: %s", got)
	}
	write(PolicyRel, "-evil.example\n")
	if got := state(PolicyRel); got != None {
		t.Errorf("narrowing only: %s", got)
	}
	write(PolicyRel, "+example.com\n")
	if got := state(PolicyRel); got != Unapproved {
		t.Errorf("new widening file: %s", got)
	}
	tr, _ := Load(h, ws, parsers)
	if err := Approve(h, tr); err != nil {
		t.Fatal(err)
	}
	if got := state(PolicyRel); got != Approved {
		t.Errorf("approved: %s", got)
	}
	if fi, err := os.Stat(h.WorkspaceApprovals()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("approvals store: %v %v", err, fi)
	}
	write(PolicyRel, "+example.com\n+more.example\n")
	if got := state(PolicyRel); got != Changed {
		t.Errorf("changed after approval: %s", got)
	}

	write(DLPAllowlistRel, "!\n")
	if _, err := Load(h, ws, parsers); err == nil {
		t.Error("an unparsable file was accepted")
	}
	os.Remove(filepath.Join(ws, DLPAllowlistRel))
	outside := filepath.Join(t.TempDir(), "x")
	os.WriteFile(outside, []byte("+anything\n"), 0o644)
	os.Symlink(outside, filepath.Join(ws, DLPAllowlistRel))
	if _, err := Load(h, ws, parsers); err == nil || !strings.Contains(err.Error(), DLPAllowlistRel) {
		t.Errorf("a symlinked trust file: %v", err)
	}
	if _, err := Load(h, ws, map[string]Parse{PolicyRel: lines}); err == nil {
		t.Error("a file without a parser was read")
	}
}
