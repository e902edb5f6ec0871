package preflight

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/term"
)

func TestParseSelection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		n       int
		want    []int
		wantErr string
	}{
		{"1", 5, []int{1}, ""},
		{"1,3-5", 5, []int{1, 3, 4, 5}, ""},
		{" 2 , 4 ", 5, []int{2, 4}, ""},
		{"2 4", 5, []int{2, 4}, ""},
		{"3-3", 5, []int{3}, ""},
		{"1-2,2-3,1", 5, []int{1, 2, 3}, ""},
		{"5,1", 5, []int{1, 5}, ""},
		{"0", 5, nil, "not an item number"},
		{"6", 5, nil, "not an item number"},
		{"-1", 5, nil, "not an item number"},
		{"2-9", 5, nil, "not a range"},
		{"4-2", 5, nil, "backwards"},
		{"a", 5, nil, "not an item number"},
		{"1-", 5, nil, "not a range"},
		{"1-2-3", 5, nil, "not a range"},
		{",,", 5, nil, "no item numbers"},
		{"99999999999999999999", 5, nil, "not an item number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSelection(tt.in, tt.n)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("ParseSelection(%q): got %v, %v; want error with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("ParseSelection(%q): got %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Mode
		ok   bool
	}{
		{"", ModePrompt, true}, {"prompt", ModePrompt, true}, {"warn", ModeWarn, true},
		{"STRICT", ModeStrict, true}, {"off", ModeOff, true}, {"never", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseMode(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("ParseMode(%q): got %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

// reviewTree has four findings: 1 HIGH, 2 and 3 MEDIUM, 4 LOW.
func reviewTree(t *testing.T) env {
	t.Helper()
	e := newEnv(t)
	writeTree(t, e.ws, map[string]string{
		"src/aws.py": "key = '" + awsKey() + "'\n",
		".env":       envPassword(passValue),
		"app.env":    "GITHUB_TOKEN=" + githubPAT("1") + "\n",
		".env.local": envPassword(passValue + "x"),
	})
	return e
}

// terminal is the test's side of a pseudo-terminal: what Review prints
// accumulates in out, and type writes as the user would.
type terminal struct {
	t    *testing.T
	ptmx *os.File
	tty  *os.File
	mu   sync.Mutex
	out  bytes.Buffer
	seen int
}

func newTerminal(t *testing.T) *terminal {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	tm := &terminal{t: t, ptmx: ptmx, tty: tty}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			tm.mu.Lock()
			tm.out.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		// A read the prompt left pending (its context ended) holds the tty
		// open; a newline lets it finish so the terminal can close.
		ptmx.Write([]byte("\n"))
		tty.Close()
		ptmx.Close()
		<-done
	})
	return tm
}

// expect waits until s appears in output not yet consumed.
func (tm *terminal) expect(s string) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		tm.mu.Lock()
		rest := tm.out.String()[tm.seen:]
		if i := strings.Index(rest, s); i >= 0 {
			tm.seen += i + len(s)
			tm.mu.Unlock()
			return
		}
		tm.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.t.Fatalf("terminal never showed %q; output:\n%s", s, tm.out.String())
}

func (tm *terminal) typeLine(s string) {
	tm.t.Helper()
	if _, err := tm.ptmx.Write([]byte(s)); err != nil {
		tm.t.Fatal(err)
	}
}

func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.out.String()
}

type reviewResult struct {
	out Outcome
	err error
}

func TestReviewPrompt(t *testing.T) {
	t.Parallel()
	const eot = "\x04" // Ctrl-D: end of input on a terminal
	const choice = "Choice [c/a/i/x]: "
	const items = "Items to approve"
	type step struct{ expect, typed string } // wait for expect, then type
	tests := []struct {
		name         string
		setup        func(t *testing.T, ws string) // optional, after the tree is written
		dialogue     []step
		want         Outcome
		approvedNums []int // which of 1..4 are approved on a rescan
	}{
		{"continue", nil, []step{{choice, "c\n"}, {"shown again next time", ""}}, OutcomeContinue, nil},
		{"approve all", nil, []step{{choice, "a\n"}, {"Approved 4", ""}}, OutcomeContinue, []int{1, 2, 3, 4}},
		{"ignore a list and a range", nil, []step{{choice, "i\n"}, {items, "1,3-4\n"}, {"1 will be asked again", ""}}, OutcomeContinue, []int{1, 3, 4}},
		{"ignore one", nil, []step{{choice, "I\n"}, {items, " 2 \n"}, {"Approved 1", ""}}, OutcomeContinue, []int{2}},
		{"ignore: bad numbers ask again, empty goes back, then cancel", nil, []step{
			{choice, "i\n"}, {items, "9\n"}, {"not an item number from 1 to 4", ""},
			{items, "\n"}, {"[x] Cancel", ""}, {choice, "x\n"}, {"Cancelled", ""}}, OutcomeCancel, nil},
		{"cancel", nil, []step{{choice, "x\n"}, {"Cancelled", ""}}, OutcomeCancel, nil},
		{"invalid input asks again", nil, []step{{choice, "yes please\n"}, {"Please answer c, a, i or x.", ""}, {choice, "continue\n"}, {"shown again", ""}}, OutcomeContinue, nil},
		{"end of input cancels", nil, []step{{choice, eot}, {"End of input", ""}}, OutcomeCancel, nil},
		{"end of input while picking cancels", nil, []step{{choice, "i\n"}, {items, eot}, {"End of input", ""}}, OutcomeCancel, nil},
		{name: "approvals that cannot be written: says so, asks again", setup: func(t *testing.T, ws string) {
			must(t, os.WriteFile(filepath.Join(ws, ".vibedom"), nil, 0o644)) // not a directory
		}, dialogue: []step{{choice, "a\n"}, {"Could not record the approvals", ""}, {"Nothing was approved", ""},
			{choice, "i\n"}, {items, "1\n"}, {"Could not record the approvals", ""},
			{choice, "c\n"}, {"shown again next time", ""}}, want: OutcomeContinue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := reviewTree(t)
			if tt.setup != nil {
				tt.setup(t, e.ws)
			}
			r := e.scan(t)
			if n := len(r.Unapproved()); n != 4 {
				t.Fatalf("setup: %d unapproved, want 4:\n%s", n, fileList(r))
			}
			numbered := map[int]string{}
			for _, f := range r.Unapproved() {
				numbered[f.Number] = f.Fingerprint
			}
			tm := newTerminal(t)
			isTTY := term.IsTerminal(int(tm.tty.Fd()))
			if !isTTY {
				t.Fatal("the pty is not a terminal")
			}
			res := make(chan reviewResult, 1)
			go func() {
				o, err := Review(t.Context(), r, tm.tty, tm.tty, isTTY, ModePrompt)
				res <- reviewResult{o, err}
			}()
			tm.expect("HIGH RISK")
			tm.expect("1. src/aws.py:1  aws-access-token  AKIA…(20 chars)")
			tm.expect("cloud provider key (aws)")
			tm.expect("MEDIUM RISK")
			tm.expect("LOW RISK")
			tm.expect("4. .env.local:1")
			for _, st := range tt.dialogue {
				tm.expect(st.expect)
				if st.typed != "" {
					tm.typeLine(st.typed)
				}
			}
			var got reviewResult
			select {
			case got = <-res:
			case <-time.After(20 * time.Second):
				t.Fatalf("Review did not return; output:\n%s", tm.output())
			}
			if got.err != nil || got.out != tt.want {
				t.Fatalf("Review: got %v, %v; want %v", got.out, got.err, tt.want)
			}
			if out := tm.output(); strings.Contains(out, githubPAT("1")) || strings.Contains(out, passValue) || strings.Contains(out, awsKey()) {
				t.Error("the prompt showed a secret")
			}
			// What a fresh scan sees is what was recorded.
			want := map[string]bool{}
			for _, n := range tt.approvedNums {
				want[numbered[n]] = true
			}
			r2 := e.scan(t)
			for _, f := range r2.Findings {
				if got := f.Status == StatusApproved; got != want[f.Fingerprint] {
					t.Errorf("rescan %s: approved %v, want %v", f.Fingerprint, got, want[f.Fingerprint])
				}
			}
		})
	}
}

func TestReviewContextCancel(t *testing.T) {
	t.Parallel()
	e := reviewTree(t)
	r := e.scan(t)
	tm := newTerminal(t)
	ctx, cancel := context.WithCancel(t.Context())
	res := make(chan reviewResult, 1)
	go func() {
		o, err := Review(ctx, r, tm.tty, tm.tty, true, ModePrompt)
		res <- reviewResult{o, err}
	}()
	tm.expect("Choice [c/a/i/x]: ")
	cancel()
	got := <-res
	if got.out != OutcomeCancel || !errors.Is(got.err, context.Canceled) {
		t.Errorf("Review: got %v, %v; want cancel with context.Canceled", got.out, got.err)
	}
}

// blockingReader fails the test if read: non-interactive modes must not.
type blockingReader struct{ t *testing.T }

func (b blockingReader) Read([]byte) (int, error) {
	b.t.Error("Review read its input in a non-interactive mode")
	return 0, errors.New("must not read")
}

func TestReviewNonInteractive(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mode   Mode
		isTTY  bool
		tree   map[string]string
		want   Outcome
		errIs  error
		outHas []string
	}{
		{"warn prints and continues", ModeWarn, false, nil, OutcomeContinue, nil,
			[]string{"HIGH RISK", "1. src/aws.py:1", "continuing (--preflight=warn)"}},
		{"warn on a terminal does not ask", ModeWarn, true, nil, OutcomeContinue, nil, []string{"continuing (--preflight=warn)"}},
		{"prompt without a terminal never blocks", ModePrompt, false, nil, OutcomeContinue, nil,
			[]string{"4. .env.local:1", "no terminal to ask on"}},
		{"strict refuses an unapproved HIGH", ModeStrict, true, nil, OutcomeRefused, ErrUnapprovedHigh,
			[]string{"refusing to start", "1 unapproved HIGH"}},
		{"strict allows MEDIUM and LOW", ModeStrict, false, map[string]string{"src/aws.py": "x = 1\n"}, OutcomeContinue, nil,
			[]string{"no unapproved HIGH-risk findings"}},
		{"off says so", ModeOff, false, nil, OutcomeContinue, nil, []string{"skipped (--preflight=off)"}},
		{"nothing to review", ModePrompt, true, map[string]string{"src/aws.py": "x = 1\n", ".env": "", "app.env": "", ".env.local": ""},
			OutcomeContinue, nil, []string{"no unapproved secrets"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := reviewTree(t)
			writeTree(t, e.ws, tt.tree)
			r := e.scan(t)
			var out bytes.Buffer
			got, err := Review(t.Context(), r, blockingReader{t}, &out, tt.isTTY, tt.mode)
			if got != tt.want || !errors.Is(err, tt.errIs) || (tt.errIs == nil && err != nil) {
				t.Fatalf("Review: got %v, %v; want %v, %v", got, err, tt.want, tt.errIs)
			}
			for _, s := range tt.outHas {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, out.String())
				}
			}
			if tt.errIs == ErrUnapprovedHigh && !strings.Contains(err.Error(), "vibedom preflight --review") {
				t.Errorf("strict error does not say how to approve: %v", err)
			}
		})
	}
	t.Run("off needs no report", func(t *testing.T) {
		got, err := Review(t.Context(), nil, blockingReader{t}, io.Discard, false, ModeOff)
		if got != OutcomeContinue || err != nil {
			t.Errorf("Review(off, nil): got %v, %v", got, err)
		}
	})
	t.Run("strict passes once the HIGH is approved", func(t *testing.T) {
		e := reviewTree(t)
		r := e.scan(t)
		must(t, r.approve(r.Unapproved()[:1]))
		r = e.scan(t)
		got, err := Review(t.Context(), r, blockingReader{t}, io.Discard, false, ModeStrict)
		if got != OutcomeContinue || err != nil {
			t.Errorf("Review(strict): got %v, %v", got, err)
		}
	})
}

// TestReviewReadsOnlyItsLine: input typed after the answer belongs to
// whatever runs next (the agent's terminal) and must not be consumed.
func TestReviewReadsOnlyItsLine(t *testing.T) {
	t.Parallel()
	e := reviewTree(t)
	r := e.scan(t)
	in := strings.NewReader("c\nls -la\n")
	got, err := Review(t.Context(), r, in, io.Discard, true, ModePrompt)
	if got != OutcomeContinue || err != nil {
		t.Fatalf("Review: got %v, %v", got, err)
	}
	rest, _ := io.ReadAll(in)
	if string(rest) != "ls -la\n" {
		t.Errorf("left unread: got %q, want %q", rest, "ls -la\n")
	}
}
