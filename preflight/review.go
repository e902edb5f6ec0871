package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/termtext"
)

// Mode is how a session treats the preflight (`--preflight=`).
type Mode int

// Modes.
const (
	// ModePrompt asks the user on a terminal and behaves as ModeWarn
	// without one. It is the default.
	ModePrompt Mode = iota
	// ModeWarn prints the findings and continues.
	ModeWarn
	// ModeStrict prints the findings and refuses to continue while any
	// HIGH finding is unapproved. It never prompts.
	ModeStrict
	// ModeOff skips the review and says so.
	ModeOff
)

// String returns the flag spelling: prompt, warn, strict or off.
func (m Mode) String() string {
	switch m {
	case ModePrompt:
		return "prompt"
	case ModeWarn:
		return "warn"
	case ModeStrict:
		return "strict"
	case ModeOff:
		return "off"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode reads a --preflight value; "" is ModePrompt.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "prompt":
		return ModePrompt, nil
	case "warn":
		return ModeWarn, nil
	case "strict":
		return ModeStrict, nil
	case "off":
		return ModeOff, nil
	}
	return 0, fmt.Errorf("unknown --preflight mode %q: use prompt, warn, strict or off", s)
}

// Outcome is what the session should do after the review.
type Outcome int

// Outcomes.
const (
	// OutcomeContinue: start the session.
	OutcomeContinue Outcome = iota + 1
	// OutcomeCancel: the user chose to cancel (or input ended); do not start.
	OutcomeCancel
	// OutcomeRefused: strict mode found unapproved HIGH findings; do not start.
	OutcomeRefused
)

// String returns "continue", "cancel" or "refused".
func (o Outcome) String() string {
	switch o {
	case OutcomeContinue:
		return "continue"
	case OutcomeCancel:
		return "cancel"
	case OutcomeRefused:
		return "refused"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// ErrUnapprovedHigh is returned (wrapped, with OutcomeRefused) when strict
// mode refuses to start.
var ErrUnapprovedHigh = errors.New("unapproved HIGH-risk secrets")

const menu = `
Options:
 [c] Continue this time (ask again next run)
 [a] Approve all for this workspace (don't ask again)
 [i] Ignore specific items (approve the ones you pick for this workspace)
 [x] Cancel and fix
`

// Review shows the report's unapproved findings and decides whether the
// session may start.
//
//   - ModeOff prints that the preflight was skipped and continues (r may be nil).
//   - With no unapproved finding it prints a one-line summary and continues.
//   - ModeWarn, and ModePrompt when isTTY is false, print the findings and
//     continue; nothing is read from in, so a run without a terminal never
//     blocks.
//   - ModeStrict prints the findings and returns OutcomeRefused with an error
//     wrapping ErrUnapprovedHigh (saying how to approve) while any HIGH finding
//     is unapproved; otherwise it continues.
//   - ModePrompt on a terminal prints the findings and asks:
//     c continues this time only (nothing is recorded; everything is asked
//     again next time); a approves every shown finding for the workspace;
//     i asks for item numbers (lists and ranges: "1,3-5"), approves those
//     for the workspace and continues, the rest being asked again next time
//     (an empty answer returns to the menu); x cancels. Invalid input asks
//     again; end of input cancels. Approvals are written to
//     <workspace>/.vibedom/approved_secrets.txt and the report's statuses
//     are updated; when they cannot be written, nothing is approved, the
//     prompt says why and asks again.
//
// ctx cancels a pending prompt (the read itself finishes in the background).
func Review(ctx context.Context, r *Report, in io.Reader, out io.Writer, isTTY bool, mode Mode) (Outcome, error) {
	if mode == ModeOff {
		where := ""
		if r != nil {
			where = " in " + clean(r.Workspace)
		}
		fmt.Fprintf(out, "preflight: skipped (--preflight=off): secrets%s were not reviewed\n", where)
		return OutcomeContinue, nil
	}
	if r == nil {
		return OutcomeCancel, errors.New("preflight: no report to review")
	}
	un := r.Unapproved()
	if len(un) == 0 {
		_, err := fmt.Fprintf(out, "preflight: no unapproved secrets in %s (%s, %d approved, %d ignored)\n",
			clean(r.Workspace), plural(r.Stats.Files, "file"), r.count(0, StatusApproved), r.count(0, StatusIgnored))
		return OutcomeContinue, err
	}
	if err := r.WriteText(out); err != nil {
		return OutcomeCancel, err
	}
	switch {
	case mode == ModeStrict:
		if n := r.count(RiskHigh, StatusUnapproved); n > 0 {
			fmt.Fprintf(out, "preflight: refusing to start (--preflight=strict): %d unapproved HIGH-risk finding(s)\n", n)
			return OutcomeRefused, fmt.Errorf("preflight: %w: %d in %s; approve them with `vibedom preflight --review %s` in a terminal, list their fingerprints in %s, or remove the secrets",
				ErrUnapprovedHigh, n, clean(r.Workspace), shellQuote(r.Workspace), IgnoreFile)
		}
		fmt.Fprintln(out, "preflight: no unapproved HIGH-risk findings; continuing (--preflight=strict)")
		return OutcomeContinue, nil
	case mode == ModeWarn:
		fmt.Fprintln(out, "preflight: continuing (--preflight=warn)")
		return OutcomeContinue, nil
	case !isTTY:
		fmt.Fprintln(out, "preflight: no terminal to ask on; continuing as with --preflight=warn")
		return OutcomeContinue, nil
	}
	lr := newLineReader(in)
	defer lr.close()
	return prompt(ctx, r, un, lr, out)
}

func prompt(ctx context.Context, r *Report, un []Finding, lr *lineReader, out io.Writer) (Outcome, error) {
	fmt.Fprint(out, menu)
	for {
		fmt.Fprint(out, "Choice [c/a/i/x]: ")
		line, err := lr.read(ctx)
		if err != nil {
			fmt.Fprintln(out)
			return endOfInput(out, err)
		}
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "c", "continue":
			fmt.Fprintf(out, "Continuing; the %d finding(s) will be shown again next time.\n", len(un))
			return OutcomeContinue, nil
		case "a", "approve":
			if err := r.approve(un); err != nil {
				notRecorded(out, err)
				continue
			}
			fmt.Fprintf(out, "Approved %d finding(s) for this workspace (%s).\n", len(un), ApprovalsFile)
			return OutcomeContinue, nil
		case "i", "ignore":
			picked, back, err := pickItems(ctx, lr, out, len(un))
			if err != nil {
				fmt.Fprintln(out)
				return endOfInput(out, err)
			}
			if back {
				fmt.Fprint(out, menu)
				continue
			}
			var sel []Finding
			for _, n := range picked {
				sel = append(sel, un[n-1])
			}
			if err := r.approve(sel); err != nil {
				notRecorded(out, err)
				continue
			}
			// An approval covers its secret in its file under its rule, so
			// picking one line may settle another showing the same value.
			left := len(r.Unapproved())
			fmt.Fprintf(out, "Approved %d finding(s) for this workspace; %d will be asked again next time.\n", len(un)-left, left)
			return OutcomeContinue, nil
		case "x", "cancel":
			fmt.Fprintln(out, "Cancelled; nothing was started.")
			return OutcomeCancel, nil
		default:
			fmt.Fprintln(out, "Please answer c, a, i or x.")
		}
	}
}

// notRecorded reports approvals that could not be written; the prompt then
// asks again, so the user can continue this time or cancel.
func notRecorded(out io.Writer, err error) {
	fmt.Fprintf(out, "Could not record the approvals: %s\nNothing was approved. Choose c to continue this time only, or x to cancel and fix it.\n", clean(err.Error()))
}

func endOfInput(out io.Writer, err error) (Outcome, error) {
	switch {
	case errors.Is(err, io.EOF):
		fmt.Fprintln(out, "End of input; cancelled, nothing was started.")
		return OutcomeCancel, nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintln(out, "Interrupted; nothing was started.")
		return OutcomeCancel, fmt.Errorf("preflight: review interrupted: %w", err)
	}
	return OutcomeCancel, fmt.Errorf("preflight: read answer: %w", err)
}

// shellQuote quotes a path for a command line the user may copy; control
// characters are escaped for display.
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_./:=@%+,-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	if !termtext.IsSafe(s) {
		return clean(s) // not copyable as it is: show it escaped
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pickItems asks for item numbers until the answer parses. back is true
// for an empty answer.
func pickItems(ctx context.Context, lr *lineReader, out io.Writer, n int) (picked []int, back bool, err error) {
	for {
		fmt.Fprintf(out, "Items to approve for this workspace (e.g. 1,3-5; 1-%d; empty to go back): ", n)
		line, err := lr.read(ctx)
		if err != nil {
			return nil, false, err
		}
		if strings.TrimSpace(line) == "" {
			return nil, true, nil
		}
		picked, err := ParseSelection(line, n)
		if err != nil {
			fmt.Fprintf(out, "%v\n", err)
			continue
		}
		return picked, false, nil
	}
}

// ParseSelection parses item numbers such as "1,3-5" or "2 4" against items
// numbered 1..n. It returns the distinct numbers in ascending order, or an
// error naming the part it could not use.
func ParseSelection(s string, n int) ([]int, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
	if len(fields) == 0 {
		return nil, errors.New("no item numbers given")
	}
	set := make([]bool, n+1)
	for _, f := range fields {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 1 || a > n {
			return nil, fmt.Errorf("%q is not an item number from 1 to %d", f, n)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < 1 || b > n {
				return nil, fmt.Errorf("%q is not a range of item numbers from 1 to %d", f, n)
			}
			if b < a {
				return nil, fmt.Errorf("%q is a backwards range", f)
			}
		}
		for i := a; i <= b; i++ {
			set[i] = true
		}
	}
	var out []int
	for i, ok := range set {
		if ok {
			out = append(out, i)
		}
	}
	return out, nil
}

// approve records the findings in the workspace's approvals file and marks
// them approved in the report.
func (r *Report) approve(fs []Finding) error {
	if len(fs) == 0 {
		return nil
	}
	if r.approvals == nil {
		r.approvals = newApprovals()
	}
	var entries []approvalLine
	for _, f := range fs {
		if f.approvalHash == "" && r.approvals.err == nil {
			return errors.New("preflight: record approvals: the finding has no approval hash (a report not made by Scan)")
		}
		entries = append(entries, approvalLine{fingerprint: f.Fingerprint, hash: f.approvalHash})
	}
	live := map[string]bool{}
	for _, f := range r.Findings {
		live[f.approvalHash] = true
	}
	if err := r.approvals.add(r.Workspace, entries, live); err != nil {
		return fmt.Errorf("preflight: record approvals: %w", err)
	}
	for i := range r.Findings {
		if r.Findings[i].Status == StatusUnapproved && r.approvals.approves(r.Findings[i]) {
			r.Findings[i].Status = StatusApproved
			r.Findings[i].Number = 0
		}
	}
	return nil
}

// lineReader reads one line at a time, only when asked and a byte at a
// time, so it never consumes input meant for what runs after the review
// (the agent's terminal). It reads in a goroutine so a prompt can give up
// when its context ends; a read already under way then finishes in the
// background and its line is dropped.
type lineReader struct {
	req chan struct{}
	res chan lineOrErr
}

type lineOrErr struct {
	s   string
	err error
}

const maxLine = 4096

func newLineReader(in io.Reader) *lineReader {
	lr := &lineReader{req: make(chan struct{}), res: make(chan lineOrErr, 1)}
	go func() {
		for range lr.req {
			s, err := readLine(in)
			lr.res <- lineOrErr{s, err}
		}
	}()
	return lr
}

// readLine reads up to and without the next newline; a last line without
// one still counts. Lines are cut at maxLine bytes.
func readLine(in io.Reader) (string, error) {
	var b [1]byte
	var line []byte
	for {
		n, err := in.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return string(line), nil
			}
			if len(line) < maxLine {
				line = append(line, b[0])
			}
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(line) > 0 {
				return string(line), nil
			}
			return "", err
		}
	}
}

func (lr *lineReader) read(ctx context.Context) (string, error) {
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case lr.req <- struct{}{}:
	}
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case l := <-lr.res:
		return l.s, l.err
	}
}

// close ends the reading goroutine once it is idle.
func (lr *lineReader) close() { close(lr.req) }
