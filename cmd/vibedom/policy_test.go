package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// runPolicy runs the CLI with args and returns its exit code and stdout.
func runPolicy(t *testing.T, args ...string) (int, string) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = f
	code := run(t.Context(), append([]string{"vibedom", "policy", "check"}, args...))
	os.Stdout = old
	f.Close()
	data, _ := os.ReadFile(f.Name())
	return code, string(data)
}

func TestPolicyCheck(t *testing.T) {
	root := t.TempDir()
	home, ws := filepath.Join(root, "home"), filepath.Join(root, "ws")
	os.MkdirAll(home, 0o700)
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	os.WriteFile(filepath.Join(home, "trusted_domains.txt"), []byte("# mine\n*.user.example\nxn--bcher-kva.example\n"), 0o644)
	os.WriteFile(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), []byte("!blocked.user.example\n"), 0o644)
	t.Setenv("VIBEDOM_HOME", home)

	tests := []struct {
		name     string
		args     []string
		code     int
		wantOut  []string
		denyText []string
	}{
		{"builtin", []string{"api.anthropic.com"}, 0, []string{"allow  api.anthropic.com:443", "rule    api.anthropic.com:443", "source  builtin"}, nil},
		{"builtin is https only", []string{"api.anthropic.com:80"}, 1, []string{"deny   api.anthropic.com:80", "other ports only"}, nil},
		{"unknown", []string{"evil.example"}, 1, []string{"deny   evil.example:443", "no rule allows this name"}, []string{"rule    "}},
		{"https url", []string{"https://API.OpenAI.com/v1/chat?x=1"}, 0, []string{"allow  api.openai.com:443"}, nil},
		{"http url means port 80", []string{"http://api.openai.com/"}, 1, []string{"api.openai.com:80"}, nil},
		{"user wildcard", []string{"a.b.user.example"}, 0, []string{"*.user.example", "trusted_domains.txt:2"}, nil},
		{"user wildcard apex", []string{"user.example"}, 1, nil, nil},
		{"workspace deny", []string{"--workspace", ws, "blocked.user.example"}, 1, []string{"!blocked.user.example", filepath.Join(".vibedom", "trusted_domains.txt") + ":1"}, nil},
		{"workspace deny not in other workspace", []string{"--workspace", root, "blocked.user.example"}, 0, nil, nil},
		{"allow flag", []string{"--allow", "db.example:5432", "db.example:5432"}, 0, []string{"source  --allow"}, nil},
		{"allow flag after the target", []string{"db.example:5432", "--allow", "db.example:5432"}, 0, nil, nil},
		{"idn", []string{"bücher.example"}, 0, []string{"allow  xn--bcher-kva.example:443"}, nil},
		{"ip literal", []string{"[2001:db8::1]:443"}, 1, []string{"[2001:db8::1]:443", "no rule names this IP"}, nil},
		{"bare ipv6", []string{"--allow", "2001:db8::1", "2001:db8::1"}, 0, nil, nil},
		{"bad port", []string{"example.com:99999"}, 2, nil, nil},
		{"malformed allow flag", []string{"--allow", "https://x.example", "x.example"}, 2, nil, nil},
		{"no target", nil, 2, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runPolicy(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit: got %d, want %d; output:\n%s", code, tt.code, out)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tt.denyText {
				if strings.Contains(out, w) {
					t.Errorf("output has %q:\n%s", w, out)
				}
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		code, out := runPolicy(t, "--json", "x.user.example:80")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, out)
		}
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		want := map[string]any{"input": "x.user.example:80", "name": "x.user.example", "port": 80.0, "allow": true,
			"rule": "*.user.example", "source": filepath.Join(home, "trusted_domains.txt") + ":2"}
		for k, v := range want {
			if got[k] != v && !(k == "source" && strings.HasSuffix(got[k].(string), "trusted_domains.txt:2")) {
				t.Errorf("%s: got %v, want %v", k, got[k], v)
			}
		}
	})

	t.Run("malformed user file", func(t *testing.T) {
		os.WriteFile(filepath.Join(home, "trusted_domains.txt"), []byte("ok.example\n*.com\n"), 0o644)
		if code, out := runPolicy(t, "ok.example"); code != 2 {
			t.Errorf("exit: got %d, want 2 (the policy does not load); output:\n%s", code, out)
		}
	})
}

func TestParseCheckTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		host string
		port uint16
		err  bool
	}{
		{"example.com", "example.com", 443, false},
		{"example.com:22", "example.com", 22, false},
		{"https://example.com/x", "example.com", 443, false},
		{"http://example.com:8080/x", "example.com", 8080, false},
		{"wss://example.com", "example.com", 443, false},
		{"ws://example.com", "example.com", 80, false},
		{"ftp://example.com", "", 0, true},
		{"ftp://example.com:21", "example.com", 21, false},
		{"[::1]:80", "::1", 80, false},
		{"[::1]", "::1", 443, false},
		{"::1", "::1", 443, false},
		{"example.com:0", "", 0, true},
		{"example.com:x", "", 0, true},
		{"https://", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			h, p, err := parseCheckTarget(tt.in)
			if (err != nil) != tt.err || h != tt.host || p != tt.port {
				t.Errorf("parseCheckTarget(%q): got %q %d %v, want %q %d error %v", tt.in, h, p, err, tt.host, tt.port, tt.err)
			}
		})
	}
}

// TestPolicyApprove drives the workspace-approval flow as a user would: a
// cloned repository's allow rules are ignored (with a note) until
// `vibedom policy approve`, its deny rules apply at once, and a changed
// file is unapproved again.
func TestPolicyApprove(t *testing.T) {
	t.Parallel()
	home, ws := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	rules := filepath.Join(ws, ".vibedom", "trusted_domains.txt")
	os.WriteFile(rules, []byte("exfil.example\n*.drop.example:*\n!api.openai.com\n"), 0o644)
	cli := func(wantCode int, args ...string) (string, string) {
		t.Helper()
		out, errOut, code := runStdin(t, home, nil, args...)
		if code != wantCode {
			t.Fatalf("vibedom %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, wantCode, out, errOut)
		}
		return out, errOut
	}

	out, _ := cli(1, "policy", "check", "--workspace", ws, "exfil.example")
	for _, w := range []string{"deny   exfil.example:443", "ignored 2 allow rules of .vibedom/trusted_domains.txt (not approved)", "vibedom policy approve " + ws} {
		if !strings.Contains(out, w) {
			t.Errorf("check before approval lacks %q:\n%s", w, out)
		}
	}
	cli(1, "policy", "check", "--workspace", ws, "api.openai.com") // the deny rule needs no approval
	out, _ = cli(1, "policy", "status", ws)
	if !strings.Contains(out, "unapproved") || !strings.Contains(out, "allows  *.drop.example:*") || !strings.Contains(out, "denies  !api.openai.com") {
		t.Errorf("status before approval:\n%s", out)
	}
	_, errOut := cli(2, "policy", "approve", ws) // stdin is not a terminal
	if !strings.Contains(errOut, "--yes") {
		t.Errorf("approve without a terminal: %s", errOut)
	}

	cli(0, "policy", "approve", "--yes", ws)
	out, _ = cli(0, "policy", "check", "--json", "--workspace", ws, "a.drop.example:22")
	var res policyCheckResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || !res.Allow || res.Ignored != 0 {
		t.Errorf("check after approval: %v %+v", err, res)
	}
	cli(1, "policy", "check", "--workspace", ws, "api.openai.com")
	out, _ = cli(0, "policy", "status", "--json", ws)
	var st struct {
		Files []struct{ File, State, SHA256 string }
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Files) != 2 || st.Files[0].State != "approved" || st.Files[1].State != "none" {
		t.Errorf("status after approval: %v %s", err, out)
	}
	if data, _ := os.ReadDir(filepath.Join(ws, ".vibedom")); len(data) != 1 {
		t.Errorf("approval wrote into the workspace: %v", data)
	}

	// The same file elsewhere is not approved: approvals are per workspace.
	other := t.TempDir()
	os.MkdirAll(filepath.Join(other, ".vibedom"), 0o755)
	copyFile(t, rules, filepath.Join(other, ".vibedom", "trusted_domains.txt"))
	cli(1, "policy", "check", "--workspace", other, "exfil.example")

	// A change (one more allow rule) is asked about again.
	os.WriteFile(rules, []byte("exfil.example\n*.drop.example:*\n!api.openai.com\nmore.example\n"), 0o644)
	out, _ = cli(1, "policy", "check", "--workspace", ws, "exfil.example")
	if !strings.Contains(out, "ignored 3 allow rules") || !strings.Contains(out, "changed since approved") {
		t.Errorf("check after a change:\n%s", out)
	}
	out, _ = cli(1, "policy", "status", ws)
	if !strings.Contains(out, "changed") {
		t.Errorf("status after a change:\n%s", out)
	}
}

// TestPolicyHostileWorkspaceFiles: files a hostile repository can plant are
// refused with an error that names them, print no raw control character,
// and widen nothing.
func TestPolicyHostileWorkspaceFiles(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	elsewhere := filepath.Join(t.TempDir(), "rules.txt")
	os.WriteFile(elsewhere, []byte("exfil.example\n"), 0o644)
	tests := []struct {
		name  string
		setup func(ws string)
		want  string
	}{
		{"control characters", func(ws string) {
			os.WriteFile(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), []byte("exfil.example\x1b[2J\x1b[H\n"), 0o644)
		}, "control character"},
		{"huge", func(ws string) {
			os.WriteFile(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), bytes.Repeat([]byte("exfil.example\n"), 100_000), 0o644)
		}, "larger than"},
		{"symlinked file", func(ws string) {
			os.Symlink(elsewhere, filepath.Join(ws, ".vibedom", "trusted_domains.txt"))
		}, "symlink"},
		{"symlinked folder", func(ws string) {
			os.Remove(filepath.Join(ws, ".vibedom"))
			os.Symlink(filepath.Dir(elsewhere), filepath.Join(ws, ".vibedom"))
			os.Rename(elsewhere, filepath.Join(filepath.Dir(elsewhere), "trusted_domains.txt"))
		}, "symlink"},
		{"fifo", func(ws string) {
			syscall.Mkfifo(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), 0o644)
		}, "not a regular file"},
		{"symlinked DLP allowlist", func(ws string) {
			os.Symlink(elsewhere, filepath.Join(ws, ".vibedom", "dlp_allowlist.txt"))
		}, "symlink"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := t.TempDir()
			os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
			tt.setup(ws)
			for _, args := range [][]string{
				{"policy", "check", "--workspace", ws, "exfil.example"},
				{"policy", "status", ws},
				{"policy", "approve", "--yes", ws},
			} {
				out, errOut, code := runStdin(t, home, nil, args...)
				if code != 2 || !strings.Contains(errOut, tt.want) {
					t.Errorf("vibedom %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, errOut, tt.want)
				}
				if strings.ContainsAny(out+errOut, "\x1b\x07") {
					t.Errorf("vibedom %s printed a raw control character: %q", strings.Join(args, " "), out+errOut)
				}
			}
		})
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyApproveOnTerminal: approve shows what each file allows (an
// allowlist value that would drive the terminal is shown quoted) and asks;
// "n" changes nothing, "y" approves.
func TestPolicyApproveOnTerminal(t *testing.T) {
	t.Parallel()
	home, ws := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	os.WriteFile(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), []byte("exfil.example\n"), 0o644)
	os.WriteFile(filepath.Join(ws, ".vibedom", "dlp_allowlist.txt"), []byte("Pearl\x1b[2J\u202eSt\n"), 0o644)
	env := append(os.Environ(), "VIBEDOM_HOME="+home)
	approve := func(answer string) (int, string) {
		cmd := exec.Command(clitest.Bin(t), "policy", "approve", ws)
		cmd.Env = env
		tr := startOnTerminal(t, cmd)
		tr.expect("allows  exfil.example")
		tr.expect(`allows  "Pearl\x1b[2J\u202eSt"`)
		tr.expect("[y/N]")
		tr.typeText(answer + "\r")
		return tr.wait(), tr.output()
	}
	if code, out := approve("n"); code != 1 || !strings.Contains(out, "not approved") {
		t.Fatalf("answer n: exit %d\n%s", code, out)
	}
	if _, _, code := runStdin(t, home, nil, "policy", "status", ws); code != 1 {
		t.Fatalf("status after answering n: exit %d, want 1 (unapproved)", code)
	}
	code, out := approve("y")
	if code != 0 || !strings.Contains(out, "approved .vibedom/trusted_domains.txt") || !strings.Contains(out, "approved .vibedom/dlp_allowlist.txt") {
		t.Fatalf("answer y: exit %d\n%s", code, out)
	}
	if strings.ContainsAny(out, "\x1b\u202e") {
		t.Errorf("approve printed a raw control character: %q", out)
	}
	if out, _, code := runStdin(t, home, nil, "policy", "check", "--workspace", ws, "exfil.example"); code != 0 {
		t.Errorf("check after approval: exit %d\n%s", code, out)
	}
}
