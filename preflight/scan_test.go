package preflight

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestScanRisks runs real gitleaks over a generated tree and checks the
// level each file's finding gets.
func TestScanRisks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"src/aws.py":            "client = boto3.client(key_id='" + awsKey() + "')\n",
		"tests/keys/id_rsa":     pemKey(),
		"billing/pay.py":        "stripe.api_key = \"" + stripeLive() + "\"\n",
		".env.production":       envPassword(passValue),
		"config/prod/app.env":   "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		".env.local":            envPassword(passValue),
		"web/.env.development":  envPassword(passValue),
		".env.test":             envPassword(passValue),
		"api/client_test.go":    "const tok = \"" + githubPAT("2") + "\"\n",
		"fixtures/gh.json":      `{"token": "` + githubPAT("3") + `"}` + "\n",
		"scripts/dev.sh":        "export SVC=https://bob:" + githubPAT("4") + "@localhost:8443/\n",
		".env":                  envPassword(passValue),
		"src/deploy.sh":         "TOKEN=" + githubPAT("5") + "\n",
		"src/products/store.sh": "TOKEN=" + githubPAT("6") + "\n",
	})
	r := e.scan(t)
	got := byFile(r)
	tests := []struct {
		key  string
		want Risk
	}{
		{"src/aws.py aws-access-token", RiskHigh},
		{"tests/keys/id_rsa private-key", RiskHigh},
		{"billing/pay.py stripe-access-token", RiskHigh},
		{".env.production generic-api-key", RiskHigh},
		{"config/prod/app.env github-pat", RiskHigh},
		{".env.local generic-api-key", RiskLow},
		{"web/.env.development generic-api-key", RiskLow},
		{".env.test generic-api-key", RiskLow},
		{"api/client_test.go github-pat", RiskLow},
		{"fixtures/gh.json github-pat", RiskLow},
		{"scripts/dev.sh github-pat", RiskLow},
		{".env generic-api-key", RiskMedium},
		{"src/deploy.sh github-pat", RiskMedium},
		{"src/products/store.sh github-pat", RiskMedium},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			f, ok := got[tt.key]
			if !ok {
				t.Fatalf("no finding %q; findings:\n%s", tt.key, fileList(r))
			}
			if f.Risk != tt.want {
				t.Errorf("%s: risk got %v (%s), want %v", tt.key, f.Risk, f.Reason, tt.want)
			}
			if f.Status != StatusUnapproved || f.Number == 0 {
				t.Errorf("%s: status %v number %d, want unapproved and numbered", tt.key, f.Status, f.Number)
			}
			if f.Line != 1 || f.Fingerprint != f.File+":"+f.RuleID+":1" {
				t.Errorf("%s: line %d fingerprint %q", tt.key, f.Line, f.Fingerprint)
			}
		})
	}
	t.Run("ordered HIGH first and numbered in order", func(t *testing.T) {
		for i := 1; i < len(r.Findings); i++ {
			if r.Findings[i-1].Risk < r.Findings[i].Risk {
				t.Errorf("finding %d (%v) before %d (%v)", i-1, r.Findings[i-1].Risk, i, r.Findings[i].Risk)
			}
			if r.Findings[i].Number != r.Findings[i-1].Number+1 {
				t.Errorf("numbers not consecutive: %d then %d", r.Findings[i-1].Number, r.Findings[i].Number)
			}
		}
	})
	t.Run("secrets for the DLP", func(t *testing.T) {
		s := r.Secrets()
		for _, want := range []string{awsKey(), stripeLive(), passValue, githubPAT("1")} {
			if !slices.Contains(s, want) {
				t.Errorf("Secrets() lacks a value of length %d", len(want))
			}
		}
	})
}

func TestScanWalkPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"creds.env": "GITHUB_TOKEN=" + githubPAT("7") + "\n"})
	writeTree(t, e.ws, map[string]string{
		".git/config":                     "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"sub/.git/objects/x":              "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		"vendored/.git":                   "gitdir: ../.git/modules/x " + githubPAT("1") + "\n",
		".gitignore":                      ".env\nbuild/\n",
		".env":                            "GITHUB_TOKEN=" + githubPAT("2") + "\n",
		"build/out.txt":                   "GITHUB_TOKEN=" + githubPAT("3") + "\n",
		"node_modules/pkg/index.js":       "GITHUB_TOKEN=" + githubPAT("4") + "\n",
		"bin/tool":                        "\x7fELF\x00\x00" + "GITHUB_TOKEN=" + githubPAT("5") + "\n",
		"certs/client.p12":                "\x30\x82\x00\x00binary",
		"big/dump.sql":                    strings.Repeat("x", 2048) + "GITHUB_TOKEN=" + githubPAT("6") + "\n",
		"big/blob.dat":                    "\x00" + strings.Repeat("x", 2048) + "GITHUB_TOKEN=" + githubPAT("6") + "\n",
		"inside/real.env":                 "GITHUB_TOKEN=" + githubPAT("8") + "\n",
		"empty.txt":                       "",
		"src/name with spaces and : .env": "GITHUB_TOKEN=" + githubPAT("9") + "\n",
	})
	must(t, os.Symlink(filepath.Join(outside, "creds.env"), filepath.Join(e.ws, "link-out.env")))
	must(t, os.Symlink(outside, filepath.Join(e.ws, "linkdir")))
	must(t, os.Symlink("inside/real.env", filepath.Join(e.ws, "link-in.env")))
	must(t, syscall.Mkfifo(filepath.Join(e.ws, "pipe.env"), 0o644))

	opts := e.opts()
	opts.MaxFileSize = 1024
	r, err := Scan(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	got := byFile(r)
	tests := []struct {
		name  string
		key   string
		found bool
	}{
		{"skips .git directories", ".git/config github-pat", false},
		{"skips nested .git directories", "sub/.git/objects/x github-pat", false},
		{"skips .git files", "vendored/.git github-pat", false},
		{"scans files git ignores", ".env github-pat", true},
		{"scans ignored directories", "build/out.txt github-pat", true},
		{"skips gitleaks-allowlisted node_modules", "node_modules/pkg/index.js github-pat", false},
		{"skips binary contents", "bin/tool github-pat", false},
		{"checks binary files by path", "certs/client.p12 pkcs12-file", true},
		{"skips contents of huge files", "big/dump.sql github-pat", false},
		{"skips contents of huge binaries", "big/blob.dat github-pat", false},
		{"scans a symlink's target at its own path", "inside/real.env github-pat", true},
		{"does not follow a symlink in", "link-in.env github-pat", false},
		{"does not follow a symlink out", "link-out.env github-pat", false},
		{"does not follow a directory symlink out", "linkdir/creds.env github-pat", false},
		{"odd file names", "src/name with spaces and : .env github-pat", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := got[tt.key]; ok != tt.found {
				t.Errorf("%s: found %v, want %v; findings:\n%s", tt.key, ok, tt.found, fileList(r))
			}
		})
	}
	for _, s := range r.Secrets() {
		if s == githubPAT("7") {
			t.Errorf("a secret outside the workspace reached Secrets()")
		}
	}
	t.Run("stats", func(t *testing.T) {
		st := r.Stats
		if st.Symlinks != 3 || st.Special != 1 || st.Binary != 3 || st.TooLarge != 1 || st.Empty != 1 || st.Allowlisted == 0 {
			t.Errorf("stats: got %+v, want 3 symlinks, 1 special, 3 binary, 1 too large, 1 empty, some allowlisted", st)
		}
	})
	t.Run("huge text file listed as skipped, huge binary not", func(t *testing.T) {
		if len(r.Skipped) != 1 || r.Skipped[0].Path != "big/dump.sql" || !strings.Contains(r.Skipped[0].Reason, "over the 1024-byte limit") {
			t.Errorf("Skipped: got %+v, want big/dump.sql larger than the limit", r.Skipped)
		}
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestScanUserConfig(t *testing.T) {
	t.Parallel()
	body := "ACME_TOKEN=acme_" + "Zq8Lw3Rt6Yp1Vn4Hs7Kd\n" + "GITHUB_TOKEN=" + githubPAT("1") + "\n" + envPassword(passValue)
	tests := []struct {
		name    string
		toml    string
		want    []string // rule ids expected
		notWant []string
		errIs   error
		errHas  string
	}{
		{name: "no file means defaults", toml: "", want: []string{"github-pat", "generic-api-key"}, notWant: []string{"acme-token"}},
		{name: "new rule extends defaults", toml: `
[[rules]]
id = "acme-token"
description = "ACME token"
regex = '''acme_[A-Za-z0-9]{20}'''
keywords = ["acme_"]
`, want: []string{"acme-token", "github-pat", "generic-api-key"}},
		{name: "disabledRules drops a default", toml: `
[extend]
disabledRules = ["github-pat"]
`, want: []string{"generic-api-key"}, notWant: []string{"github-pat"}},
		{name: "rule allowlist added to a default rule without its regex", toml: `
[[rules]]
id = "generic-api-key"
[[rules.allowlists]]
regexes = ['''^(?:hQ7v|acme_)''']
`, want: []string{"github-pat"}, notWant: []string{"generic-api-key"}},
		{name: "targeted global allowlist on a default rule", toml: `
[[allowlists]]
targetRules = ["github-pat"]
regexes = ['''^ghp_''']
`, want: []string{"generic-api-key"}, notWant: []string{"github-pat"}},
		{name: "bad regex is an error, not a panic", toml: `
[[rules]]
id = "broken"
regex = '''([a-z'''
`, errIs: ErrConfig},
		{name: "extend path is refused", toml: `
[extend]
path = "/etc/other.toml"
`, errIs: ErrConfig, errHas: "not supported"},
		{name: "unknown disabled rule is an error", toml: `
[extend]
disabledRules = ["no-such-rule"]
`, errIs: ErrConfig},
		{name: "not TOML", toml: "[[[", errIs: ErrConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			writeTree(t, e.ws, map[string]string{"app.sh": body})
			opts := e.opts()
			opts.UserConfig = filepath.Join(t.TempDir(), "gitleaks.toml")
			if tt.toml != "" {
				must(t, os.WriteFile(opts.UserConfig, []byte(tt.toml), 0o644))
			}
			r, err := Scan(t.Context(), opts)
			if tt.errIs != nil {
				if !errors.Is(err, tt.errIs) {
					t.Fatalf("Scan: got error %v, want %v", err, tt.errIs)
				}
				if tt.errHas != "" && !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("error %q lacks %q", err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatalf("Scan: %v", err)
			}
			got := byFile(r)
			for _, id := range tt.want {
				if _, ok := got["app.sh "+id]; !ok {
					t.Errorf("no %s finding; findings:\n%s", id, fileList(r))
				}
			}
			for _, id := range tt.notWant {
				if _, ok := got["app.sh "+id]; ok {
					t.Errorf("unexpected %s finding", id)
				}
			}
		})
	}
}

// TestLoadRulesRepeatedly guards against gitleaks' global extend depth:
// with its own extension, the third load in a process drops the defaults.
func TestLoadRulesRepeatedly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range 4 {
		p := filepath.Join(dir, "g"+string(rune('0'+i))+".toml")
		must(t, os.WriteFile(p, []byte("[[rules]]\nid = \"r"+string(rune('0'+i))+"\"\nregex = '''zz"+string(rune('0'+i))+"[0-9]{8}'''\n"), 0o644))
		rs, err := loadRules(p)
		if err != nil {
			t.Fatalf("load %d: %v", i, err)
		}
		if _, ok := rs.cfg.Rules["aws-access-token"]; !ok {
			t.Fatalf("load %d: default rules missing", i)
		}
		if _, ok := rs.cfg.Rules["r"+string(rune('0'+i))]; !ok {
			t.Fatalf("load %d: user rule missing", i)
		}
	}
}

// TestScanParallelMatchesSerial checks that workers sharing one rule set
// find exactly what a single worker finds (run with -race to check the
// sharing itself).
func TestScanParallelMatchesSerial(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	files := map[string]string{}
	for i := range 60 {
		files["d"+string(rune('a'+i%6))+"/f"+string(rune('a'+i%26))+string(rune('a'+i/26))+".env"] =
			"GITHUB_TOKEN=" + githubPAT(string(rune('a'+i%26))) + "\n" + envPassword(passValue) + "x = 1\n"
	}
	writeTree(t, e.ws, files)
	run := func(workers int) []string {
		opts := e.opts()
		opts.CacheDir = ""
		opts.Workers = workers
		r, err := Scan(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		var fps []string
		for _, f := range r.Findings {
			fps = append(fps, f.Fingerprint)
		}
		return fps
	}
	serial, parallel := run(1), run(4)
	if len(serial) != 120 || !slices.Equal(serial, parallel) {
		t.Errorf("serial found %d, parallel %d; want 120 each and equal", len(serial), len(parallel))
	}
}

func TestScanErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file := filepath.Join(e.ws, "f.txt")
	must(t, os.WriteFile(file, []byte("x"), 0o644))
	tests := []struct {
		name  string
		opts  Options
		errIs error
	}{
		{"missing workspace", Options{Workspace: filepath.Join(e.ws, "nope"), ApprovalKeyPath: e.key}, os.ErrNotExist},
		{"workspace is a file", Options{Workspace: file, ApprovalKeyPath: e.key}, ErrNotDirectory},
		{"no key path", Options{Workspace: e.ws}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Scan(t.Context(), tt.opts)
			if err == nil {
				t.Fatal("Scan: no error")
			}
			if tt.errIs != nil && !errors.Is(err, tt.errIs) {
				t.Errorf("Scan: got %v, want %v", err, tt.errIs)
			}
		})
	}
	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := Scan(ctx, e.opts()); err == nil {
			t.Error("Scan with a cancelled context: no error")
		}
	})
}

// TestOwnSourcesClean scans this package's own files: fixtures must be
// built at run time so the project's preflight stays quiet on itself.
func TestOwnSourcesClean(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ws = "."
	r := e.scan(t)
	if len(r.Findings) != 0 {
		t.Errorf("the preflight package holds secret-looking literals:\n%s", fileList(r))
	}
}

// TestScanFileSymlinkRace: a file swapped for a symlink between the walk
// and the read (pointing at a secret outside) is not read.
func TestScanFileSymlinkRace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	outside := filepath.Join(t.TempDir(), "creds.env")
	must(t, os.WriteFile(outside, []byte("GITHUB_TOKEN="+githubPAT("1")+"\n"), 0o644))
	regular := filepath.Join(e.ws, "plain.txt")
	must(t, os.WriteFile(regular, []byte("hello\n"), 0o644))
	fi, err := os.Lstat(regular)
	must(t, err)
	swapped := filepath.Join(e.ws, "swapped.env")
	must(t, os.Symlink(outside, swapped))

	rs, err := loadRules("")
	must(t, err)
	s := &scanner{root: e.ws, rules: rs, maxSize: DefaultMaxFileSize}
	// The walk saw a regular file; by the time it is opened it is a link.
	s.scanFile(t.Context(), s.newDetector(), job{rel: "swapped.env", abs: swapped, d: fs.FileInfoToDirEntry(fi)})
	if len(s.findings) != 0 {
		t.Errorf("read through a symlink: %d findings", len(s.findings))
	}
	if len(s.skipped) != 1 || !strings.Contains(s.skipped[0].Reason, "unreadable") {
		t.Errorf("skipped: got %+v, want swapped.env unreadable", s.skipped)
	}
}

// TestProjectSourcesClean scans every file git tracks in this repository
// (a copy, so the asset cache and build output are not in the way): the
// project's own preflight must stay quiet on itself, whatever package a
// fixture lives in.
func TestProjectSourcesClean(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	e := newEnv(t)
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join("..", rel)
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(src)
		must(t, err)
		dst := filepath.Join(e.ws, rel)
		must(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		must(t, os.WriteFile(dst, data, 0o644))
	}
	r := e.scan(t)
	if len(r.Findings) != 0 {
		t.Errorf("the repository holds secret-looking literals (build fixtures at run time or mark them gitleaks:allow):\n%s", fileList(r))
	}
}
