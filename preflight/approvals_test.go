package preflight

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// approveAll approves every unapproved finding, as [a] does.
func approveAll(t *testing.T, r *Report) {
	t.Helper()
	if err := r.approve(r.Unapproved()); err != nil {
		t.Fatalf("approve: %v", err)
	}
}

func statusOf(t *testing.T, r *Report, key string) Status {
	t.Helper()
	f, ok := byFile(r)[key]
	if !ok {
		t.Fatalf("no finding %q; findings:\n%s", key, fileList(r))
	}
	return f.Status
}

func TestApprovals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(t *testing.T, ws string) // after approving
		key    string
		want   Status
	}{
		{"survive a rescan", func(*testing.T, string) {}, "app.env github-pat", StatusApproved},
		{"survive the secret moving down its file", func(t *testing.T, ws string) {
			writeTree(t, ws, map[string]string{"app.env": "# new first line\n\nGITHUB_TOKEN=" + githubPAT("1") + "\n"})
		}, "app.env github-pat", StatusApproved},
		{"ask again when the secret changes", func(t *testing.T, ws string) {
			writeTree(t, ws, map[string]string{"app.env": "GITHUB_TOKEN=" + githubPAT("2") + "\n"})
		}, "app.env github-pat", StatusUnapproved},
		{"ask again when the same secret appears in another file", func(t *testing.T, ws string) {
			writeTree(t, ws, map[string]string{"other.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"})
		}, "other.env github-pat", StatusUnapproved},
		{"ask again under another user's key", func(t *testing.T, ws string) {}, "app.env github-pat", StatusUnapproved},
		{"ask again when the approvals file is a symlink", func(t *testing.T, ws string) {
			p := filepath.Join(ws, ApprovalsFile)
			must(t, os.Rename(p, p+".real"))
			must(t, os.Symlink(p+".real", p))
		}, "app.env github-pat", StatusUnapproved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			writeTree(t, e.ws, map[string]string{"app.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"})
			r := e.scan(t)
			approveAll(t, r)
			if st := statusOf(t, r, "app.env github-pat"); st != StatusApproved {
				t.Fatalf("after approving: status %v", st)
			}
			tt.change(t, e.ws)
			if strings.Contains(tt.name, "another user's key") {
				e.key = filepath.Join(t.TempDir(), "other.key")
			}
			r = e.scan(t)
			if got := statusOf(t, r, tt.key); got != tt.want {
				t.Errorf("%s: got %v, want %v", tt.key, got, tt.want)
			}
		})
	}
}

func TestApprovalsFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	short := "root1234"
	writeTree(t, e.ws, map[string]string{
		"app.env":   "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		".env":      envPassword(passValue),
		"short.env": "cu" + "rl -u admin:" + short + " https://api.acme.io\n",
	})
	r := e.scan(t)
	approveAll(t, r)
	b, err := os.ReadFile(filepath.Join(e.ws, ApprovalsFile))
	if err != nil {
		t.Fatal(err)
	}
	body := string(b)
	t.Run("holds no secret and no prefix of one", func(t *testing.T) {
		for _, s := range r.Secrets() {
			if strings.Contains(body, s) || strings.Contains(body, s[:6]) {
				t.Errorf("approvals file holds a secret (length %d) or its prefix", len(s))
			}
		}
	})
	t.Run("one line per finding: fingerprint, tab, keyed hash", func(t *testing.T) {
		n := 0
		for line := range strings.SplitSeq(body, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			fp, h, ok := strings.Cut(line, "\t")
			if !ok || !strings.HasPrefix(h, hashPrefix) || len(h) != len(hashPrefix)+64 || !strings.Contains(fp, ":") {
				t.Errorf("bad line %q", line)
			}
			n++
		}
		if n != len(r.Findings) {
			t.Errorf("got %d lines, want %d", n, len(r.Findings))
		}
	})
	t.Run("hash is keyed", func(t *testing.T) {
		k := approvalKey(make([]byte, 32)) // some other key
		for _, f := range r.Findings {
			plain := sha256.Sum256([]byte(f.secret))
			if strings.Contains(body, hex.EncodeToString(plain[:])) {
				t.Errorf("%s: plain sha256 of the secret in the file", f.Fingerprint)
			}
			if strings.Contains(body, k.approvalHash(f.File, f.RuleID, f.secret)) {
				t.Errorf("%s: hash computable with another key", f.Fingerprint)
			}
		}
	})
	t.Run("the file itself raises no finding", func(t *testing.T) {
		r2 := e.scan(t)
		for _, f := range r2.Findings {
			if strings.HasPrefix(f.File, ".vibedom/") {
				t.Errorf("finding in our own file: %v", f)
			}
		}
		if n := len(r2.Unapproved()); n != 0 {
			t.Errorf("rescan: %d unapproved, want 0", n)
		}
	})
	t.Run("re-approving a changed secret replaces its line", func(t *testing.T) {
		writeTree(t, e.ws, map[string]string{"app.env": "GITHUB_TOKEN=" + githubPAT("9") + "\n"})
		r3 := e.scan(t)
		approveAll(t, r3)
		b, _ := os.ReadFile(filepath.Join(e.ws, ApprovalsFile))
		if c := strings.Count(string(b), "app.env:github-pat:1\t"); c != 1 {
			t.Errorf("app.env fingerprint appears %d times, want 1", c)
		}
	})
	t.Run("approval key is private", func(t *testing.T) {
		fi, err := os.Stat(e.key)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
		}
		di, _ := os.Stat(filepath.Dir(e.key))
		if di.Mode().Perm() != 0o700 {
			t.Errorf("key dir mode %v, want 0700", di.Mode().Perm())
		}
	})
}

// TestApprovalsRefuseSymlinks: a workspace could aim .vibedom somewhere
// else (say ~/.ssh); approving must not write there.
func TestApprovalsRefuseSymlinks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, ws, outside string)
	}{
		{".vibedom is a symlink to a directory", func(t *testing.T, ws, outside string) {
			must(t, os.Symlink(outside, filepath.Join(ws, ".vibedom")))
		}},
		{"approvals file is a symlink", func(t *testing.T, ws, outside string) {
			must(t, os.Mkdir(filepath.Join(ws, ".vibedom"), 0o755))
			must(t, os.Symlink(filepath.Join(outside, "approved_secrets.txt"), filepath.Join(ws, ApprovalsFile)))
		}},
		{".vibedom is a file", func(t *testing.T, ws, outside string) {
			must(t, os.WriteFile(filepath.Join(ws, ".vibedom"), nil, 0o644))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			outside := t.TempDir()
			writeTree(t, e.ws, map[string]string{"app.env": "GITHUB_TOKEN=" + githubPAT("1") + "\n"})
			tt.setup(t, e.ws, outside)
			r := e.scan(t)
			if err := r.approve(r.Unapproved()); err == nil {
				t.Error("approve: no error")
			}
			entries, _ := os.ReadDir(outside)
			if len(entries) != 0 {
				t.Errorf("something was written outside the workspace: %v", entries)
			}
		})
	}
}

// TestApprovalsShareAFingerprint: one fingerprint (file:rule:line) can
// name more than one secret, and one secret can sit on more than one line.
func TestApprovalsShareAFingerprint(t *testing.T) {
	t.Parallel()
	t.Run("two secrets on one line both stay approved", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{"app.sh": "export A=" + githubPAT("1") + " B=" + githubPAT("2") + "\n"})
		r := e.scan(t)
		if n := len(r.Unapproved()); n != 2 {
			t.Fatalf("setup: %d unapproved, want 2:\n%s", n, fileList(r))
		}
		approveAll(t, r)
		if n := len(e.scan(t).Unapproved()); n != 0 {
			t.Errorf("rescan: %d unapproved, want 0", n)
		}
	})
	t.Run("an approved secret that moved keeps its approval when another takes its line", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{"app.env": "T=" + githubPAT("1") + "\n"})
		approveAll(t, e.scan(t))
		writeTree(t, e.ws, map[string]string{"app.env": "U=" + githubPAT("2") + "\nT=" + githubPAT("1") + "\n"})
		r := e.scan(t)
		un := r.Unapproved()
		if len(un) != 1 || un[0].Line != 1 {
			t.Fatalf("after the edit: unapproved %v, want only the new secret on line 1", un)
		}
		approveAll(t, r)
		if n := len(e.scan(t).Unapproved()); n != 0 {
			t.Errorf("rescan: %d unapproved, want 0 (the moved secret lost its approval)", n)
		}
	})
	t.Run("a changed secret's stale line is replaced, not kept", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{"app.env": "T=" + githubPAT("1") + "\n"})
		approveAll(t, e.scan(t))
		writeTree(t, e.ws, map[string]string{"app.env": "T=" + githubPAT("2") + "\n"})
		approveAll(t, e.scan(t))
		b, err := os.ReadFile(filepath.Join(e.ws, ApprovalsFile))
		must(t, err)
		if c := strings.Count(string(b), hashPrefix); c != 1 {
			t.Errorf("approvals file has %d hashes, want 1:\n%s", c, b)
		}
	})
	t.Run("picking one line of a repeated secret settles both", func(t *testing.T) {
		e := newEnv(t)
		writeTree(t, e.ws, map[string]string{
			"app.env": "T=" + githubPAT("1") + "\n\nT=" + githubPAT("1") + "\n",
			"b.env":   "T=" + githubPAT("3") + "\n",
		})
		r := e.scan(t)
		if n := len(r.Unapproved()); n != 3 {
			t.Fatalf("setup: %d unapproved, want 3:\n%s", n, fileList(r))
		}
		var out strings.Builder
		got, err := Review(t.Context(), r, strings.NewReader("i\n1\n"), &out, true, ModePrompt)
		if got != OutcomeContinue || err != nil {
			t.Fatalf("Review: got %v, %v", got, err)
		}
		if !strings.Contains(out.String(), "Approved 2 finding(s) for this workspace; 1 will be asked again") {
			t.Errorf("output does not count what was settled:\n%s", out.String())
		}
		if n := len(e.scan(t).Unapproved()); n != 1 {
			t.Errorf("rescan: %d unapproved, want 1", n)
		}
	})
}
