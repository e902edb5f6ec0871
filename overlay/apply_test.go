//go:build unix

package overlay

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPatchRoundTrip(t *testing.T) {
	t.Parallel()
	have(t, "git")
	base := tree{
		"README.md":           "file:# app\n\nhello\n",
		"src/main.go":         "file:package main\n\nfunc main() {\n\tprintln(1)\n}\n",
		"src/util.go":         "file:package main\n",
		"bin/run.sh":          "exec:#!/bin/sh\necho run\n",
		"noeol.txt":           "file:no newline at end",
		"link":                "link:README.md",
		"gone/a.txt":          "file:a\n",
		"gone/b.txt":          "file:b\n",
		"type/f2l":            "file:becomes a link\n",
		"type/l2f":            "link:../README.md",
		"type/d2f/x":          "file:x\n",
		"with space/a b.txt":  "file:space\n",
		`quote"d/\back.txt`:   "file:quoted\n",
		"uni/naïve café.txt":  "file:unicode\n",
		"-rf":                 "file:dash\n",
		"data.bin":            "file:\x00\x01\x02binary\x00",
		"empty":               "file:",
		"modeonly.sh":         "file:#!/bin/sh\n",
		"big.txt":             "file:" + strings.Repeat("line\n", 2000),
		"keep/unchanged.txt":  "file:same\n",
		"keep/touched.txt":    "file:touched only\n",
		"dir2file/inner/z.md": "file:z\n",
	}
	tests := []struct {
		name   string
		change func(t *testing.T, a string)
	}{
		{"edit add delete", func(t *testing.T, a string) {
			writeFile(t, filepath.Join(a, "src/main.go"), "package main\n\nfunc main() {\n\tprintln(2)\n}\n", 0o644)
			writeFile(t, filepath.Join(a, "src/new.go"), "package main\n\n// new\n", 0o644)
			os.RemoveAll(filepath.Join(a, "gone"))
			writeFile(t, filepath.Join(a, "noeol.txt"), "no newline at end\nnow there is one\n", 0o644)
		}},
		{"modes and symlinks", func(t *testing.T, a string) {
			os.Chmod(filepath.Join(a, "modeonly.sh"), 0o755)
			os.Chmod(filepath.Join(a, "bin/run.sh"), 0o644)
			os.Remove(filepath.Join(a, "link"))
			os.Symlink("src/main.go", filepath.Join(a, "link"))
			os.Symlink("../src", filepath.Join(a, "bin/srclink"))
		}},
		{"type changes", func(t *testing.T, a string) {
			os.Remove(filepath.Join(a, "type/f2l"))
			os.Symlink("../README.md", filepath.Join(a, "type/f2l"))
			os.Remove(filepath.Join(a, "type/l2f"))
			writeFile(t, filepath.Join(a, "type/l2f"), "now a file\n", 0o644)
			os.RemoveAll(filepath.Join(a, "type/d2f"))
			writeFile(t, filepath.Join(a, "type/d2f"), "was a dir\n", 0o644)
			os.RemoveAll(filepath.Join(a, "dir2file"))
			writeFile(t, filepath.Join(a, "dir2file"), "file\n", 0o644)
		}},
		{"odd names", func(t *testing.T, a string) {
			writeFile(t, filepath.Join(a, "with space/a b.txt"), "space changed\n", 0o644)
			writeFile(t, filepath.Join(a, `quote"d/\back.txt`), "quoted changed\n", 0o644)
			writeFile(t, filepath.Join(a, "uni/naïve café.txt"), "unicode changed\n", 0o644)
			writeFile(t, filepath.Join(a, "-rf"), "dash changed\n", 0o644)
			writeFile(t, filepath.Join(a, "new dir/ünï cödé \"q\".txt"), "new\n", 0o644)
		}},
		{"binary and empty", func(t *testing.T, a string) {
			writeFile(t, filepath.Join(a, "data.bin"), "\x00\x01\x02binary changed\x00\xff", 0o644)
			writeFile(t, filepath.Join(a, "new.bin"), strings.Repeat("\x00\x10\x20", 1000), 0o644)
			writeFile(t, filepath.Join(a, "empty"), "not empty now\n", 0o644)
			writeFile(t, filepath.Join(a, "newempty"), "", 0o644)
		}},
		{"big file middle edit", func(t *testing.T, a string) {
			lines := strings.Split(strings.Repeat("line\n", 2000), "\n")
			lines[1000] = "changed"
			lines[1500] = "changed too"
			writeFile(t, filepath.Join(a, "big.txt"), strings.Join(lines, "\n"), 0o644)
			os.Chtimes(filepath.Join(a, "keep/touched.txt"), testTime, testTime)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t, base)
			a := s.agentTree(t)
			tc.change(t, a)
			info := s.finish(t, a)
			if len(info.Files) == 0 {
				t.Fatal("empty patch")
			}
			patch := s.patch(t)
			// git apply accepts it on a copy of the workspace and gives the
			// agent's tree.
			g := filepath.Join(t.TempDir(), "g")
			os.Mkdir(g, 0o755)
			copyTree(t, s.ws, g)
			pf := filepath.Join(t.TempDir(), "p.patch")
			os.WriteFile(pf, patch, 0o644)
			mustRun(t, g, "git", "apply", "--check", pf)
			// GNU patch checks each entry against the tree as it is, so a
			// type change (a delete and an add of one path) fails its dry run.
			if !strings.Contains(string(patch), "GIT binary patch") && tc.name != "type changes" {
				gp := filepath.Join(t.TempDir(), "gp")
				os.Mkdir(gp, 0o755)
				copyTree(t, s.ws, gp)
				mustRun(t, gp, "patch", "-p1", "--dry-run", "-i", pf)
				mustRun(t, gp, "patch", "-p1", "-s", "-i", pf)
				if got, want := treeListing(t, gp), treeListing(t, a); got != want {
					t.Errorf("patch -p1 result differs from the agent tree:\n got %s\nwant %s", got, want)
				}
			}
			mustRun(t, g, "git", "apply", pf)
			if got, want := treeListing(t, g), treeListing(t, a); got != want {
				t.Errorf("git apply result differs from the agent tree:\n got %s\nwant %s\npatch:\n%s", got, want, patch)
			}
			// Our apply gives the same, and undo gives back the start.
			before := treeHash(t, s.ws)
			rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatalf("apply: %v", err)
			}
			if len(rep.Failed) > 0 {
				t.Fatalf("failed: %v", rep.Failed)
			}
			if got, want := treeListing(t, s.ws), treeListing(t, a); got != want {
				t.Errorf("apply result differs from the agent tree:\n got %s\nwant %s\nresults %v", got, want, rep.Results)
			}
			if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
				t.Fatalf("undo: %v", err)
			}
			if got := treeHash(t, s.ws); got != before {
				t.Errorf("undo: tree hash %s, want %s", got, before)
			}
			if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); !errors.Is(err, ErrNothingToUndo) {
				t.Errorf("second undo: got %v, want ErrNothingToUndo", err)
			}
		})
	}
}
