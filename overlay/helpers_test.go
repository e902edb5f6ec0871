//go:build unix

package overlay

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// tree describes files for writeTree: path -> spec, where spec is
// "file:CONTENT", "exec:CONTENT", "link:TARGET" or "dir:".
type tree map[string]string

func writeTree(t testing.TB, dir string, tr tree) {
	t.Helper()
	paths := make([]string, 0, len(tr))
	for p := range tr {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		kind, content, _ := strings.Cut(tr[p], ":")
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch kind {
		case "file":
			err = os.WriteFile(full, []byte(content), 0o644)
			if err == nil {
				err = os.Chmod(full, 0o644)
			}
		case "exec":
			err = os.WriteFile(full, []byte(content), 0o755)
			if err == nil {
				err = os.Chmod(full, 0o755)
			}
		case "link":
			err = os.Symlink(content, full)
		case "dir":
			err = os.MkdirAll(full, 0o755)
		default:
			t.Fatalf("bad tree spec %q", tr[p])
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// treeHash lists every entry under dir (type, permission bits of files,
// content hash, symlink target) and hashes the listing. Directory modes are
// not part of it.
func treeHash(t testing.TB, dir string) string {
	t.Helper()
	return fmt.Sprintf("%x", sha256.Sum256([]byte(treeListing(t, dir))))
}

func treeListing(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, "f %s %o %x\n", rel, fi.Mode().Perm(), sha256.Sum256(data))
		case fi.IsDir():
			fmt.Fprintf(&b, "d %s\n", rel)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, "l %s -> %s\n", rel, target)
		default:
			fmt.Fprintf(&b, "s %s %v\n", rel, fi.Mode().Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput()
	if err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
}

// session is a host workspace, its session folder and a baseline.
type testSession struct {
	ws, dir string
	// bases is what a recording guest would report: for each file, the
	// content and mode the agent's copy started from (set by agentTree).
	bases map[string]baseRec
}

type baseRec struct {
	sha  string
	mode uint32
}

func newTestSession(t testing.TB, base tree) testSession {
	t.Helper()
	root := t.TempDir()
	s := testSession{ws: filepath.Join(root, "ws"), dir: filepath.Join(root, "session"), bases: map[string]baseRec{}}
	for _, d := range []string{s.ws, s.dir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeTree(t, s.ws, base)
	if _, err := TakeBaseline(context.Background(), s.ws, filepath.Join(s.dir, BaselineDir), BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// agentTree copies the workspace as it is now, for the agent to change.
func (s testSession) agentTree(t testing.TB) string {
	t.Helper()
	a := filepath.Join(filepath.Dir(s.ws), "agent")
	os.RemoveAll(a)
	if err := os.Mkdir(a, 0o755); err != nil {
		t.Fatal(err)
	}
	copyTree(t, s.ws, a)
	if s.bases != nil {
		clear(s.bases)
		filepath.WalkDir(s.ws, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			data, err := os.ReadFile(p)
			fi, ferr := d.Info()
			if err == nil && ferr == nil {
				rel, _ := filepath.Rel(s.ws, p)
				s.bases[filepath.ToSlash(rel)] = baseRec{sha256hex(data), uint32(fi.Mode().Perm())}
			}
			return nil
		})
	}
	return a
}

// finish builds the session's patch from the baseline to the agent tree.
func (s testSession) finish(t testing.TB, agent string) *PatchInfo {
	t.Helper()
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := DiffTrees(bl.Workspace(), agent)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cs.Changes {
		c := &cs.Changes[i]
		if b, ok := s.bases[c.Path]; ok && c.Op == OpModify && c.Type == TypeFile {
			c.BaseSHA256, c.BaseMode = b.sha, b.mode
		}
	}
	info, err := writeSessionPatch(context.Background(), s.dir, cs, DirSource(agent), bl, nil)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func (s testSession) patch(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.dir, PatchFileName))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustRun(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func have(t testing.TB, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Skipf("%s not installed", tool)
	}
}

func writeFile(t testing.TB, p string, data string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

var testTime = mustTime("2020-01-02T03:04:05Z")
