package preflight

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// ageTree moves every file's mtime back, out of the racy window, as files
// untouched for a while are. (ctime cannot be moved back; the memo only
// checks it against the moment of reading, which it is well before.)
func ageTree(t testing.TB, dir string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Type()&os.ModeSymlink != 0 {
			return err
		}
		return os.Chtimes(p, old, old)
	})
	must(t, err)
}

// waitOutRacyWindow makes the files' ctimes older than the racy window.
func waitOutRacyWindow() { time.Sleep(racyWindow + 100*time.Millisecond) }

func TestCache(t *testing.T) {
	t.Parallel() // waits out the racy window
	e := newEnv(t)
	files := map[string]string{"with-secret.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"}
	for i := range 20 {
		files[fmt.Sprintf("src/f%02d.go", i)] = fmt.Sprintf("package src\n\n// %s\nconst n%d = %d\n", strings.Repeat("x", 80), i, i)
	}
	writeTree(t, e.ws, files)
	ageTree(t, e.ws)
	waitOutRacyWindow()

	first := e.scan(t)
	if first.Stats.Scanned != 21 || first.Stats.CacheHits != 0 {
		t.Fatalf("first scan: %+v, want 21 scanned", first.Stats)
	}

	t.Run("unchanged tree: clean files are hits, files with findings are rescanned", func(t *testing.T) {
		r := e.scan(t)
		if r.Stats.CacheHits != 20 || r.Stats.Scanned != 1 {
			t.Errorf("repeat: %+v, want 20 hits and 1 scanned", r.Stats)
		}
		if !slices.Contains(r.Secrets(), githubPAT("1")) {
			t.Error("repeat scan lost the secret")
		}
	})

	t.Run("a secret written into a cached file is found", func(t *testing.T) {
		// Same size as before, mtime put back: only ctime (and content) change.
		p := filepath.Join(e.ws, "src/f03.go")
		old, _ := os.ReadFile(p)
		fi, _ := os.Stat(p)
		body := "T=" + githubPAT("3") + "\n"
		body += strings.Repeat("#", len(old)-len(body)-1) + "\n"
		must(t, os.WriteFile(p, []byte(body), 0o644))
		must(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
		if fi2, _ := os.Stat(p); fi2.Size() != fi.Size() || !fi2.ModTime().Equal(fi.ModTime()) {
			t.Fatalf("size or mtime differ: the test would not test the ctime check")
		}
		r := e.scan(t)
		if _, ok := byFile(r)["src/f03.go github-pat"]; !ok {
			t.Errorf("changed file not rescanned: %+v\n%s", r.Stats, fileList(r))
		}
	})

	t.Run("a new file is scanned, a deleted one forgotten", func(t *testing.T) {
		writeTree(t, e.ws, map[string]string{"src/new.env": "GITHUB_TOKEN=" + githubPAT("4") + "\n"})
		must(t, os.Remove(filepath.Join(e.ws, "src/f05.go")))
		r := e.scan(t)
		if _, ok := byFile(r)["src/new.env github-pat"]; !ok {
			t.Errorf("new file not found: %s", fileList(r))
		}
		if r.Stats.Files != 21 {
			t.Errorf("files: got %d, want 21", r.Stats.Files)
		}
	})

	t.Run("a rule change invalidates every verdict", func(t *testing.T) {
		opts := e.opts()
		opts.UserConfig = filepath.Join(t.TempDir(), "gitleaks.toml")
		must(t, os.WriteFile(opts.UserConfig, []byte("[[rules]]\nid = \"acme\"\nregex = '''const n1[0-9] = 1[0-9]'''\n"), 0o644))
		r, err := Scan(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if r.Stats.CacheHits != 0 {
			t.Errorf("new rules: %d cache hits, want 0", r.Stats.CacheHits)
		}
		if n := len(slices.DeleteFunc(r.Findings, func(f Finding) bool { return f.RuleID != "acme" })); n != 10 {
			t.Errorf("new rule found %d, want 10", n)
		}
	})

	t.Run("a rename is rescanned (verdicts are per path)", func(t *testing.T) {
		must(t, os.Rename(filepath.Join(e.ws, "src/f07.go"), filepath.Join(e.ws, "src/f07.p12")))
		r := e.scan(t)
		if _, ok := byFile(r)["src/f07.p12 pkcs12-file"]; !ok {
			t.Errorf("renamed file's path rule not applied: %s", fileList(r))
		}
	})

	t.Run("the cache holds no secret", func(t *testing.T) {
		secrets := []string{githubPAT("1"), githubPAT("3"), githubPAT("4")}
		err := filepath.WalkDir(e.cache, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, s := range secrets {
				if bytes.Contains(b, []byte(s)) || bytes.Contains(b, []byte(s[4:14])) {
					t.Errorf("%s holds a secret or part of one", d.Name())
				}
			}
			if fi, _ := d.Info(); fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s mode %v, want private", d.Name(), fi.Mode().Perm())
			}
			return nil
		})
		must(t, err)
	})
}

func TestCacheRacyFileNotMemoised(t *testing.T) {
	t.Parallel() // waits out the racy window
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{"fresh.go": "package x\n"})
	e.scan(t) // the file was written just now: its stat must not be trusted
	c, warn := openCache(e.cache, mustRules(t).digest, mustEval(t, e.ws), time.Now())
	if warn != "" {
		t.Fatal(warn)
	}
	if _, ok := c.oldMemo["fresh.go"]; ok {
		t.Error("a file modified within the racy window was memoised")
	}
	// Aged, it is memoised.
	ageTree(t, e.ws)
	waitOutRacyWindow()
	e.scan(t)
	c, _ = openCache(e.cache, mustRules(t).digest, mustEval(t, e.ws), time.Now())
	if _, ok := c.oldMemo["fresh.go"]; !ok {
		t.Error("an old file was not memoised")
	}
}

func TestCacheCorruptIsRebuilt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{"a.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n", "b.go": "package b\n"})
	e.scan(t)
	entries, err := os.ReadDir(e.cache)
	if err != nil || len(entries) == 0 {
		t.Fatalf("cache dir: %v, %d entries", err, len(entries))
	}
	for _, en := range entries {
		must(t, os.WriteFile(filepath.Join(e.cache, en.Name()), []byte("garbage"), 0o600))
	}
	r := e.scan(t)
	if len(r.Warnings) == 0 || !strings.Contains(r.Warnings[0], "cache ignored") {
		t.Errorf("warnings: got %q, want a cache warning", r.Warnings)
	}
	if _, ok := byFile(r)["a.env github-pat"]; !ok {
		t.Errorf("finding lost with a corrupt cache: %s", fileList(r))
	}
	r = e.scan(t)
	if len(r.Warnings) != 0 {
		t.Errorf("cache not rebuilt: %q", r.Warnings)
	}
}

func mustRules(t *testing.T) *rules {
	t.Helper()
	rs, err := loadRules("")
	must(t, err)
	return rs
}

func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	must(t, err)
	return r
}
