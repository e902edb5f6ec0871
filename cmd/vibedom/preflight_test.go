package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

const preflightHelperEnv = "VIBEDOM_TEST_PREFLIGHT_ARGS"

// TestPreflightHelperProcess is the vibedom binary for TestPreflightCommand:
// it runs the CLI in a child process, so the exit code, stdout and stdin
// (possibly a pseudo-terminal) are the child's own.
func TestPreflightHelperProcess(t *testing.T) {
	args := os.Getenv(preflightHelperEnv)
	if args == "" {
		t.Skip("helper process for TestPreflightCommand")
	}
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil {
		t.Fatal(err)
	}
	os.Exit(run(context.Background(), append([]string{"vibedom"}, argv...)))
}

func preflightCmd(t *testing.T, home string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestPreflightHelperProcess$")
	argv, _ := json.Marshal(args)
	cmd.Env = append(os.Environ(), preflightHelperEnv+"="+string(argv), "VIBEDOM_HOME="+home)
	return cmd
}

func runPreflightCmd(t *testing.T, home string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := preflightCmd(t, home, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, o.String(), e.String()
}

func TestPreflightCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	clean := t.TempDir()
	os.WriteFile(filepath.Join(clean, "main.go"), []byte("package main\n"), 0o644)
	dirty := t.TempDir()
	token := "ghp" + "_aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA1" // built at run time
	os.WriteFile(filepath.Join(dirty, ".env"), []byte("GITHUB_TOKEN="+token+"\n"), 0o644)

	tests := []struct {
		name      string
		args      []string
		wantCode  int
		stdoutHas string
		stderrHas string
	}{
		{"clean project exits 0", []string{"preflight", clean}, 0, "no secrets need review", ""},
		{"unapproved finding exits 1", []string{"preflight", dirty}, 1, "1. .env:1  github-pat  ghp_…(40 chars)", ""},
		{"json exits 1", []string{"preflight", "--json", dirty}, 1, `"unapproved": 1`, ""},
		{"flags after the path", []string{"preflight", dirty, "--json"}, 1, `"fingerprint": ".env:github-pat:1"`, ""},
		{"no path", []string{"preflight"}, 2, "", "give one project folder"},
		{"missing path", []string{"preflight", filepath.Join(clean, "nope")}, 2, "", "no such file"},
		{"review needs a terminal", []string{"preflight", "--review", dirty}, 2, "", "stdin is not one"},
		{"json and review", []string{"preflight", "--json", "--review", dirty}, 2, "", "exclude each other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runPreflightCmd(t, home, tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit code: got %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, out, errOut)
			}
			if !strings.Contains(out, tt.stdoutHas) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdoutHas, out)
			}
			if !strings.Contains(errOut, tt.stderrHas) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderrHas, errOut)
			}
			if strings.Contains(out+errOut, token) {
				t.Error("the secret was printed")
			}
		})
	}

	t.Run("json is the documented schema", func(t *testing.T) {
		_, out, _ := runPreflightCmd(t, home, "preflight", "--json", dirty)
		var doc struct {
			Version  int `json:"version"`
			Summary  struct{ Unapproved, Total int }
			Findings []struct {
				Fingerprint, File, Rule, Risk, Reason, Status string
				Line, Number                                  int
				SecretRedacted                                string `json:"secret_redacted"`
				SecretLength                                  int    `json:"secret_length"`
			}
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("decode: %v\n%s", err, out)
		}
		if doc.Version != 1 || doc.Summary.Total != 1 || len(doc.Findings) != 1 {
			t.Fatalf("got %+v", doc)
		}
		f := doc.Findings[0]
		if f.File != ".env" || f.Line != 1 || f.Rule != "github-pat" || f.Risk != "MEDIUM" || f.Status != "unapproved" ||
			f.Number != 1 || f.SecretRedacted != "ghp_…(40 chars)" || f.SecretLength != 40 || f.Reason == "" {
			t.Errorf("finding: got %+v", f)
		}
	})

	t.Run("review on a terminal records approvals", func(t *testing.T) {
		ptmx, tty, err := pty.Open()
		if err != nil {
			t.Skipf("no pseudo-terminal: %v", err)
		}
		defer ptmx.Close()
		cmd := preflightCmd(t, home, "preflight", "--review", dirty)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		tty.Close()
		var out bytes.Buffer
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 4096)
			answered := false
			for {
				n, err := ptmx.Read(buf)
				out.Write(buf[:n])
				if !answered && strings.Contains(out.String(), "Choice [c/a/i/x]: ") {
					ptmx.Write([]byte("a\n"))
					answered = true
				}
				if err != nil {
					return
				}
			}
		}()
		werr := make(chan error, 1)
		go func() { werr <- cmd.Wait() }()
		select {
		case err := <-werr:
			if err != nil {
				t.Errorf("review: %v\n%s", err, out.String())
			}
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("review did not finish:\n%s", out.String())
		}
		ptmx.Close()
		<-done
		if !strings.Contains(out.String(), "Approved 1 finding") {
			t.Errorf("output:\n%s", out.String())
		}
		if code, out, _ := runPreflightCmd(t, home, "preflight", dirty); code != 0 {
			t.Errorf("after approving: exit %d, want 0\n%s", code, out)
		}
	})
}
