//go:build unix

package overlay

import (
	"strings"
	"testing"
)

// TestSymlinkResolutionBounded: symlinks whose targets are long chains of
// other symlinks (each hop expanding to ~1,600 path steps, 40 hops a link)
// made the final-tree check cost ~20 ms a link: the 600,000 links a 64 MiB
// change set can hold would have hung the host for hours. Resolution has a
// step budget per link and per plan; a link past it is protected (never
// applied on a guess), and the plan comes back however many such links the
// patch holds. Work is counted in resolution steps, not time.
func TestSymlinkResolutionBounded(t *testing.T) {
	s, _ := adversarialSession(t)
	var p strings.Builder
	p.WriteString(symlinkEntry("b", strings.Repeat("x/", 800)+strings.Repeat("../", 798)+".."))
	p.WriteString(symlinkEntry("a", strings.Repeat("b/", 1000)+"b"))
	const n = 3000
	for i := range n {
		p.WriteString(symlinkEntry("c/l"+itoa(i), "../a"))
	}
	// A harmless link judged after the budget ran out is still refused, not
	// applied unjudged.
	p.WriteString(symlinkEntry("z/ok", "../README.md"))
	units := 0
	resolveStepHook = func(n int) { units += n }
	defer func() { resolveStepHook = nil }()
	pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Patch: []byte(p.String())})
	if err != nil {
		t.Fatal(err)
	}
	// Two trees (with and without the patch), each within its budget plus
	// one resolution's overshoot.
	if limit := 2 * (maxResolveBudget + 2*maxResolveSteps); units > limit {
		t.Errorf("the final-tree check did %d units of resolution work, want at most %d", units, limit)
	}
	for _, pf := range pl.Files {
		if pf.Path == "b" {
			continue // resolves to x: harmless
		}
		if pf.Status == StatusApply {
			t.Errorf("%s: applied (%s), want it refused as too complex to judge", pf.Path, pf.Why)
		}
	}
}
