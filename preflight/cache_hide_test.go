package preflight

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCacheNeverHidesASecret: after a warm cache, every way the inputs of
// a verdict can change leads to the right answer on the next scan.
func TestCacheNeverHidesASecret(t *testing.T) {
	t.Parallel() // waits out the racy window
	// ruleV1 and ruleV2 have the same length, so an edit in place keeps the
	// config file's size too.
	const ruleV1 = "[[rules]]\nid = \"acme-token\"\nregex = '''ACME-9[0-9]{7}'''\n"
	const ruleV2 = "[[rules]]\nid = \"acme-token\"\nregex = '''ACME-1[0-9]{7}'''\n"
	tests := []struct {
		name   string
		change func(t *testing.T, e env, cfg string)
		key    string // "file rule" expected after the change
		want   Status
	}{
		{"a file rewritten in place, size and times put back with touch -r", func(t *testing.T, e env, _ string) {
			rewriteKeepingStat(t, filepath.Join(e.ws, "src/clean.go"), "T="+githubPAT("3")+"\n", true)
		}, "src/clean.go github-pat", StatusUnapproved},
		{"a file rewritten in place, size and mtime put back with Chtimes", func(t *testing.T, e env, _ string) {
			rewriteKeepingStat(t, filepath.Join(e.ws, "src/clean.go"), "T="+githubPAT("3")+"\n", false)
		}, "src/clean.go github-pat", StatusUnapproved},
		{"a file replaced by rename (an editor's save), mtime put back", func(t *testing.T, e env, _ string) {
			p := filepath.Join(e.ws, "src/clean.go")
			fi, err := os.Stat(p)
			must(t, err)
			tmp := p + ".swp"
			must(t, os.WriteFile(tmp, []byte(padTo("T="+githubPAT("3")+"\n", int(fi.Size()))), 0o644))
			must(t, os.Chtimes(tmp, fi.ModTime(), fi.ModTime()))
			must(t, os.Rename(tmp, p))
		}, "src/clean.go github-pat", StatusUnapproved},
		{"the user's gitleaks.toml edited in place, size and mtime put back", func(t *testing.T, e env, cfg string) {
			fi, err := os.Stat(cfg)
			must(t, err)
			must(t, os.WriteFile(cfg, []byte(ruleV2), 0o644))
			must(t, os.Chtimes(cfg, fi.ModTime(), fi.ModTime()))
		}, "src/clean.go acme-token", StatusUnapproved},
		{"an entry removed from .gitleaksignore", func(t *testing.T, e env, _ string) {
			must(t, os.WriteFile(filepath.Join(e.ws, IgnoreFile), []byte("# nothing ignored\n"), 0o644))
		}, "ignored.env github-pat", StatusUnapproved},
		{".gitleaksignore deleted", func(t *testing.T, e env, _ string) {
			must(t, os.Remove(filepath.Join(e.ws, IgnoreFile)))
		}, "ignored.env github-pat", StatusUnapproved},
		{"an entry added to .gitleaksignore", func(t *testing.T, e env, _ string) {
			must(t, os.WriteFile(filepath.Join(e.ws, IgnoreFile), []byte("ignored.env:github-pat:1\nsecret.env:github-pat:1\n"), 0o644))
		}, "secret.env github-pat", StatusIgnored},
		{"the approvals file deleted", func(t *testing.T, e env, _ string) {
			must(t, os.Remove(filepath.Join(e.ws, ApprovalsFile)))
		}, "approved.env github-pat", StatusUnapproved},
		{"an approved secret changed, same size", func(t *testing.T, e env, _ string) {
			rewriteKeepingStat(t, filepath.Join(e.ws, "approved.env"), "GITHUB_TOKEN="+githubPAT("8")+"\n", false)
		}, "approved.env github-pat", StatusUnapproved},
	}
	// One workspace per case, all made first, so the racy window is
	// waited out once.
	type setup struct {
		e    env
		opts Options
	}
	setups := make([]setup, len(tests))
	for i := range tests {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{
			"src/clean.go": "package src\n\n// ACME-12345678 " + strings.Repeat("x", 60) + "\n",
			"secret.env":   "GITHUB_TOKEN=" + githubPAT("1") + "\n",
			"ignored.env":  "GITHUB_TOKEN=" + githubPAT("2") + "\n",
			"approved.env": "GITHUB_TOKEN=" + githubPAT("4") + "\n",
			IgnoreFile:     "ignored.env:github-pat:1\n",
		})
		opts := e.opts()
		opts.UserConfig = filepath.Join(t.TempDir(), "gitleaks.toml")
		must(t, os.WriteFile(opts.UserConfig, []byte(ruleV1), 0o644))
		r, err := Scan(t.Context(), opts)
		must(t, err)
		must(t, r.approve([]Finding{findingByFP(t, r, "approved.env:github-pat:1")}))
		ageTree(t, e.ws)
		ageFile(t, opts.UserConfig)
		setups[i] = setup{e, opts}
	}
	waitOutRacyWindow()

	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, opts := setups[i].e, setups[i].opts
			scan := func() *Report {
				t.Helper()
				r, err := Scan(t.Context(), opts)
				must(t, err)
				return r
			}
			scan() // memoises every file
			warm := scan()
			if warm.Stats.CacheHits < 2 {
				t.Fatalf("cache not warm: %+v", warm.Stats)
			}
			if _, ok := byFile(warm)["src/clean.go acme-token"]; ok {
				t.Fatal("setup: the v1 rule already matches")
			}
			// The clean file is decided by its stat alone now: the change
			// must get past the memo, not just the verdicts.
			if c, _ := openCache(e.cache, warm.ConfigDigest, warm.Workspace, time.Now()); !c.sameRules || c.oldMemo["src/clean.go"] == (memoEntry{}) {
				t.Fatal("setup: src/clean.go is not memoised")
			}

			tt.change(t, e, opts.UserConfig)
			r := scan()
			f, ok := byFile(r)[tt.key]
			if !ok {
				t.Fatalf("after the change: no finding %q (stats %+v); findings:\n%s", tt.key, r.Stats, fileList(r))
			}
			if f.Status != tt.want {
				t.Errorf("%s: status %v, want %v", tt.key, f.Status, tt.want)
			}
			if f.secret != "" && !slices.Contains(r.Secrets(), f.secret) {
				t.Error("the DLP would not get the secret")
			}
		})
	}
}

// rewriteKeepingStat replaces p's content with body (padded to the old
// size) in place, then puts the old times back: with `touch -r` from a
// copy when useTouch, else with Chtimes.
func rewriteKeepingStat(t *testing.T, p, body string, useTouch bool) {
	t.Helper()
	fi, err := os.Stat(p)
	must(t, err)
	ref := filepath.Join(t.TempDir(), "ref")
	if useTouch {
		touch, err := exec.LookPath("touch")
		if err != nil {
			t.Skip("no touch command")
		}
		must(t, os.WriteFile(ref, nil, 0o644))
		if out, err := exec.Command(touch, "-r", p, ref).CombinedOutput(); err != nil {
			t.Fatalf("touch -r: %v %s", err, out)
		}
		defer func() {
			if out, err := exec.Command(touch, "-r", ref, p).CombinedOutput(); err != nil {
				t.Fatalf("touch -r: %v %s", err, out)
			}
			checkSameStat(t, p, fi)
		}()
	} else {
		defer func() {
			must(t, os.Chtimes(p, fi.ModTime(), fi.ModTime()))
			checkSameStat(t, p, fi)
		}()
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0) // same inode
	must(t, err)
	_, err = f.WriteAt([]byte(padTo(body, int(fi.Size()))), 0)
	must(t, err)
	must(t, f.Close())
}

func checkSameStat(t *testing.T, p string, was os.FileInfo) {
	t.Helper()
	fi, err := os.Stat(p)
	must(t, err)
	if fi.Size() != was.Size() || !fi.ModTime().Equal(was.ModTime()) || !os.SameFile(fi, was) {
		t.Fatalf("%s: size, mtime or inode changed: the test would not test the memo", p)
	}
}

func padTo(body string, size int) string {
	switch {
	case len(body) == size:
		return body
	case len(body) > size:
		panic(fmt.Sprintf("padTo: %d bytes do not fit in %d", len(body), size))
	}
	return body + strings.Repeat("#", size-len(body)-1) + "\n"
}

func ageFile(t *testing.T, p string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	must(t, os.Chtimes(p, old, old))
}

// TestCacheKeyedByContent: a verdict belongs to the bytes (and the path),
// not to the file: the same tree in another folder has no stat memo, so
// every file is read and hashed, and the clean ones are cache hits.
func TestCacheKeyedByContent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	files := map[string]string{"a.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"}
	for i := range 10 {
		files[fmt.Sprintf("src/f%d.go", i)] = fmt.Sprintf("package src\n\nconst n%d = %d\n", i, i)
	}
	writeTree(t, e.ws, files)
	e.scan(t)

	copyEnv := e
	copyEnv.ws = t.TempDir()
	writeTree(t, copyEnv.ws, files)
	r := copyEnv.scan(t)
	if r.Stats.CacheHits != 10 || r.Stats.Scanned != 1 {
		t.Errorf("copy: %+v, want 10 hits by content and the file with a secret scanned", r.Stats)
	}

	t.Run("with no stat trusted at all, hits still come from content", func(t *testing.T) {
		opts := e.opts()
		opts.noStatMemo = true
		r, err := Scan(t.Context(), opts)
		must(t, err)
		if r.Stats.CacheHits != 10 || r.Stats.Scanned != 1 {
			t.Errorf("%+v, want 10 hits and 1 scanned", r.Stats)
		}
	})
	t.Run("same bytes at another path are scanned again", func(t *testing.T) {
		writeTree(t, e.ws, map[string]string{"src/moved.go": files["src/f1.go"]})
		r := e.scan(t)
		if r.Stats.Scanned != 2 {
			t.Errorf("%+v, want the new path and a.env scanned", r.Stats)
		}
	})
}

// TestCacheNoCtimeNotMemoised: a file system that keeps no ctime cannot
// show a rewrite with size and mtime put back, so its files are not
// memoised (they are read and hashed every time).
func TestCacheNoCtimeNotMemoised(t *testing.T) {
	t.Parallel()
	c := &cache{newMemo: map[string]memoEntry{}}
	now := time.Now()
	old := now.Add(-time.Hour).UnixNano()
	c.remember("a", statKey{Size: 1, Mtime: old, Ctime: 0, Ino: 1, Dev: 1}, [32]byte{1}, now)
	c.remember("b", statKey{Size: 1, Mtime: old, Ctime: old, Ino: 2, Dev: 1}, [32]byte{2}, now)
	if _, ok := c.newMemo["a"]; ok {
		t.Error("a file with no ctime was memoised")
	}
	if _, ok := c.newMemo["b"]; !ok {
		t.Error("an ordinary old file was not memoised")
	}
}

// TestCacheStatTrust: the memo trusts stat only on local file systems; on
// others (network, FUSE) every file is read and hashed, and verdicts still
// come from the content-addressed cache.
func TestCacheStatTrust(t *testing.T) {
	t.Parallel() // waits out the racy window
	t.Run("the test's temporary folder is local", func(t *testing.T) {
		if ok, name := statTrusted(t.TempDir()); !ok {
			t.Errorf("statTrusted(TempDir) = false (%s): the memo tests here need a local file system", name)
		}
	})
	if runtime.GOOS == "linux" {
		t.Run("proc is not", func(t *testing.T) {
			if ok, name := statTrusted("/proc/self"); ok {
				t.Errorf("statTrusted(/proc/self) = true (%s)", name)
			}
		})
	}
	t.Run("untrusted: nothing memoised, clean files still hits by content", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{"a.go": "package a\n", "b.go": "package b\n"})
		ageTree(t, e.ws)
		waitOutRacyWindow()
		opts := e.opts()
		probed := 0
		opts.statTrusted = func(string) (bool, string) { probed++; return false, "nfs" }
		var r *Report
		for range 2 {
			var err error
			r, err = Scan(t.Context(), opts)
			must(t, err)
		}
		if c, _ := openCache(e.cache, r.ConfigDigest, r.Workspace, time.Now()); len(c.oldMemo) != 0 {
			t.Errorf("memoised on an untrusted file system: %v", c.oldMemo)
		}
		if r.Stats.CacheHits != 2 {
			t.Errorf("repeat: %+v, want 2 hits by content", r.Stats)
		}
		if probed != 2 { // once per device per scan
			t.Errorf("file system probed %d times, want 2", probed)
		}
	})
}
