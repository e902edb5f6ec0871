//go:build unix

package overlay

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// randomText makes n lines from a small vocabulary (so diffs have common
// lines), sometimes without a final newline.
func randomText(r *rand.Rand, n int) string {
	words := []string{"alpha", "beta", "gamma", "delta", "", "func x() {", "}", "\treturn nil", "// comment", "x := 1"}
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(words[r.IntN(len(words))])
		if i < n-1 || r.IntN(5) > 0 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

var randomNames = []string{"a", "b", "c.txt", "main.go", "with space", "-dash", "naïve", `q"uote`, "Z"}

// randomTree builds a workspace of text files (some executable), a few
// symlinks inside it, in up to three levels of directories.
func randomTree(r *rand.Rand, binary bool) tree {
	tr := tree{}
	var dirs = []string{""}
	for i := 0; i < 4; i++ {
		d := join(dirs[r.IntN(len(dirs))], fmt.Sprintf("d%d", i))
		dirs = append(dirs, d)
	}
	for i := 0; i < 12; i++ {
		p := join(dirs[r.IntN(len(dirs))], randomNames[r.IntN(len(randomNames))])
		if _, ok := tr[p]; ok || isDirOf(tr, p) {
			continue
		}
		kind := "file:"
		if r.IntN(5) == 0 {
			kind = "exec:"
		}
		content := randomText(r, r.IntN(30))
		if binary && r.IntN(4) == 0 {
			content = "\x00bin" + content
		}
		tr[p] = kind + content
	}
	return tr
}

// isDirOf reports whether p would be a directory of some path in tr, or
// has a file of tr as an ancestor.
func isDirOf(tr tree, p string) bool {
	for q := range tr {
		if strings.HasPrefix(q, p+"/") || strings.HasPrefix(p, q+"/") {
			return true
		}
	}
	return false
}

// mutate applies random agent changes to the tree at dir.
func mutate(t *testing.T, r *rand.Rand, dir string, binary bool) {
	var files []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return nil
	})
	for i := 0; i < 1+r.IntN(6); i++ {
		switch op := r.IntN(7); {
		case op <= 2 && len(files) > 0: // edit lines
			p := filepath.Join(dir, files[r.IntN(len(files))])
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			lines := splitLines(readFile(t, p))
			at := r.IntN(len(lines) + 1)
			ins := splitLines(randomText(r, r.IntN(4)+1))
			cut := min(at+r.IntN(3), len(lines))
			var out []string
			out = append(out, lines[:at]...)
			out = append(out, ins...)
			out = append(out, lines[cut:]...)
			content := strings.Join(out, "")
			if binary && r.IntN(3) == 0 {
				content += "\x00"
			}
			writeFile(t, p, content, fi.Mode().Perm())
		case op == 3 && len(files) > 0: // delete
			p := filepath.Join(dir, files[r.IntN(len(files))])
			os.Remove(p)
			// Git carries no empty directories: drop emptied parents.
			for d := filepath.Dir(p); d != dir; d = filepath.Dir(d) {
				if os.Remove(d) != nil {
					break
				}
			}
		case op == 4: // add
			p := filepath.Join(dir, fmt.Sprintf("new%d", r.IntN(5)), randomNames[r.IntN(len(randomNames))])
			if _, err := os.Lstat(p); err == nil {
				continue
			}
			if fi, err := os.Lstat(filepath.Dir(p)); err == nil && !fi.IsDir() {
				continue
			}
			writeFile(t, p, randomText(r, r.IntN(10)), 0o644)
		case op == 5 && len(files) > 0: // chmod
			p := filepath.Join(dir, files[r.IntN(len(files))])
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
				os.Chmod(p, fi.Mode().Perm()^0o111)
			}
		case op == 6: // symlink
			p := filepath.Join(dir, fmt.Sprintf("link%d", r.IntN(3)))
			if _, err := os.Lstat(p); err == nil {
				os.Remove(p)
			}
			if len(files) > 0 {
				os.Symlink(files[r.IntN(len(files))], p)
			}
		}
	}
}

// TestGeneratedChangeSets: random trees and random agent changes → change
// set → patch → our apply gives the agent's tree; git apply --check and
// (text only) patch -p1 --dry-run accept every patch; undo gives back the
// start. Seeded and bounded.
func TestGeneratedChangeSets(t *testing.T) {
	t.Parallel()
	have(t, "git")
	have(t, "patch")
	const cases = 40
	for i := 0; i < cases; i++ {
		binary := i%4 == 3
		t.Run(fmt.Sprintf("seed%d", i), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(i), 42))
			s := newTestSession(t, randomTree(r, binary))
			a := s.agentTree(t)
			mutate(t, r, a, binary)
			s.finish(t, a)
			patch := s.patch(t)
			pf := filepath.Join(t.TempDir(), "p.patch")
			if err := os.WriteFile(pf, patch, 0o644); err != nil {
				t.Fatal(err)
			}
			if len(patch) > 0 {
				g := filepath.Join(t.TempDir(), "g")
				os.Mkdir(g, 0o755)
				copyTree(t, s.ws, g)
				mustRun(t, g, "git", "apply", "--check", pf)
				if !strings.Contains(string(patch), "GIT binary patch") {
					mustRun(t, g, "patch", "-p1", "--dry-run", "-s", "-i", pf)
				}
			}
			before := treeHash(t, s.ws)
			rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatalf("apply: %v\npatch:\n%s", err, patch)
			}
			if got, want := treeListing(t, s.ws), treeListing(t, a); got != want {
				t.Fatalf("apply result differs from the agent tree:\n got %s\nwant %s\nresults %v\npatch:\n%s", got, want, rep.Results, patch)
			}
			if rep.BackupID != "" {
				if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
					t.Fatalf("undo: %v", err)
				}
			}
			if got := treeHash(t, s.ws); got != before {
				t.Errorf("undo: tree differs from before the apply")
			}
		})
	}
}
