package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the module root, seen from this package's directory.
const repoRoot = "../.."

func TestRun(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		// wantOut are substrings each expected in stdout; nil means stdout
		// must be empty.
		wantOut []string
		notOut  []string // substrings stdout must not hold
	}{
		{
			name:     "real vz backend passes",
			args:     []string{"./vm/vz"},
			wantCode: 0,
		},
		{
			name:     "wrong vz calls fail",
			args:     []string{"./tools/check-darwin/testdata/badvz"},
			wantCode: 1,
			wantOut: []string{
				filepath.FromSlash("tools/check-darwin/testdata/badvz/badvz.go") + ":13:37: cannot use 42",
				"vz.NewSharedDirectory",
				filepath.FromSlash("tools/check-darwin/testdata/badvz/badvz.go") + ":17:11: m.StartMachine undefined",
				filepath.FromSlash("tools/check-darwin/testdata/badvz/badvz_test.go") + ":13:53: too many arguments in call to vz.NewVirtioSocketDeviceConfiguration",
			},
		},
		{
			name:     "test files skipped when asked",
			args:     []string{"-test=false", "./tools/check-darwin/testdata/badvz"},
			wantCode: 1,
			wantOut:  []string{"StartMachine", "NewSharedDirectory"},
			notOut:   []string{"badvz_test.go"},
		},
		{
			name:     "missing package fails",
			args:     []string{"./tools/check-darwin/testdata/no-such-package"},
			wantCode: 1,
			wantOut:  []string{"no-such-package", "not found"},
		},
		{
			name:     "unknown flag is a usage error",
			args:     []string{"-no-such-flag"},
			wantCode: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), repoRoot, tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code: got %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, &stdout, &stderr)
			}
			out := stdout.String()
			if tt.wantOut == nil && out != "" {
				t.Errorf("stdout: got %q, want nothing", out)
			}
			for _, want := range tt.wantOut {
				if !strings.Contains(out, want) {
					t.Errorf("stdout does not name %q:\n%s", want, out)
				}
			}
			for _, bad := range tt.notOut {
				if strings.Contains(out, bad) {
					t.Errorf("stdout names %q:\n%s", bad, out)
				}
			}
		})
	}
}

// TestRunReportsEachErrorOnce guards against a diagnostic printed twice, as
// a file checked both in its package and in the package's test variant
// would otherwise be.
func TestRunReportsEachErrorOnce(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), repoRoot, []string{"./tools/check-darwin/testdata/badvz", "./vm/vz"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit code: got %d, want 1\nstderr:\n%s", code, &stderr)
	}
	var lines []string // one per error; continuation lines start with a tab
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !strings.HasPrefix(l, "\t") {
			lines = append(lines, l)
		}
	}
	if got, want := len(lines), 3; got != want {
		t.Errorf("error lines: got %d, want %d:\n%s", got, want, &stdout)
	}
	for _, l := range lines {
		if !strings.Contains(l, "badvz") {
			t.Errorf("error outside the broken package: %s", l)
		}
	}
}

func TestRelPath(t *testing.T) {
	tests := []struct {
		name, wd, file, want string
	}{
		{"below", "/repo", "/repo/vm/vz/vz.go", filepath.FromSlash("vm/vz/vz.go")},
		{"outside", "/repo", "/elsewhere/x.go", "/elsewhere/x.go"},
		{"sibling with common prefix", "/repo", "/repository/x.go", "/repository/x.go"},
		{"already relative", "/repo", "x.go", "x.go"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := relPath(filepath.FromSlash(tt.wd), filepath.FromSlash(tt.file)); got != filepath.FromSlash(tt.want) {
				t.Errorf("relPath(%q, %q): got %q, want %q", tt.wd, tt.file, got, tt.want)
			}
		})
	}
}

// TestListSeesDarwinFiles makes sure the listing is really darwin's: vm/vz
// imports vz only from its darwin/arm64 files, so a pass on ./vm/vz means
// those files were checked.
func TestListSeesDarwinFiles(t *testing.T) {
	pkgs, err := goList(t.Context(), repoRoot, []string{"./vm/vz"}, false)
	if err != nil {
		t.Fatal(err)
	}
	const vzPath = "github.com/Code-Hex/vz/v3"
	for _, p := range pkgs {
		if p.ImportPath != "github.com/vibedom/vibedom/vm/vz" {
			continue
		}
		for _, imp := range p.Imports {
			if imp == vzPath {
				return
			}
		}
		t.Fatalf("vm/vz imports %v for %s/%s, want %s among them", p.Imports, targetOS, targetArch, vzPath)
	}
	t.Fatalf("vm/vz is not in the go list output")
}
