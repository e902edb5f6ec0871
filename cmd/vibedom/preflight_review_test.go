package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// The tests here drive the built vibedom binary as a user does: on a
// pseudo-terminal that is its controlling terminal (so Ctrl-C and Ctrl-D
// behave as they do in a shell), or with plain pipes. `vibedom run` gets a
// fake QEMU and fake guest assets: every preflight outcome is decided
// before either is used, and the fake QEMU records any call.

// Secret-looking values are built at run time, so this file holds none.
func cliAWSKey() string { return "AKIA" + "Z7QH2LXK4MN3PW5R" }
func cliPAT(last string) string {
	return "ghp" + "_aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xY2zA" + last
}

const cliPass = "hQ7vR2mZ9xL4pK8wT3"

// reviewWorkspace has four findings, numbered in the prompt:
// 1 src/aws.py (HIGH), 2 .env and 3 app.env (MEDIUM), 4 .env.local (LOW);
// plus a secret in a host name (where a careless reason would echo it),
// ignored by .gitleaksignore. It returns the workspace and every secret in
// it.
func reviewWorkspace(t *testing.T) (string, []string) {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "app")
	files := map[string]string{
		"src/aws.py":       "key = '" + cliAWSKey() + "'\n",
		".env":             "DB_PASS" + "WORD=" + cliPass + "\n",
		"app.env":          "GITHUB_TOKEN=" + cliPAT("1") + "\n",
		".env.local":       "DB_PASS" + "WORD=" + cliPass + "x\n",
		"scripts/svc.sh":   "export SVC_URL=https://" + cliPAT("5") + ".localhost/api\n",
		".gitleaksignore":  "scripts/svc.sh:github-pat:1\n",
		"docs/README.md":   "# app\n",
		"src/main.py":      "print('hello')\n",
		"src/util/lib.py":  "def f():\n    return 1\n",
		"config/empty.txt": "",
	}
	for p, body := range files {
		fp := filepath.Join(ws, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(fp), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ws, []string{cliAWSKey(), cliPass, cliPass + "x", cliPAT("1"), cliPAT("5")}
}

// secretIn returns the piece of one of secrets that s holds: a secret in
// any case, or 8 characters past the 4-character prefix redaction may show.
func secretIn(s string, secrets []string) string {
	for _, sec := range secrets {
		for _, p := range []string{sec, strings.ToLower(sec), sec[4:12], sec[len(sec)-8:]} {
			if strings.Contains(s, p) {
				return p
			}
		}
	}
	return ""
}

// fakeVM returns environment variables that let `vibedom run` get past its
// checks for QEMU and guest assets without either: a QEMU that records its
// calls in the returned file and fails, and empty assets (the image step
// fails on them, after the preflight and the session's log folder).
func fakeVM(t *testing.T) (env []string, qemuCalls string) {
	t.Helper()
	dir := t.TempDir()
	qemuCalls = filepath.Join(dir, "qemu-calls")
	qemu := filepath.Join(dir, "qemu")
	script := "#!/bin/sh\necho \"$@\" >> '" + qemuCalls + "'\nexit 1\n"
	if err := os.WriteFile(qemu, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	arch := runtime.GOARCH
	if err := os.MkdirAll(filepath.Join(dir, "assets", arch, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(dir, "assets", arch, "busybox"), filepath.Join(dir, "guest")} {
		if err := os.WriteFile(f, []byte("fake"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return []string{
		"VIBEDOM_QEMU_X86_64=" + qemu, "VIBEDOM_QEMU_AARCH64=" + qemu,
		"VIBEDOM_ASSETS=" + filepath.Join(dir, "assets"), "VIBEDOM_GUEST_BIN=" + filepath.Join(dir, "guest"),
	}, qemuCalls
}

// newPreflightCLI is newCLI without the shared image cache: nothing here
// may touch an image.
func newPreflightCLI(t *testing.T) *clitest.CLI {
	t.Helper()
	c := &clitest.CLI{Home: t.TempDir(), Tmp: t.TempDir()}
	c.Env = append(os.Environ(), "VIBEDOM_HOME="+c.Home, "TMPDIR="+c.Tmp, "NO_COLOR=1")
	return c
}

// terminalRun is the vibedom binary running on a pseudo-terminal.
type terminalRun struct {
	t    *testing.T
	ptmx *os.File
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	seen int
	read chan struct{} // closed when the terminal has nothing more to say
	exit chan error
}

func startOnTerminal(t *testing.T, cmd *exec.Cmd) *terminalRun {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200})
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	tr := &terminalRun{t: t, ptmx: ptmx, cmd: cmd, read: make(chan struct{}), exit: make(chan error, 1)}
	go func() {
		defer close(tr.read)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			tr.mu.Lock()
			tr.out.Write(buf[:n])
			tr.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() { tr.exit <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		ptmx.Close()
	})
	return tr
}

func (tr *terminalRun) output() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.out.String()
}

// expect waits until s appears in what the terminal showed since the last
// expect.
func (tr *terminalRun) expect(s string) {
	tr.t.Helper()
	found := func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		i := strings.Index(tr.out.String()[tr.seen:], s)
		if i >= 0 {
			tr.seen += i + len(s)
		}
		return i >= 0
	}
	deadline := time.After(30 * time.Second)
	for !found() {
		select {
		case <-tr.read:
			if found() { // the last output came with the close
				return
			}
			tr.t.Fatalf("the terminal closed without showing %q; it showed:\n%s", s, tr.output())
		case <-deadline:
			tr.t.Fatalf("the terminal never showed %q; it showed:\n%s", s, tr.output())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// typeText writes s as keystrokes.
func (tr *terminalRun) typeText(s string) {
	tr.t.Helper()
	if _, err := tr.ptmx.Write([]byte(s)); err != nil {
		tr.t.Fatalf("type %q: %v", s, err)
	}
}

// wait returns the exit code once the program ended and its output was read.
func (tr *terminalRun) wait() int {
	tr.t.Helper()
	var err error
	select {
	case err = <-tr.exit:
	case <-time.After(60 * time.Second):
		tr.t.Fatalf("vibedom did not exit; the terminal showed:\n%s", tr.output())
	}
	select {
	case <-tr.read:
	case <-time.After(10 * time.Second):
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	tr.t.Fatalf("wait: %v", err)
	return -1
}

// scanJSON runs `vibedom preflight --json ws` and returns the report.
type cliReport struct {
	Summary struct {
		Unapproved int `json:"unapproved"`
		Approved   int `json:"approved"`
	} `json:"summary"`
	Findings []struct {
		Number      int    `json:"number"`
		Fingerprint string `json:"fingerprint"`
		Status      string `json:"status"`
		Risk        string `json:"risk"`
	} `json:"findings"`
}

func scanJSON(t *testing.T, c *clitest.CLI, ws string) cliReport {
	t.Helper()
	stdout, stderr, code := c.Run(t, "", "preflight", "--json", ws)
	if code != 0 && code != 1 {
		t.Fatalf("preflight --json: exit %d\n%s", code, stderr)
	}
	var r cliReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("preflight --json: %v\n%s", err, stdout)
	}
	return r
}

// numbered maps prompt numbers to fingerprints.
func (r cliReport) numbered() map[int]string {
	m := map[int]string{}
	for _, f := range r.Findings {
		if f.Number > 0 {
			m[f.Number] = f.Fingerprint
		}
	}
	return m
}

func (r cliReport) approved() []string {
	var out []string
	for _, f := range r.Findings {
		if f.Status == "approved" {
			out = append(out, f.Fingerprint)
		}
	}
	slices.Sort(out)
	return out
}

func fingerprintsOf(m map[int]string, nums []int) []string {
	var out []string
	for _, n := range nums {
		out = append(out, m[n])
	}
	slices.Sort(out)
	return out
}

// step waits for the terminal to show expect, then types typed.
type step struct{ expect, typed string }

const (
	menuPrompt  = "Choice [c/a/i/x]: "
	itemsPrompt = "Items to approve"
	ctrlC       = "\x03"
	ctrlD       = "\x04"
)

// badSelections are answers to "Items to approve" that must be refused and
// asked again, each with what the refusal says.
var badSelections = []step{
	{"from 1 to 4", "0\n"},
	{"from 1 to 4", "5\n"},
	{"from 1 to 4", "-1\n"},
	{"from 1 to 4", "abc\n"},
	{"from 1 to 4", "1x\n"},
	{"backwards", "3-2\n"},
	{"range of item numbers", "1-9\n"},
	{"from 1 to 4", "99999999999999999999\n"},
	{"from 1 to 4", "1,,x\n"},
	{"from 1 to 4", "\uff11\n"}, // a full-width digit one
	{"no item numbers", ", ,\n"},
}

// TestPreflightReviewOnTerminal drives `vibedom preflight --review` on a
// pseudo-terminal through every answer, and checks what a fresh scan then
// finds approved: exactly the items chosen, never one more.
func TestPreflightReviewOnTerminal(t *testing.T) {
	t.Parallel()
	var pickWithBadInput []step
	pickWithBadInput = append(pickWithBadInput, step{menuPrompt, "i\n"}, step{itemsPrompt, ""})
	for _, b := range badSelections {
		pickWithBadInput = append(pickWithBadInput, step{"", b.typed}, step{b.expect, ""}, step{itemsPrompt, ""})
	}
	pickWithBadInput = append(pickWithBadInput, step{"", "2\n"}, step{"Approved 1 finding(s) for this workspace; 3 will be asked again", ""})

	tests := []struct {
		name     string
		dialogue []step
		wantCode int
		approved []int // prompt numbers approved afterwards
	}{
		{"c continues and records nothing", []step{{menuPrompt, "c\n"}, {"shown again next time", ""}}, 1, nil},
		{"a approves all", []step{{menuPrompt, "a\n"}, {"Approved 4 finding(s)", ""}}, 0, []int{1, 2, 3, 4}},
		{"i approves a list and a range", []step{{menuPrompt, "i\n"}, {itemsPrompt, "1,3-4\n"},
			{"Approved 3 finding(s) for this workspace; 1 will be asked again", ""}}, 1, []int{1, 3, 4}},
		{"i asks again on every bad answer, then approves only the good one", pickWithBadInput, 1, []int{2}},
		{"i with an empty answer goes back to the menu", []step{{menuPrompt, "i\n"}, {itemsPrompt, "\n"},
			{"[x] Cancel", ""}, {menuPrompt, "x\n"}, {"Cancelled; nothing was started.", ""}}, 1, nil},
		{"anything else at the menu asks again", []step{{menuPrompt, "yes\n"}, {"Please answer c, a, i or x.", ""},
			{menuPrompt, "\x1b[A\n"}, {"Please answer", ""}, {menuPrompt, "ax\n"}, {"Please answer", ""},
			{menuPrompt, "\n"}, {"Please answer", ""}, {menuPrompt, "1\n"}, {"Please answer", ""},
			{menuPrompt, "x\n"}, {"Cancelled", ""}}, 1, nil},
		{"x cancels", []step{{menuPrompt, "x\n"}, {"Cancelled; nothing was started.", ""}}, 1, nil},
		{"Ctrl-D at the menu cancels", []step{{menuPrompt, ctrlD}, {"End of input; cancelled", ""}}, 1, nil},
		{"Ctrl-D while picking cancels", []step{{menuPrompt, "i\n"}, {itemsPrompt, ctrlD}, {"End of input; cancelled", ""}}, 1, nil},
		{"Ctrl-C cancels", []step{{menuPrompt, ctrlC}, {"Interrupted; nothing was started.", ""}}, 2, nil},
		{"Ctrl-C while picking cancels", []step{{menuPrompt, "i\n"}, {itemsPrompt, "1"}, {"1", ctrlC}, {"Interrupted", ""}}, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newPreflightCLI(t)
			ws, secrets := reviewWorkspace(t)
			before := scanJSON(t, c, ws)
			nums := before.numbered()
			if len(nums) != 4 || before.Findings[0].Risk != "HIGH" {
				t.Fatalf("setup: want 4 numbered findings, HIGH first: %+v", before)
			}

			tr := startOnTerminal(t, c.Command(t, nil, "preflight", "--review", ws))
			tr.expect("HIGH RISK")
			tr.expect("1. src/aws.py:1  aws-access-token  AKIA…(20 chars)")
			tr.expect("4. .env.local:1")
			for _, st := range tt.dialogue {
				if st.expect != "" {
					tr.expect(st.expect)
				}
				if st.typed != "" {
					tr.typeText(st.typed)
				}
			}
			code := tr.wait()
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d; the terminal showed:\n%s", code, tt.wantCode, tr.output())
			}
			if p := secretIn(tr.output(), secrets); p != "" {
				t.Errorf("the terminal showed a secret (%q):\n%s", p, tr.output())
			}
			after := scanJSON(t, c, ws)
			if got, want := after.approved(), fingerprintsOf(nums, tt.approved); !slices.Equal(got, want) {
				t.Errorf("approved afterwards: %q, want %q", got, want)
			}
		})
	}
}

// TestRunPreflight drives the preflight of `vibedom run` in every mode: it
// must decide before anything of the VM is touched, refuse in strict mode
// with a way forward, never wait without a terminal, and leave the
// session's gitleaks_report.json (redacted) when the session goes ahead.
func TestRunPreflight(t *testing.T) {
	t.Parallel()
	type outcome int
	const (
		stopped outcome = iota // refused or cancelled before the session folder
		wentOn                 // passed the preflight: session folder, report, then the fake image fails
	)
	tests := []struct {
		name       string
		args       []string
		terminal   []step // nil: no terminal, stdin a pipe that never delivers
		setup      func(t *testing.T, ws string)
		want       outcome
		outHas     []string
		outLacks   []string
		approved   []int
		strictHint bool
	}{
		{name: "strict refuses an unapproved HIGH", args: []string{"--preflight=strict"}, want: stopped,
			outHas: []string{"refusing to start (--preflight=strict)", "unapproved HIGH-risk secrets: 1 in"}, strictHint: true},
		{name: "strict on a terminal refuses without asking", args: []string{"--preflight=strict"}, terminal: []step{{"refusing to start", ""}},
			want: stopped, outLacks: []string{menuPrompt}, strictHint: true},
		{name: "strict passes once the HIGH is in .gitleaksignore", args: []string{"--preflight=strict"}, setup: func(t *testing.T, ws string) {
			f, err := os.OpenFile(filepath.Join(ws, ".gitleaksignore"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("src/aws.py:aws-access-token:1\n")
			f.Close()
		}, want: wentOn, outHas: []string{"no unapproved HIGH-risk findings; continuing (--preflight=strict)"}},
		{name: "warn lists and goes on", args: []string{"--preflight=warn"}, want: wentOn,
			outHas: []string{"1. src/aws.py:1", "continuing (--preflight=warn)"}},
		{name: "prompt without a terminal never waits", args: nil, want: wentOn,
			outHas: []string{"no terminal to ask on; continuing as with --preflight=warn"}},
		{name: "off says so", args: []string{"--preflight=off"}, want: wentOn,
			outHas: []string{"skipped (--preflight=off)"}, outLacks: []string{"HIGH RISK"}},
		{name: "prompt on a terminal: x", terminal: []step{{menuPrompt, "x\n"}, {"Cancelled; nothing was started.", ""}}, want: stopped},
		{name: "prompt on a terminal: Ctrl-D", terminal: []step{{menuPrompt, ctrlD}, {"End of input", ""}}, want: stopped},
		{name: "prompt on a terminal: Ctrl-C", terminal: []step{{menuPrompt, ctrlC}, {"Interrupted", ""}}, want: stopped},
		{name: "prompt on a terminal: c", terminal: []step{{menuPrompt, "c\n"}, {"shown again next time", ""}}, want: wentOn},
		{name: "prompt on a terminal: a", terminal: []step{{menuPrompt, "a\n"}, {"Approved 4", ""}}, want: wentOn, approved: []int{1, 2, 3, 4}},
		{name: "prompt on a terminal: i with a bad number, then one", terminal: []step{{menuPrompt, "i\n"},
			{itemsPrompt, "7\n"}, {"from 1 to 4", ""}, {itemsPrompt, "1\n"}, {"Approved 1", ""}}, want: wentOn, approved: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newPreflightCLI(t)
			ws, secrets := reviewWorkspace(t)
			if tt.setup != nil {
				tt.setup(t, ws)
			}
			nums := scanJSON(t, c, ws).numbered()
			fake, qemuCalls := fakeVM(t)
			args := append([]string{"run", ws, "--no-network", "--memory", "256M"}, tt.args...)
			cmd := c.Command(t, fake, append(args, "--", "true")...)

			var out string
			var code int
			if tt.terminal != nil {
				tr := startOnTerminal(t, cmd)
				for _, st := range tt.terminal {
					tr.expect(st.expect)
					if st.typed != "" {
						tr.typeText(st.typed)
					}
				}
				code = tr.wait()
				out = tr.output()
			} else {
				// A pipe nobody writes to: reading it would block forever.
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				defer r.Close()
				var o bytes.Buffer
				cmd.Stdin, cmd.Stdout, cmd.Stderr = r, &o, &o
				done := make(chan error, 1)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go func() { done <- cmd.Wait() }()
				select {
				case err := <-done:
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						code = ee.ExitCode()
					}
				case <-time.After(60 * time.Second):
					cmd.Process.Kill()
					t.Fatalf("vibedom run waited for input it cannot get:\n%s", o.String())
				}
				out = o.String()
			}

			for _, s := range tt.outHas {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tt.outLacks {
				if strings.Contains(out, s) {
					t.Errorf("output has %q:\n%s", s, out)
				}
			}
			if tt.strictHint {
				real, err := filepath.EvalSymlinks(ws)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range []string{"vibedom preflight --review " + real, ".gitleaksignore", "remove the secrets"} {
					if !strings.Contains(out, s) {
						t.Errorf("the refusal does not say how to proceed (%q):\n%s", s, out)
					}
				}
			}
			if code == 0 {
				t.Errorf("exit 0: the fake VM cannot have run; output:\n%s", out)
			}
			if _, err := os.Stat(qemuCalls); err == nil {
				t.Errorf("QEMU was run")
			}
			sessions, _ := filepath.Glob(filepath.Join(c.Home, "sessions", "*"))
			logDirs, _ := filepath.Glob(filepath.Join(c.Home, "logs", "session-*"))
			switch tt.want {
			case stopped:
				if len(sessions)+len(logDirs) > 0 || strings.Contains(out, "preparing the") {
					t.Errorf("a session was started: %v %v\n%s", sessions, logDirs, out)
				}
				if _, err := os.Stat(filepath.Join(c.Home, "images")); err == nil {
					if ents, _ := os.ReadDir(filepath.Join(c.Home, "images")); len(ents) > 0 {
						t.Errorf("the image cache was touched: %v", ents)
					}
				}
			case wentOn:
				if len(sessions) != 1 || len(logDirs) != 1 || !strings.Contains(out, "preparing the") {
					t.Fatalf("the session did not go on past the preflight: %v %v\n%s", sessions, logDirs, out)
				}
				checkSessionLogs(t, logDirs[0], tt.args, secrets)
			}
			if p := secretIn(out, secrets); p != "" {
				t.Errorf("the output holds a secret (%q):\n%s", p, out)
			}
			checkNoSecretUnder(t, c.Home, secrets)
			checkNoSecretUnder(t, filepath.Join(ws, ".vibedom"), secrets)
			if got, want := scanJSON(t, c, ws).approved(), fingerprintsOf(nums, tt.approved); !slices.Equal(got, want) {
				t.Errorf("approved afterwards: %q, want %q", got, want)
			}
		})
	}
}

// checkSessionLogs: the session's log folder holds gitleaks_report.json
// (private, in the documented schema, redacted) unless the preflight was
// off.
func checkSessionLogs(t *testing.T, logDir string, args []string, secrets []string) {
	t.Helper()
	p := filepath.Join(logDir, "gitleaks_report.json")
	fi, err := os.Stat(p)
	if slices.Contains(args, "--preflight=off") {
		if err == nil {
			t.Error("gitleaks_report.json written for a skipped preflight")
		}
		return
	}
	if err != nil {
		t.Fatalf("no gitleaks_report.json in the session's log folder: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("gitleaks_report.json mode %v, want 0600", fi.Mode().Perm())
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	checkDocumentedSchema(t, b)
	var r cliReport
	if err := json.Unmarshal(b, &r); err != nil || len(r.Findings) < 4 {
		t.Errorf("gitleaks_report.json: %v, %d findings\n%s", err, len(r.Findings), b)
	}
}

// checkNoSecretUnder greps every file under dir for the secrets.
func checkNoSecretUnder(t *testing.T, dir string, secrets []string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if s := secretIn(string(b), secrets); s != "" {
			t.Errorf("%s holds a secret (%q)", p, s)
		}
		return nil
	})
}

var docFieldRow = regexp.MustCompile("`([^`]+)`")

// checkDocumentedSchema compares a JSON report's fields with the table in
// docs/preflight.md (the package preflight test holds the details; this
// checks the command's output against the same table).
func checkDocumentedSchema(t *testing.T, doc []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "preflight.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "| field | type | meaning |\n|---|---|---|\n")
	if !ok {
		t.Fatal("docs/preflight.md: no JSON field table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	documented := map[string]bool{} // field → optional
	for row := range strings.SplitSeq(table, "\n") {
		first, rest, _ := strings.Cut(strings.TrimPrefix(row, "| "), " | ")
		optional := strings.Contains(rest, "*optional*")
		var lead string
		for _, m := range docFieldRow.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if strings.HasPrefix(name, ".") {
				name = lead[:strings.LastIndexByte(lead, '.')] + name
			} else {
				lead = name
			}
			documented[name] = optional
		}
	}
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("decode: %v", err)
	}
	seen := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if prefix != "" {
					k = prefix + "." + k
				}
				walk(k, e)
			}
		case []any:
			for _, e := range x {
				walk(prefix+"[]", e)
			}
		default:
			seen[prefix] = true
		}
	}
	walk("", v)
	for f := range seen {
		if _, ok := documented[f]; !ok {
			t.Errorf("output field %q is not in docs/preflight.md", f)
		}
	}
	for f, optional := range documented {
		if !seen[f] && !optional && !strings.HasPrefix(f, "skipped[]") && !strings.HasPrefix(f, "warnings[]") {
			t.Errorf("documented field %q is not in the output", f)
		}
	}
}

// TestPreflightJSONSchema: `vibedom preflight --json` prints every
// documented field and no other, for a workspace with findings of every
// status, a file too large to scan and a warning; and no secret.
func TestPreflightJSONSchema(t *testing.T) {
	t.Parallel()
	c := newPreflightCLI(t)
	ws, secrets := reviewWorkspace(t)
	big := bytes.Repeat([]byte("lorem ipsum dolor sit amet\n"), (10<<20)/27+100) // text over the 10 MiB limit
	if err := os.WriteFile(filepath.Join(ws, "dump.sql"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(ws, ".gitleaksignore"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("not a fingerprint\n")
	f.Close()
	// One approval, through the terminal.
	tr := startOnTerminal(t, c.Command(t, nil, "preflight", "--review", ws))
	tr.expect(menuPrompt)
	tr.typeText("i\n")
	tr.expect(itemsPrompt)
	tr.typeText("2\n")
	tr.wait()

	stdout, stderr, code := c.Run(t, "", "preflight", "--json", ws)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	checkDocumentedSchema(t, []byte(stdout))
	var r struct {
		Summary  map[string]int    `json:"summary"`
		Skipped  []map[string]any  `json:"skipped"`
		Warnings []string          `json:"warnings"`
		Findings []json.RawMessage `json:"findings"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if r.Summary["approved"] != 1 || r.Summary["ignored"] != 1 || r.Summary["unapproved"] != 3 || len(r.Skipped) != 1 || len(r.Warnings) != 1 {
		t.Errorf("want 1 approved, 1 ignored, 3 unapproved, 1 skipped, 1 warning: %s", stdout)
	}
	if p := secretIn(stdout+stderr, secrets); p != "" {
		t.Errorf("--json printed a secret (%q):\n%s", p, stdout)
	}
}
