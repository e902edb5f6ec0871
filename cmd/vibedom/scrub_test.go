package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/keys"
)

// scrubSecret is a workspace .env value, built at run time.
var scrubSecret = strings.Join([]string{"hQ7v", "Zp2LxK9wR4tYq"}, "")

func scrubWorkspace(t *testing.T) string {
	t.Helper()
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, ".env"), []byte("API_KEY="+scrubSecret+"\nAPP_ENV=production\n"), 0o644)
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	os.WriteFile(filepath.Join(ws, ".vibedom", "dlp_allowlist.txt"), []byte("support@corp.io\n"), 0o644)
	return ws
}

// runStdin runs the built vibedom with stdin and returns stdout, stderr
// and the exit code.
func runStdin(t *testing.T, home string, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(clitest.Bin(t), args...)
	cmd.Env = append(os.Environ(), "VIBEDOM_HOME="+home)
	cmd.Stdin = bytes.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestScrubCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	ws := scrubWorkspace(t)
	if _, errOut, code := runStdin(t, home, nil, "policy", "approve", "--yes", ws); code != 0 {
		t.Fatalf("approve the workspace's DLP allowlist: exit %d: %s", code, errOut)
	}
	body := `{"content":"key ` + scrubSecret + ` b64 ` + base64.StdEncoding.EncodeToString([]byte("x="+scrubSecret)) +
		` mail bob@corp.io and support@corp.io, ip 10.0.0.7, home /Users/bob/app"}`

	t.Run("external", func(t *testing.T) {
		out, errOut, code := runStdin(t, home, []byte(body), "scrub", "--dest", "https://api.anthropic.com/v1/messages",
			"--workspace", ws, "--no-preflight", "--content-type", "application/json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if strings.Contains(out, scrubSecret) || !json.Valid([]byte(out)) {
			t.Errorf("output: %s", out)
		}
		for _, w := range []string{"[REDACTED:SECRET]", "[REDACTED:EMAIL]", "support@corp.io", "[REDACTED:INTERNAL_IP]", "/Users/bob/app"} {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q: %s", w, out)
			}
		}
		for _, w := range []string{"api.anthropic.com is external", "from .env:1 API_KEY", "(base64)", "4 redacted (EMAIL, INTERNAL_IP, SECRET)", "exempts 1 values"} {
			if !strings.Contains(errOut, w) {
				t.Errorf("report lacks %q:\n%s", w, errOut)
			}
		}
		if strings.Contains(errOut, scrubSecret) {
			t.Errorf("the report shows the secret:\n%s", errOut)
		}
	})

	t.Run("public json report", func(t *testing.T) {
		out, errOut, code := runStdin(t, home, []byte(body), "scrub", "--dest", "registry.example.net", "--workspace", ws,
			"--no-preflight", "--content-type", "application/json", "--allow-context", "internal_ips", "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var rep struct {
			Dest        string
			Class       string
			KnownValues int `json:"known_values"`
			Redacted    int
			Findings    []map[string]any
		}
		if err := json.Unmarshal([]byte(errOut), &rep); err != nil {
			t.Fatalf("report is not JSON: %v\n%s", err, errOut)
		}
		if rep.Class != "public" || rep.KnownValues != 1 || rep.Redacted != 4 || !strings.Contains(out, "/Users/[REDACTED:HOME_PATH]/app") || !strings.Contains(out, "10.0.0.7") {
			t.Errorf("report %+v\noutput %s", rep, out)
		}
		if strings.Contains(errOut, scrubSecret) {
			t.Errorf("the JSON report shows the secret")
		}
	})

	t.Run("gzip in, gzip out", func(t *testing.T) {
		var gz bytes.Buffer
		w := gzip.NewWriter(&gz)
		w.Write([]byte(body))
		w.Close()
		out, errOut, code := runStdin(t, home, gz.Bytes(), "scrub", "--dest", "api.anthropic.com", "--workspace", ws, "--no-preflight",
			"--content-encoding", "gzip", "--content-type", "application/json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		r, err := gzip.NewReader(strings.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		var plain bytes.Buffer
		plain.ReadFrom(r)
		if strings.Contains(plain.String(), scrubSecret) || !strings.Contains(plain.String(), "[REDACTED:SECRET]") {
			t.Errorf("decoded output: %s", plain.String())
		}
	})

	t.Run("url and headers", func(t *testing.T) {
		u := "https://registry.example.net:8443/v1/" + scrubSecret + "/x?q=" + url.QueryEscape(url.QueryEscape(scrubSecret)) + "&pageToken=CiAKGjBp&mail=bob%40corp.io"
		out, errOut, code := runStdin(t, home, nil, "scrub", "--url", u, "--workspace", ws, "--no-preflight", "--json",
			"--header", "Authorization: Bearer "+scrubSecret, "--header", "X-Note: call +44 20 7946 0958", "--header", "X-"+scrubSecret+": 1")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var rep struct {
			Dest, URL string
			Headers   []string
			Redacted  int
		}
		if err := json.Unmarshal([]byte(errOut), &rep); err != nil {
			t.Fatalf("report is not JSON: %v\n%s", err, errOut)
		}
		if strings.Contains(errOut, scrubSecret) || strings.Contains(out, scrubSecret) {
			t.Errorf("the secret is in the output:\n%s", errOut)
		}
		want := "https://registry.example.net:8443/v1/%5BREDACTED%3ASECRET%5D/x?q=%5BREDACTED%3ASECRET%5D&pageToken=CiAKGjBp&mail=%5BREDACTED%3AEMAIL%5D"
		if rep.Dest != "registry.example.net" || rep.URL != want {
			t.Errorf("url:\ngot  %s\nwant %s", rep.URL, want)
		}
		hs := strings.Join(rep.Headers, "\n")
		for _, w := range []string{"Authorization: Bearer [REDACTED:SECRET]", "X-Note: call [REDACTED:PHONE]", "(dropped: its name holds a value)"} {
			if !strings.Contains(hs, w) {
				t.Errorf("headers lack %q:\n%s", w, hs)
			}
		}
		if rep.Redacted != 6 {
			t.Errorf("redacted %d, want 6: %s", rep.Redacted, errOut)
		}
		_, errOut, _ = runStdin(t, home, nil, "scrub", "--url", u, "--workspace", ws, "--no-preflight")
		if !strings.Contains(errOut, "  url     https://registry.example.net:8443/v1/%5BREDACTED%3ASECRET%5D") {
			t.Errorf("text report:\n%s", errOut)
		}
	})

	// A value in a header the proxy never rewrites refuses the request:
	// exit 1, the header shown refused without its value.
	t.Run("refused", func(t *testing.T) {
		for _, json := range []bool{false, true} {
			args := []string{"scrub", "--dest", "registry.example.net", "--workspace", ws, "--no-preflight",
				"--url", "https://registry.example.net/x", "--header", "Content-Type: text/plain; charset=" + scrubSecret}
			if json {
				args = append(args, "--json")
			}
			_, errOut, code := runStdin(t, home, nil, args...)
			if code != 1 {
				t.Errorf("json=%v: exit %d, want 1 (the proxy refuses): %s", json, code, errOut)
			}
			if strings.Contains(errOut, scrubSecret) || !strings.Contains(errOut, "refused") {
				t.Errorf("json=%v: report:\n%s", json, errOut)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, args := range [][]string{
			{"scrub"},
			{"scrub", "--dest", ""},
			{"scrub", "--dest", "x.example", "--content-encoding", "gzip"},
			{"scrub", "--dest", "x.example", "--allow-context", "everything"},
			{"scrub", "--dest", "x.example", "extra-arg"},
			{"scrub", "--url", "/relative/only"},
			{"scrub", "--dest", "x.example", "--header", "no colon"},
		} {
			_, errOut, code := runStdin(t, home, []byte("plain "+scrubSecret), args...)
			if code != 2 || strings.Contains(errOut, scrubSecret) {
				t.Errorf("%v: exit %d, stderr %s", args, code, errOut)
			}
		}
	})
}

func TestLogsCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "keys"), 0o700)
	k, _, err := keys.EnsureAuditKey(filepath.Join(home, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(home, "logs", "session-20261123-100000")
	os.MkdirAll(logDir, 0o700)
	os.MkdirAll(filepath.Join(home, "sessions", "app-1a2b"), 0o700)
	state := `{"name":"app-1a2b","workspace":"/tmp/app","created":"2026-11-23T10:00:00Z","status":"stopped","log_dir":"` + logDir + `"}`
	os.WriteFile(filepath.Join(home, "sessions", "app-1a2b", "state.json"), []byte(state), 0o600)
	os.WriteFile(filepath.Join(logDir, "session.log"), []byte("level=INFO msg=hello\n"), 0o600)
	os.WriteFile(filepath.Join(logDir, "alerts.jsonl"), []byte(`{"time":"2026-11-23T10:00:01Z","kind":"request","name":"api.anthropic.com","port":443,"method":"POST","url":"https://api.anthropic.com/v1","decision":"scrub","reason":"redacted: SECRET","findings":[{"category":"SECRET","prefix":"hQ7v","length":17,"where":"body","action":"redact","source":".env:1 API_KEY"}]}`+"\n"), 0o600)
	a, err := dlp.CreateAuditLog(filepath.Join(logDir, dlp.AuditFile), k.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	a.Record(dlp.AuditRecord{Dest: "api.anthropic.com:443", Method: "POST", URL: "https://api.anthropic.com/v1", Category: "SECRET", Action: "redact", Where: "body", Value: scrubSecret, Source: ".env:1 API_KEY"})
	a.Close()

	out, _, code := runStdin(t, home, nil, "logs")
	if code != 0 || out != "level=INFO msg=hello\n" {
		t.Errorf("logs: %d %q", code, out)
	}
	out, _, code = runStdin(t, home, nil, "logs", "app-1a2b", "--alerts")
	if code != 0 || !strings.Contains(out, "scrub  request api.anthropic.com:443 POST https://api.anthropic.com/v1") || !strings.Contains(out, "redact SECRET in body, 17 chars, from .env:1 API_KEY") {
		t.Errorf("alerts: %d\n%s", code, out)
	}
	out, errOut, code := runStdin(t, home, nil, "logs", "--decrypt")
	if code != 0 || !strings.Contains(out, scrubSecret) || !strings.Contains(errOut, "original values") {
		t.Errorf("decrypt: %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = runStdin(t, home, nil, "logs", logDir, "--decrypt", "--json")
	var rec dlp.AuditRecord
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec.Value != scrubSecret || rec.Dest != "api.anthropic.com:443" {
		t.Errorf("decrypt --json: %d %s", code, out)
	}
	out, _, _ = runStdin(t, home, nil, "logs", "--path")
	if strings.TrimSpace(out) != logDir {
		t.Errorf("--path: %s", out)
	}
	// Another home's key cannot decrypt it; the error says so.
	other := t.TempDir()
	keys.EnsureAuditKey(filepath.Join(other, "keys"))
	_, errOut, code = runStdin(t, other, nil, "logs", logDir, "--decrypt")
	if code != 2 || !strings.Contains(errOut, "another key") {
		t.Errorf("wrong key: %d %s", code, errOut)
	}
	_, errOut, code = runStdin(t, home, nil, "logs", "no-such-session")
	if code != 2 || !strings.Contains(errOut, "vibedom list") {
		t.Errorf("unknown session: %d %s", code, errOut)
	}
}

func TestListCommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	out, _, code := runStdin(t, home, nil, "list")
	if code != 0 || !strings.Contains(out, "no sessions yet") {
		t.Errorf("empty list: %d %q", code, out)
	}
	mk := func(name, status string, pid int, created string, patch bool) {
		dir := filepath.Join(home, "sessions", name)
		os.MkdirAll(dir, 0o700)
		st := map[string]any{"name": name, "workspace": "/tmp/" + name, "created": created, "status": status, "pid": pid, "log_dir": "/tmp/logs/" + name}
		b, _ := json.Marshal(st)
		os.WriteFile(filepath.Join(dir, "state.json"), b, 0o600)
		if patch {
			os.WriteFile(filepath.Join(dir, "changes.patch"), []byte("diff"), 0o600)
		}
	}
	mk("old-1111", "stopped", 0, "2026-11-20T10:00:00Z", true)
	mk("live-2222", "running", os.Getpid(), "2026-11-22T10:00:00Z", false)
	mk("dead-3333", "running", 1<<22+12345, "2026-11-21T10:00:00Z", false)
	out, _, code = runStdin(t, home, nil, "list", "--json")
	var rows []struct {
		Name, Status string
		Patch        bool `json:"patch_pending"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 3 {
		t.Fatalf("list --json: %d %s", code, out)
	}
	got := fmt.Sprint(rows)
	if got != "[{live-2222 running false} {dead-3333 crashed false} {old-1111 stopped true}]" {
		t.Errorf("rows: %s", got)
	}
	out, _, _ = runStdin(t, home, nil, "list")
	if !strings.Contains(out, "NAME") || !strings.Contains(out, "dead-3333  crashed") {
		t.Errorf("table:\n%s", out)
	}
}
