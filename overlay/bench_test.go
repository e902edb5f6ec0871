//go:build unix

package overlay

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// benchTrees makes n text files of about 20 KB in ws and a copy in agent
// where every file has a few lines changed, and a session baseline.
func benchTrees(b *testing.B, n int) testSession {
	root := b.TempDir()
	s := testSession{ws: filepath.Join(root, "ws"), dir: filepath.Join(root, "session")}
	agent := filepath.Join(root, "agent")
	for _, d := range []string{s.ws, s.dir, agent} {
		os.Mkdir(d, 0o755)
	}
	for i := 0; i < n; i++ {
		var old, new strings.Builder
		for l := 0; l < 400; l++ { // 400 lines of ~50 bytes = ~20 KB
			line := fmt.Sprintf("file %d line %d: the quick brown fox jumps over\n", i, l)
			old.WriteString(line)
			if l%97 == 13 {
				line = fmt.Sprintf("file %d line %d: CHANGED by the agent\n", i, l)
			}
			new.WriteString(line)
		}
		rel := filepath.Join(fmt.Sprintf("pkg%02d", i/50), fmt.Sprintf("file%04d.go", i))
		writeFile(b, filepath.Join(s.ws, rel), old.String(), 0o644)
		writeFile(b, filepath.Join(agent, rel), new.String(), 0o644)
	}
	if _, err := TakeBaseline(b.Context(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkPatch1000 builds the patch for 1,000 changed ~20 KB text files
// (reading the change set's content from a local directory) and, once,
// times `git diff --no-index --binary` on the same two trees for the ratio.
func BenchmarkPatch1000(b *testing.B) {
	s := benchTrees(b, 1000)
	agent := filepath.Join(filepath.Dir(s.ws), "agent")
	cs, err := DiffTrees(s.ws, agent)
	if err != nil {
		b.Fatal(err)
	}
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		b.Fatal(err)
	}
	var size int
	var ours time.Duration
	runs := 0
	for b.Loop() {
		start := time.Now()
		var buf bytes.Buffer
		info, err := BuildPatch(b.Context(), cs, DirSource(agent), bl, &buf, BuildOptions{ObjectDir: filepath.Join(b.TempDir(), "objects")})
		if err != nil {
			b.Fatal(err)
		}
		ours += time.Since(start)
		runs++
		if len(info.Files) != 1000 {
			b.Fatalf("%d files in the patch", len(info.Files))
		}
		size = buf.Len()
	}
	b.ReportMetric(float64(size), "patch-bytes")
	if _, err := exec.LookPath("git"); err == nil {
		start := time.Now()
		cmd := exec.Command("git", "diff", "--no-index", "--binary", "ws", "agent")
		cmd.Dir = filepath.Dir(s.ws)
		cmd.Stdout = io.Discard
		cmd.Run() // exit status 1: there are differences
		git := time.Since(start)
		perRun := ours / time.Duration(runs)
		b.ReportMetric(git.Seconds()*1000, "git-diff-ms")
		b.ReportMetric(perRun.Seconds()/git.Seconds(), "ratio-vs-git")
		b.Logf("vibedom patch %v per run, git diff --no-index --binary %v, ratio %.2f", perRun, git, perRun.Seconds()/git.Seconds())
	}
}

// BenchmarkApply1000 applies the patch of 1,000 changed ~20 KB text files
// (plan, backups, journal, atomic writes), then undoes it outside the timer.
func BenchmarkApply1000(b *testing.B) {
	s := benchTrees(b, 1000)
	agent := filepath.Join(filepath.Dir(s.ws), "agent")
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		b.Fatal(err)
	}
	cs, err := DiffTrees(s.ws, agent)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := writeSessionPatch(b.Context(), s.dir, cs, DirSource(agent), bl, nil); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rep, err := Apply(b.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
		if err != nil {
			b.Fatal(err)
		}
		if len(rep.Applied) != 1000 {
			b.Fatalf("applied %d", len(rep.Applied))
		}
		b.StopTimer()
		if _, err := Undo(b.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
