package review

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

// Outcome is how a review ended.
type Outcome string

// Outcomes.
const (
	NoChanges Outcome = "no changes"
	Applied   Outcome = "applied"
	Kept      Outcome = "kept" // the patch stays in the session folder
	Discarded Outcome = "discarded"
)

// DiscardedPatchName is what a discarded changes.patch is renamed to (kept
// in the session folder until the session is removed).
const DiscardedPatchName = "changes.discarded.patch"

// Options configures Run.
type Options struct {
	// Apply is what to apply, from where (Workspace, SessionDir, and the
	// user's --allow-protected etc.). Resolve is set by Run.
	Apply overlay.ApplyOptions
	// In and Out are the user's terminal (or pipes).
	In  io.Reader
	Out io.Writer
	// TTY says In and Out are a terminal: only then is the user asked.
	TTY bool
	// Color enables ANSI colors in the summary and the diff.
	Color bool
	// ApplyAll applies everything without asking (--apply); conflicts keep
	// the user's version. Without a TTY nothing is applied unless it is set.
	ApplyAll bool
	// Pager is the pager command, run with sh -c; "" means $PAGER, then
	// "less -R". Its output goes to PagerOut (default Out).
	Pager    string
	PagerOut io.Writer
}

// Run shows the summary of a session's patch and, on a terminal, asks what
// to do: [a]pply all, [r]eview the diff in the pager, [s]elect files, [k]eep
// for later, [d]iscard. Without a terminal it applies only with ApplyAll and
// otherwise keeps the patch. It returns how the review ended and, when
// something was applied, the apply's report.
func Run(ctx context.Context, o Options) (Outcome, *overlay.Report, error) {
	pl, err := overlay.MakePlan(ctx, o.Apply)
	if err != nil {
		return "", nil, err
	}
	if len(pl.Files) == 0 {
		fmt.Fprintln(o.Out, "The agent changed nothing the patch can carry.")
		if len(pl.NotCarried) > 0 {
			WriteSummary(o.Out, pl, o.Color)
		}
		return NoChanges, nil, nil
	}
	WriteSummary(o.Out, pl, o.Color)
	patchPath := termtext.Line(filepath.Join(o.Apply.SessionDir, overlay.PatchFileName))
	if !o.TTY || o.ApplyAll {
		if !o.ApplyAll {
			fmt.Fprintf(o.Out, "\nNothing applied (no terminal to ask). The patch is kept in %s;\nrun `vibedom review` on a terminal, or `vibedom apply`.\n", patchPath)
			return Kept, nil, nil
		}
		rep, err := overlay.Execute(ctx, pl, o.Apply)
		if rep != nil {
			fmt.Fprintln(o.Out)
			WriteReport(o.Out, rep, o.Color)
		}
		return Applied, rep, err
	}
	in := bufio.NewReader(o.In)
	ask := func(q string) (string, bool) {
		fmt.Fprint(o.Out, q)
		line, err := in.ReadString('\n')
		if err != nil && line == "" {
			fmt.Fprintln(o.Out)
			return "", false
		}
		return strings.TrimSpace(line), true
	}
	o.Apply.Resolve = func(c *overlay.Conflict) overlay.Resolution {
		return askConflict(ctx, o, pl, c, ask)
	}
	recap := false // the attention list and totals are no longer just above the prompt
	branch := offerBranch(o)
	for {
		if err := ctx.Err(); err != nil {
			return Kept, nil, err
		}
		if recap {
			writeAttention(o.Out, pl, o.Color)
			recap = false
		}
		ans, ok := ask(promptChoices(branch))
		if !ok {
			fmt.Fprintf(o.Out, "Kept for later: %s\n", patchPath)
			return Kept, nil, nil
		}
		switch strings.ToLower(ans) {
		case "a", "apply":
			rep, err := overlay.Execute(ctx, pl, o.Apply)
			if rep != nil {
				fmt.Fprintln(o.Out)
				WriteReport(o.Out, rep, o.Color)
			}
			return Applied, rep, err
		case "b", "branch":
			if !branch {
				fmt.Fprintf(o.Out, "Answer %s.\n", answerHint(branch))
				continue
			}
			if res, ok := askBranch(ctx, o, pl, ask); ok {
				return Branched, &res.Report, nil
			}
			recap = true
		case "r", "review":
			if err := page(ctx, o, ColorDiff(planText(pl), o.Color)); err != nil {
				fmt.Fprintf(o.Out, "pager: %s\n", termtext.Inline(err.Error()))
			}
			recap = true
		case "s", "select":
			sel, ok := ask(fmt.Sprintf("Files to apply (numbers and ranges, e.g. 1-3,7; 1–%d): ", len(pl.Files)))
			if !ok {
				return Kept, nil, nil
			}
			idx, err := ParseSelection(sel, len(pl.Files))
			if err != nil {
				fmt.Fprintf(o.Out, "%s\n", termtext.Text(err.Error()))
				recap = true
				continue
			}
			sub := o.Apply
			sub.Files, sub.ExactFiles = nil, true
			for _, i := range idx {
				sub.Files = append(sub.Files, pl.Files[i].Path)
			}
			spl, err := overlay.MakePlan(ctx, sub)
			if err != nil {
				return Kept, nil, err
			}
			rep, err := overlay.Execute(ctx, spl, sub)
			if rep != nil {
				fmt.Fprintln(o.Out)
				WriteReport(o.Out, rep, o.Color)
				fmt.Fprintf(o.Out, "The patch is kept in %s for the rest.\n", patchPath)
			}
			return Applied, rep, err
		case "k", "keep":
			fmt.Fprintf(o.Out, "Kept for later: %s\n(`vibedom review`, `vibedom apply` or `vibedom diff`)\n", patchPath)
			return Kept, nil, nil
		case "d", "discard":
			yes, _ := ask("Discard all of the agent's changes? Your workspace is not touched. [y/N] ")
			if !strings.EqualFold(yes, "y") && !strings.EqualFold(yes, "yes") {
				continue
			}
			dst := filepath.Join(o.Apply.SessionDir, DiscardedPatchName)
			if err := os.Rename(filepath.Join(o.Apply.SessionDir, overlay.PatchFileName), dst); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", nil, fmt.Errorf("discard: %w", err)
			}
			fmt.Fprintf(o.Out, "Discarded (a copy stays in %s until the session is removed).\n", termtext.Line(dst))
			return Discarded, nil, nil
		case "":
		default:
			fmt.Fprintf(o.Out, "Answer %s.\n", answerHint(branch))
		}
	}
}

// askConflict asks how to resolve one conflict.
func askConflict(ctx context.Context, o Options, pl *overlay.Plan, c *overlay.Conflict, ask func(string) (string, bool)) overlay.Resolution {
	var opts []string
	for _, r := range c.Options {
		switch r {
		case overlay.KeepMine:
			opts = append(opts, "[m]ine")
		case overlay.TakeAgent:
			opts = append(opts, "[t]he agent's")
		case overlay.WriteMarks:
			opts = append(opts, "[c]onflict markers")
		}
	}
	opts = append(opts, "[v]iew")
	for {
		kind := string(c.Kind)
		if c.Why != "" {
			kind += " (" + c.Why + ")"
		}
		ans, ok := ask(fmt.Sprintf("Conflict in %s: %s. Keep %s? ", overlay.DisplayPath(c.Path), termtext.Line(kind), strings.Join(opts, ", ")))
		if !ok {
			return overlay.KeepMine
		}
		var res overlay.Resolution
		switch strings.ToLower(ans) {
		case "m", "mine":
			res = overlay.KeepMine
		case "t", "theirs", "agent":
			res = overlay.TakeAgent
		case "c", "markers":
			res = overlay.WriteMarks
		case "v", "view":
			for _, f := range pl.Files {
				if f.Path == c.Path {
					page(ctx, o, ColorDiff(f.ReviewDiff(), o.Color))
				}
			}
			continue
		default:
			continue
		}
		for _, r := range c.Options {
			if r == res {
				return res
			}
		}
	}
}

// planText is what the review pages: the patch text of every file, but for
// a merge the merged result against the user's file (what apply writes).
func planText(pl *overlay.Plan) []byte {
	var b bytes.Buffer
	for _, f := range pl.Files {
		b.Write(f.ReviewDiff())
	}
	return b.Bytes()
}

// page pipes text into the pager ($PAGER, else less -R); without one it
// writes the text out.
func page(ctx context.Context, o Options, text []byte) error {
	pager := o.Pager
	if pager == "" {
		pager = os.Getenv("PAGER")
	}
	if pager == "" {
		if _, err := exec.LookPath("less"); err == nil {
			pager = "less -R"
		}
	}
	out := o.PagerOut
	if out == nil {
		out = o.Out
	}
	if pager == "" {
		_, err := out.Write(text)
		return err
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", pager)
	cmd.Stdin = bytes.NewReader(text)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.Env = childenv.Environ()
	if os.Getenv("LESS") == "" {
		cmd.Env = append(cmd.Env, "LESS=FRX")
	}
	return cmd.Run()
}

// ParseSelection reads "1-3,7 9" into 0-based indexes (sorted, unique) of n
// items.
func ParseSelection(s string, n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	if len(fields) == 0 {
		return nil, errors.New("no files selected")
	}
	for _, f := range fields {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number or range", f)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("%q is not a number or range", f)
			}
		}
		if a < 1 || b > n || a > b {
			return nil, fmt.Errorf("%q is outside 1–%d", f, n)
		}
		for i := a; i <= b; i++ {
			if !seen[i] {
				seen[i] = true
				out = append(out, i-1)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
