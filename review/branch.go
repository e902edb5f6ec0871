package review

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/termtext"
)

// Branched is a review that ended with the changes committed to a new git
// branch (the workspace untouched).
const Branched Outcome = "branched"

// DefaultBranchName is the branch the review offers for a session.
func DefaultBranchName(session string) string { return "vibedom/" + session }

// DefaultBranchMessage is the commit message of a session's branch when the
// user gives none.
func DefaultBranchMessage(session string) string {
	return "The agent's changes from vibedom session " + session + "\n\nVibedom-Session: " + session + "\n"
}

// BranchDone says what apply --branch made and how to look at it.
func BranchDone(res *overlay.BranchResult) string {
	b := termtext.Line(res.Branch)
	return fmt.Sprintf("Committed %s to the new branch %s (on %s); your files, index and HEAD are as they were.\n"+
		"See it with `git log -p %s` or `git diff %s...%s`.\n",
		plural(len(res.Report.Applied), "path"), b, res.Base[:12], b, res.Base[:12], b)
}

// offerBranch says whether the review offers [b]ranch: the session started
// from a commit.
func offerBranch(o Options) bool {
	_, err := overlay.BaseCommit(o.Apply.SessionDir)
	return err == nil
}

// askBranch asks for a branch name and commits the plan to it. ok false
// means the prompt goes on (the user gave up, or the branch could not be
// made and the error was shown).
func askBranch(ctx context.Context, o Options, pl *overlay.Plan, ask func(string) (string, bool)) (*overlay.BranchResult, bool) {
	session := filepath.Base(o.Apply.SessionDir)
	def := DefaultBranchName(session)
	name, ok := ask(fmt.Sprintf("New branch name [%s]: ", termtext.Line(def)))
	if !ok {
		return nil, false
	}
	if name == "" {
		name = def
	}
	res, err := overlay.CommitBranch(ctx, pl, overlay.BranchOptions{Apply: o.Apply, Branch: name, Message: DefaultBranchMessage(session)})
	if err != nil {
		fmt.Fprintf(o.Out, "%s\n", termtext.Inline(err.Error()))
		return nil, false
	}
	fmt.Fprintln(o.Out)
	WriteReport(o.Out, &res.Report, o.Color)
	fmt.Fprint(o.Out, BranchDone(res))
	return res, true
}

// promptChoices is the review's question.
func promptChoices(branch bool) string {
	if !branch {
		return "\n[a]pply all, [r]eview, [s]elect files, [k]eep for later, [d]iscard? "
	}
	return "\n[a]pply all, [b]ranch, [r]eview, [s]elect files, [k]eep for later, [d]iscard? "
}

func answerHint(branch bool) string {
	return strings.Join(map[bool][]string{false: {"a", "r", "s", "k", "d"}, true: {"a", "b", "r", "s", "k", "d"}}[branch], ", ")
}
