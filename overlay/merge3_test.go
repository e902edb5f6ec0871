package overlay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// mergeCase is one three-way merge input.
type mergeCase struct{ base, mine, theirs string }

// randomMergeCase draws lines from a tiny alphabet, so identical lines,
// overlaps and adjacent edits are frequent, and derives both sides from the
// base by random deletions, insertions and replacements; sometimes the last
// line has no newline.
func randomMergeCase(r *rand.Rand) mergeCase {
	alphabet := []string{"a", "b", "c", "x", "x", "{", "}"}
	line := func() string { return alphabet[r.IntN(len(alphabet))] }
	var base []string
	for range r.IntN(9) {
		base = append(base, line())
	}
	edit := func() []string {
		var out []string
		for i := 0; i <= len(base); i++ {
			if r.IntN(6) == 0 {
				out = append(out, line()) // insert
			}
			if i == len(base) {
				break
			}
			switch r.IntN(6) {
			case 0: // delete
			case 1:
				out = append(out, line()) // replace
			default:
				out = append(out, base[i])
			}
		}
		return out
	}
	text := func(lines []string) string {
		if len(lines) == 0 {
			return ""
		}
		s := strings.Join(lines, "\n")
		if r.IntN(8) != 0 {
			s += "\n"
		}
		return s
	}
	return mergeCase{text(base), text(edit()), text(edit())}
}

// gitReference merges every case with `git merge-file --diff3` from one
// shell, four at a time (one exec from the test instead of one per case).
// It returns, per case, whether git merged it cleanly and its output.
func gitReference(t *testing.T, cases []mergeCase) (clean []bool, result []string) {
	t.Helper()
	dir := t.TempDir()
	var list bytes.Buffer
	for i, c := range cases {
		d := filepath.Join(dir, strconv.Itoa(i))
		os.Mkdir(d, 0o700)
		for name, text := range map[string]string{"mine": c.mine, "base": c.base, "theirs": c.theirs} {
			if err := os.WriteFile(filepath.Join(d, name), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&list, "%d\n", i)
	}
	script := `cd "$1" && git merge-file -p --diff3 -L '` + labelMine + `' -L '` + labelBase + `' -L '` + labelTheirs + `' mine base theirs >out; echo $? >rc`
	cmd := exec.Command("xargs", "-P", "4", "-I", "{}", "sh", "-c", script, "sh", filepath.Join(dir, "{}"))
	cmd.Env = hermeticGitEnv(dir)
	cmd.Stdin = &list
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git merge-file batch: %v: %s", err, out)
	}
	clean, result = make([]bool, len(cases)), make([]string, len(cases))
	for i := range cases {
		d := filepath.Join(dir, strconv.Itoa(i))
		rc, err1 := os.ReadFile(filepath.Join(d, "rc"))
		out, err2 := os.ReadFile(filepath.Join(d, "out"))
		code, err3 := strconv.Atoi(strings.TrimSpace(string(rc)))
		if err1 != nil || err2 != nil || err3 != nil || code < 0 || code >= 128 {
			t.Fatalf("git merge-file case %d: rc %q %v %v %v", i, rc, err1, err2, err3)
		}
		clean[i], result[i] = code == 0, string(out)
	}
	return clean, result
}

// mergeCases is the number of random cases TestMerge3AgreesWithGit runs
// (kept small: each is two git processes, slow on a loaded machine);
// VIBEDOM_MERGE_CASES=50000 for a long run, VIBEDOM_MERGE_SEED to replay.
func mergeCases(t *testing.T) (n int, seed uint64) {
	n, seed = 150, 20261123
	if v, err := strconv.Atoi(os.Getenv("VIBEDOM_MERGE_CASES")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.ParseUint(os.Getenv("VIBEDOM_MERGE_SEED"), 10, 64); err == nil {
		seed = v
	}
	return n, seed
}

// TestMerge3AgreesWithGit: on random inputs full of identical lines and
// overlapping edits, merge3 calls a merge clean exactly when git does, and
// a clean merge is git's result byte for byte. Git's answers come from one
// batched `git merge-tree`, independent of merge3's own call.
func TestMerge3AgreesWithGit(t *testing.T) {
	t.Parallel()
	have(t, "git")
	n, seed := mergeCases(t)
	r := rand.New(rand.NewPCG(seed, seed))
	// Cases the former merge (diff3 over go-diff's line matches) called
	// clean where git has a conflict, then the random ones.
	cases := []mergeCase{
		{"}\nc\n}\nc\n", "}\nc\n}\n", "}\nb\nc\n}\n}\nc\n"},
		{"x\n{\n{\nx\n", "b\nx\n{\nx\n", "x\n{\n{\n"},
		{"x\n{\n{\na\n}\nx\nx\na\n", "x\nc\n{\nx\nx\na\n", "x\n{\n{\nx\nx\n"},
		{"x\nx\nx", "x\nx", "x\nx\nx\n"},
		{"b\nb\na\n", "a\nb\n{\n{\n", "a\nb\nb\na\n"},
		{"a\n{\na\n{\n}\nx\nx\n", "a\n{\na\n{\nb\n}\nx\nx\n", "a\n{\n}\nx\nx\n{\n"},
		{"b\na\na\nb\na\n}\n", "b\na\nb\na\nx\na\n}\n", "b\na\na\nx\na\nx\nx\n"},
		{"x\nx\n}\n", "x\nx\n", "b\nx\n"},
	}
	for range n {
		cases = append(cases, randomMergeCase(r))
	}
	n = len(cases)
	refClean, refResult := gitReference(t, cases)
	type got struct {
		text  string
		clean bool
	}
	results := make([]got, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				text, clean := merge3(cases[i].base, cases[i].mine, cases[i].theirs)
				results[i] = got{text, clean}
			}
		}()
	}
	for i := range cases {
		next <- i
	}
	close(next)
	wg.Wait()
	bad := 0
	for i, c := range cases {
		g := results[i]
		if g.clean != refClean[i] || (g.clean && g.text != refResult[i]) {
			bad++
			if bad <= 5 {
				t.Errorf("case %d (VIBEDOM_MERGE_SEED=%d VIBEDOM_MERGE_CASES=%d): base %q host %q agent %q\n merge3: clean %v %q\n    git: clean %v %q",
					i, seed, n, c.base, c.mine, c.theirs, g.clean, g.text, refClean[i], refResult[i])
			}
		}
		if !g.clean && !strings.Contains(g.text, markerMine+"\n") {
			t.Errorf("case %d: a conflict without markers: %q", i, g.text)
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d merges differ from git's (seed %d)", bad, n, seed)
	}
}

// TestMerge3WithoutGit: without git nothing but a trivial merge is clean,
// and the markers hold each whole version, so no line is dropped or doubled
// on a guess.
func TestMerge3WithoutGit(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	n, seed := mergeCases(t)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range n {
		c := randomMergeCase(r)
		text, clean := merge3(c.base, c.mine, c.theirs)
		trivial := c.mine == c.theirs || c.base == c.theirs || c.base == c.mine
		if clean != trivial {
			t.Fatalf("case %d (seed %d): clean %v for %q %q %q", i, seed, clean, c.base, c.mine, c.theirs)
		}
		if !clean && text != wholeFileMarks(c.base, c.mine, c.theirs) {
			t.Fatalf("case %d: markers %q", i, text)
		}
	}
}

// TestMerge3IgnoresGitConfig: a conflict style, a merge driver or anything
// else in the user's or a repository's git configuration does not change
// (or run during) the merge.
func TestMerge3IgnoresGitConfig(t *testing.T) {
	have(t, "git")
	home := t.TempDir()
	writeFile(t, filepath.Join(home, ".gitconfig"), "[merge]\n\tconflictStyle = zdiff3\n[core]\n\tfsmonitor = touch "+filepath.Join(home, "RAN")+"\n", 0o644)
	t.Setenv("HOME", home)
	t.Setenv("GIT_CONFIG_GLOBAL", filepath.Join(home, ".gitconfig"))
	got, clean := merge3("a\nb\nc\n", "a\nmine\nc\n", "a\ntheirs\nc\n")
	want := "a\n" + markerMine + "\nmine\n" + markerBase + "\nb\n" + markerSep + "\ntheirs\n" + markerTheirs + "\nc\n"
	if clean || got != want {
		t.Errorf("merge3: clean %v %q, want %q", clean, got, want)
	}
	if _, err := os.Stat(filepath.Join(home, "RAN")); err == nil {
		t.Errorf("git ran a command from the user's configuration")
	}
}

// TestMerge3GitStub: a `git` that is not git (the macOS stub without the
// developer tools prints an error and exits 1) is not taken for a merge with
// conflicts and no content.
func TestMerge3GitStub(t *testing.T) {
	bin := t.TempDir()
	writeFile(t, filepath.Join(bin, "git"), "#!/bin/sh\necho 'xcrun: error: invalid active developer path' >&2\nexit 1\n", 0o755)
	t.Setenv("PATH", bin)
	base, mine, theirs := "a\nb\nc\n", "A\nb\nc\n", "a\nb\nC\n"
	got, clean := merge3(base, mine, theirs)
	if clean || got != wholeFileMarks(base, mine, theirs) {
		t.Errorf("merge3 with a stub git: clean %v %q", clean, got)
	}
}
