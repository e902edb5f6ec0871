package preflight

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func TestParseFingerprint(t *testing.T) {
	t.Parallel()
	roots := []string{"/home/u/app", "/private/home/u/app"}
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"global form", "config/app.env:generic-api-key:3", "config/app.env:generic-api-key:3", true},
		{"commit form", "0123456789abcdef0123456789abcdef01234567:config/app.env:github-pat:12", "config/app.env:github-pat:12", true},
		{"short commit form", "a1b2c3d:x.env:github-pat:1", "x.env:github-pat:1", true},
		{"backslashes", `config\app.env:generic-api-key:3`, "config/app.env:generic-api-key:3", true},
		{"leading ./", "./config/app.env:generic-api-key:3", "config/app.env:generic-api-key:3", true},
		{"absolute inside", "/home/u/app/config/app.env:generic-api-key:3", "config/app.env:generic-api-key:3", true},
		{"absolute inside, resolved spelling", "/private/home/u/app/a.env:generic-api-key:3", "a.env:generic-api-key:3", true},
		{"absolute outside", "/home/u/other/app.env:generic-api-key:3", "", false},
		{"sibling with the same prefix", "/home/u/app2/app.env:generic-api-key:3", "", false},
		{"escapes the workspace", "../secrets.env:generic-api-key:3", "", false},
		{"colon in the file name", "odd:name.env:github-pat:2", "odd:name.env:github-pat:2", true},
		{"8-hex commit prefix", "deadbeef:x.env:github-pat:2", "x.env:github-pat:2", true},
		{"no line", "config/app.env:generic-api-key", "", false},
		{"line not a number", "config/app.env:generic-api-key:x", "", false},
		{"empty rule", "config/app.env::3", "", false},
		{"just text", "hello", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseFingerprint(tt.in, roots)
			if ok != tt.ok || got != tt.want {
				t.Errorf("parseFingerprint(%q): got %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestScanGitleaksIgnore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"a.env":     "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"b/c.env":   "x=1\nGITHUB_TOKEN=" + githubPAT("2") + "\n",
		"d.env":     "GITHUB_TOKEN=" + githubPAT("3") + "\n",
		"e.env":     "GITHUB_TOKEN=" + githubPAT("4") + "\n",
		"kept.env":  "GITHUB_TOKEN=" + githubPAT("5") + "\n",
		"moved.env": "\nGITHUB_TOKEN=" + githubPAT("6") + "\n",
		IgnoreFile: strings.Join([]string{
			"# comment",
			"a.env:github-pat:1",
			"0123456789abcdef0123456789abcdef01234567:b/c.env:github-pat:2",
			`.\d.env:github-pat:1`,
			e.ws + "/e.env:github-pat:1",
			"moved.env:github-pat:1", // the secret is on line 2: not ignored
			"not a fingerprint",
		}, "\n") + "\n",
	})
	r := e.scan(t)
	got := byFile(r)
	tests := []struct {
		key  string
		want Status
	}{
		{"a.env github-pat", StatusIgnored},
		{"b/c.env github-pat", StatusIgnored},
		{"d.env github-pat", StatusIgnored},
		{"e.env github-pat", StatusIgnored},
		{"kept.env github-pat", StatusUnapproved},
		{"moved.env github-pat", StatusUnapproved},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			f, ok := got[tt.key]
			if !ok {
				t.Fatalf("no finding %q; findings:\n%s", tt.key, fileList(r))
			}
			if f.Status != tt.want {
				t.Errorf("%s: status got %v, want %v", tt.key, f.Status, tt.want)
			}
			if f.Status == StatusIgnored && f.Number != 0 {
				t.Errorf("%s: ignored finding numbered %d", tt.key, f.Number)
			}
		})
	}
	t.Run("ignored secrets still go to the DLP", func(t *testing.T) {
		if !slices.Contains(r.Secrets(), githubPAT("1")) {
			t.Error("Secrets() lacks an ignored secret")
		}
	})
	t.Run("bad line warned about", func(t *testing.T) {
		if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "not a fingerprint") {
			t.Errorf("warnings: got %q, want one about the bad line", r.Warnings)
		}
	})
}

// TestGitleaksIgnoreUnusable: an ignore file that is a FIFO (which would
// block a plain open), a symlink, or huge ignores nothing and says so.
func TestGitleaksIgnoreUnusable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, ws string)
	}{
		{"fifo", func(t *testing.T, ws string) { must(t, syscall.Mkfifo(filepath.Join(ws, IgnoreFile), 0o644)) }},
		{"symlink", func(t *testing.T, ws string) {
			other := filepath.Join(t.TempDir(), "ignore")
			must(t, os.WriteFile(other, []byte("a.env:github-pat:1\n"), 0o644))
			must(t, os.Symlink(other, filepath.Join(ws, IgnoreFile)))
		}},
		{"huge", func(t *testing.T, ws string) {
			must(t, os.WriteFile(filepath.Join(ws, IgnoreFile), []byte("a.env:github-pat:1\n"+strings.Repeat("#", maxIgnoreSize)), 0o644))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			writeTree(t, e.ws, map[string]string{"a.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"})
			tt.setup(t, e.ws)
			opts := e.opts()
			opts.MaxFileSize = 1 << 20 // the huge ignore file is read, not run through the rules (slow under -race)
			r, err := Scan(t.Context(), opts)
			must(t, err)
			if st := statusOf(t, r, "a.env github-pat"); st != StatusUnapproved {
				t.Errorf("status: got %v, want unapproved", st)
			}
			if len(r.Warnings) != 1 || !strings.Contains(r.Warnings[0], "not used") {
				t.Errorf("warnings: got %q", r.Warnings)
			}
		})
	}
}
