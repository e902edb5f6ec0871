package preflight

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// twoFindings is a workspace with a HIGH finding (src/aws.py) and a MEDIUM
// one (.env).
func twoFindings(t *testing.T) env {
	t.Helper()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"src/aws.py": "key = '" + awsKey() + "'\n",
		".env":       envPassword(passValue),
	})
	return e
}

const (
	awsFP = "src/aws.py:aws-access-token:1"
	envFP = ".env:generic-api-key:1"
)

func findingByFP(t *testing.T, r *Report, fp string) Finding {
	t.Helper()
	for _, f := range r.Findings {
		if f.Fingerprint == fp {
			return f
		}
	}
	t.Fatalf("no finding %s; findings:\n%s", fp, fileList(r))
	return Finding{}
}

func readApprovalsFile(t *testing.T, ws string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ws, ApprovalsFile))
	must(t, err)
	return string(b)
}

func writeApprovalsFile(t *testing.T, ws, body string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755))
	must(t, os.WriteFile(filepath.Join(ws, ApprovalsFile), []byte(body), 0o644))
}

// hashLine returns the approvals line recorded for fp.
func hashLine(t *testing.T, body, fp string) (line, hash string) {
	t.Helper()
	for l := range strings.SplitSeq(body, "\n") {
		if f, h, ok := strings.Cut(l, "\t"); ok && f == fp {
			return l, h
		}
	}
	t.Fatalf("no approvals line for %s in:\n%s", fp, body)
	return "", ""
}

func hasWarning(r *Report, parts ...string) bool {
	for _, w := range r.Warnings {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(w, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestApprovalKeyUnusable: without a usable key nothing is approved, the
// scan still runs and says what to do, and approving fails without
// touching the approvals file.
func TestApprovalKeyUnusable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		spoil   func(t *testing.T, key string)
		warnHas string
	}{
		{"too short", func(t *testing.T, key string) { must(t, os.WriteFile(key, []byte("short"), 0o600)) }, "delete it"},
		{"empty (a crash while it was made)", func(t *testing.T, key string) { must(t, os.WriteFile(key, nil, 0o600)) }, "delete it"},
		{"a directory", func(t *testing.T, key string) { must(t, os.Remove(key)); must(t, os.Mkdir(key, 0o700)) }, "delete it"},
		{"a symlink", func(t *testing.T, key string) {
			other := filepath.Join(t.TempDir(), "k")
			b, err := os.ReadFile(key)
			must(t, err)
			must(t, os.WriteFile(other, b, 0o600))
			must(t, os.Remove(key))
			must(t, os.Symlink(other, key))
		}, "delete it"},
		{"a FIFO", func(t *testing.T, key string) { must(t, os.Remove(key)); must(t, syscall.Mkfifo(key, 0o600)) }, "delete it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := twoFindings(t)
			approveAll(t, e.scan(t))
			before := readApprovalsFile(t, e.ws)
			tt.spoil(t, e.key)

			r := e.scan(t)
			if n := len(r.Unapproved()); n != 2 {
				t.Errorf("with an unusable key: %d unapproved, want 2 (nothing approved)", n)
			}
			if !hasWarning(r, "approvals not used", e.key, tt.warnHas) {
				t.Errorf("warnings %q: want one naming the key and saying %q", r.Warnings, tt.warnHas)
			}
			err := r.approve(r.Unapproved())
			if !errors.Is(err, ErrApprovalKey) {
				t.Errorf("approve: got %v, want ErrApprovalKey", err)
			}
			if after := readApprovalsFile(t, e.ws); after != before {
				t.Errorf("approvals file changed by a failed approval:\n%s", after)
			}
		})
	}
	t.Run("deleted: a new key is made and every approval is asked again", func(t *testing.T) {
		e := twoFindings(t)
		approveAll(t, e.scan(t))
		must(t, os.Remove(e.key))
		r := e.scan(t)
		if n := len(r.Unapproved()); n != 2 {
			t.Errorf("after deleting the key: %d unapproved, want 2", n)
		}
		if len(r.Warnings) != 0 {
			t.Errorf("warnings: %q", r.Warnings)
		}
		approveAll(t, r)
		if n := len(e.scan(t).Unapproved()); n != 0 {
			t.Errorf("approved under the new key: %d unapproved, want 0", n)
		}
	})
	t.Run("readable by others: works, with a warning", func(t *testing.T) {
		e := twoFindings(t)
		approveAll(t, e.scan(t))
		must(t, os.Chmod(e.key, 0o644))
		r := e.scan(t)
		if n := len(r.Unapproved()); n != 0 {
			t.Errorf("%d unapproved, want 0", n)
		}
		if !hasWarning(r, "readable by other users", "chmod 600") {
			t.Errorf("warnings %q: want one saying chmod 600", r.Warnings)
		}
	})
}

// TestApprovalKeyConcurrentCreation: runs starting together agree on one
// key, and none sees a partial one.
func TestApprovalKeyConcurrentCreation(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		path := filepath.Join(t.TempDir(), "keys", "k")
		var wg sync.WaitGroup
		keys := make([]approvalKey, 8)
		errs := make([]error, 8)
		for i := range keys {
			wg.Go(func() { keys[i], _, errs[i] = loadApprovalKey(path) })
		}
		wg.Wait()
		for i := range keys {
			if errs[i] != nil {
				t.Fatalf("round %d, run %d: %v", round, i, errs[i])
			}
			if !bytes.Equal(keys[i], keys[0]) {
				t.Fatalf("round %d: runs got different keys", round)
			}
		}
		if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
			t.Errorf("round %d: leftovers in the key folder: %v", round, ents)
		}
	}
}

// TestApprovalsTampered: whatever is written in approved_secrets.txt, a
// line approves at most the finding it names (file and rule) with the
// secret it was made for, and a malformed line approves nothing and is
// pointed out.
func TestApprovalsTampered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// edit gets the file after approving what approveFPs name.
		approveFPs   []string
		edit         func(body string, t *testing.T) string
		wantApproved []string // fingerprints approved on a rescan
		wantWarnLine string   // a warning naming this ":<line>:" of the file
	}{
		{name: "untouched", approveFPs: []string{envFP}, edit: func(b string, _ *testing.T) string { return b },
			wantApproved: []string{envFP}},
		{name: "a HIGH approval relabelled as the MEDIUM finding approves neither", approveFPs: []string{awsFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, awsFP)
				return strings.Replace(b, line, envFP+"\t"+h, 1)
			}},
		{name: "a MEDIUM approval's hash copied under the HIGH fingerprint approves only the MEDIUM one", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				_, h := hashLine(t, b, envFP)
				return b + awsFP + "\t" + h + "\n"
			}, wantApproved: []string{envFP}},
		{name: "line number edited: still the same secret in the same file", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, envFP)
				return strings.Replace(b, line, ".env:generic-api-key:99\t"+h, 1)
			}, wantApproved: []string{envFP}},
		{name: "windows line endings", approveFPs: []string{envFP},
			edit:         func(b string, _ *testing.T) string { return strings.ReplaceAll(b, "\n", "\r\n") },
			wantApproved: []string{envFP}},
		{name: "duplicated line", approveFPs: []string{envFP},
			edit:         func(b string, t *testing.T) string { line, _ := hashLine(t, b, envFP); return b + line + "\n" },
			wantApproved: []string{envFP}},
		{name: "truncated hash", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, _ := hashLine(t, b, envFP)
				return strings.Replace(b, line, line[:len(line)-1], 1)
			},
			wantWarnLine: ":6:"},
		{name: "upper-case hash", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, envFP)
				return strings.Replace(b, line, envFP+"\t"+hashPrefix+strings.ToUpper(h[len(hashPrefix):]), 1)
			}, wantWarnLine: ":6:"},
		{name: "hash with a non-hex digit", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, _ := hashLine(t, b, envFP)
				return strings.Replace(b, line, line[:len(line)-1]+"g", 1)
			}, wantWarnLine: ":6:"},
		{name: "no fingerprint", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, envFP)
				return strings.Replace(b, line, h, 1)
			}, wantWarnLine: ":6:"},
		{name: "fingerprint without a line number", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, envFP)
				return strings.Replace(b, line, ".env:generic-api-key\t"+h, 1)
			}, wantWarnLine: ":6:"},
		{name: "a hash of another kind", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, h := hashLine(t, b, envFP)
				return strings.Replace(b, line, envFP+"\tsha256:"+h[len(hashPrefix):], 1)
			}, wantWarnLine: ":6:"},
		{name: "a secret pasted in place of its hash", approveFPs: []string{envFP},
			edit: func(b string, t *testing.T) string {
				line, _ := hashLine(t, b, envFP)
				return strings.Replace(b, line, envFP+"\t"+passValue, 1)
			}, wantWarnLine: ":6:"},
		{name: "binary garbage", approveFPs: []string{envFP},
			edit:         func(b string, _ *testing.T) string { return "\x00\xff\xfe garbage\n" + b },
			wantApproved: []string{envFP}, wantWarnLine: ":1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := twoFindings(t)
			r := e.scan(t)
			var pick []Finding
			for _, fp := range tt.approveFPs {
				pick = append(pick, findingByFP(t, r, fp))
			}
			must(t, r.approve(pick))
			writeApprovalsFile(t, e.ws, tt.edit(readApprovalsFile(t, e.ws), t))

			r = e.scan(t)
			want := map[string]bool{}
			for _, fp := range tt.wantApproved {
				want[fp] = true
			}
			for _, f := range r.Findings {
				if got := f.Status == StatusApproved; got != want[f.Fingerprint] {
					t.Errorf("%s: approved %v, want %v", f.Fingerprint, got, want[f.Fingerprint])
				}
			}
			if tt.wantWarnLine != "" {
				if !hasWarning(r, ApprovalsFile+tt.wantWarnLine, "approves nothing", "vibedom preflight --review") {
					t.Errorf("warnings %q: want one for %s%s saying what to do", r.Warnings, ApprovalsFile, tt.wantWarnLine)
				}
			} else if len(r.Warnings) != 0 {
				t.Errorf("warnings: %q", r.Warnings)
			}
			for _, w := range r.Warnings {
				if strings.Contains(w, passValue) {
					t.Errorf("a warning quotes the file's content: %q", w)
				}
			}
		})
	}
}

// TestApprovalsFileKept: approving again keeps what it did not write
// (comments, lines it cannot read, approvals another run recorded
// meanwhile), and refuses to overwrite a file it could not read.
func TestApprovalsFileKept(t *testing.T) {
	t.Parallel()
	t.Run("comments and unusable lines survive a rewrite", func(t *testing.T) {
		e := twoFindings(t)
		writeApprovalsFile(t, e.ws, "# my notes\nnot an approval\n")
		r := e.scan(t)
		approveAll(t, r)
		body := readApprovalsFile(t, e.ws)
		if !strings.HasPrefix(body, "# my notes\nnot an approval\n") {
			t.Errorf("rewrite lost lines:\n%s", body)
		}
	})
	t.Run("an approval recorded by another run meanwhile is kept", func(t *testing.T) {
		e := twoFindings(t)
		r1, r2 := e.scan(t), e.scan(t)
		must(t, r1.approve([]Finding{findingByFP(t, r1, awsFP)}))
		must(t, r2.approve([]Finding{findingByFP(t, r2, envFP)}))
		if n := len(e.scan(t).Unapproved()); n != 0 {
			t.Errorf("%d unapproved, want 0 (one run's approval was lost):\n%s", n, readApprovalsFile(t, e.ws))
		}
	})
	t.Run("a file too large to read is not used and not overwritten", func(t *testing.T) {
		e := twoFindings(t)
		approveAll(t, e.scan(t))
		big := readApprovalsFile(t, e.ws) + strings.Repeat("#\n", maxApprovalsSize/2)
		writeApprovalsFile(t, e.ws, big)
		r := e.scan(t)
		if n := len(r.Unapproved()); n != 2 {
			t.Errorf("%d unapproved, want 2", n)
		}
		if !hasWarning(r, "approvals not used", "larger than", "delete it") {
			t.Errorf("warnings: %q", r.Warnings)
		}
		if err := r.approve(r.Unapproved()); err == nil {
			t.Error("approve over an unread file: no error")
		}
		if readApprovalsFile(t, e.ws) != big {
			t.Error("the unread approvals file was overwritten")
		}
	})
	t.Run("a symlinked file is refused with advice", func(t *testing.T) {
		e := twoFindings(t)
		approveAll(t, e.scan(t))
		p := filepath.Join(e.ws, ApprovalsFile)
		must(t, os.Rename(p, p+".real"))
		must(t, os.Symlink(p+".real", p))
		r := e.scan(t)
		if !hasWarning(r, "symbolic link", "delete it") {
			t.Errorf("warnings: %q", r.Warnings)
		}
	})
}

// TestApprovalPathOnlyFinding: a finding with no secret value (a .p12 file
// found by its name) is approved for the file's content, scanned or too
// large to scan: new content at that path asks again.
func TestApprovalPathOnlyFinding(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		size int
	}{{"scanned", 100}, {"too large to scan", 4096}} { // MaxFileSize is 1024
		t.Run(tt.name, func(t *testing.T) {
			size := tt.size
			e := newEnv(t)
			body := "\x30\x82" + strings.Repeat("a", size)
			writeTree(t, e.ws, map[string]string{"certs/client.p12": body})
			opts := e.opts()
			opts.MaxFileSize = 1024
			scan := func() *Report {
				r, err := Scan(t.Context(), opts)
				must(t, err)
				return r
			}
			r := scan()
			if f := findingByFP(t, r, "certs/client.p12:pkcs12-file:0"); f.Redacted() != "(whole file)" {
				t.Errorf("redacted: %q", f.Redacted())
			}
			approveAll(t, r)
			if n := len(scan().Unapproved()); n != 0 {
				t.Fatalf("rescan: %d unapproved, want 0", n)
			}
			writeTree(t, e.ws, map[string]string{"certs/client.p12": "\x30\x82" + strings.Repeat("b", size)})
			if n := len(scan().Unapproved()); n != 1 {
				t.Errorf("new content, same size: %d unapproved, want 1", n)
			}
		})
	}
}
