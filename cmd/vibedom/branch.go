package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
	"github.com/vibedom/vibedom/termtext"
)

// branchFlags are apply's flags for --branch.
func branchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "branch", Usage: "commit the changes to this new git `BRANCH` (parent: the commit the session started from) instead of writing the workspace"},
		&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Usage: "the commit message with --branch"},
	}
}

// applyBranch is `vibedom apply --branch`: one commit on a new branch, the
// workspace, its index and HEAD untouched. Exit 1 when some path stayed off
// the branch, 2 when no branch was made.
func applyBranch(ctx context.Context, c *cli.Command, si *review.SessionInfo, opts overlay.ApplyOptions) error {
	// --on-conflict is not used: a branch starts from the session's commit,
	// so the user's edits since do not conflict with it.
	res, err := overlay.Branch(ctx, overlay.BranchOptions{Apply: opts, Branch: c.String("branch"), Message: branchMessage(c.String("message"), si.Name)})
	color := changesIsTerminal(os.Stdout) && os.Getenv("NO_COLOR") == ""
	if res != nil {
		review.WriteReport(os.Stdout, &res.Report, color)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "%s", review.BranchDone(res))
	if n := branchLeftOut(res); n > 0 {
		fmt.Fprintf(os.Stderr, "vibedom: %d path(s) not on the branch (see above); the patch is kept in %s\n", n, termtext.Line(si.Dir))
		return exitCode(1)
	}
	return nil
}

// branchMessage is the commit message: the user's, else one naming the
// session.
func branchMessage(msg, session string) string {
	if strings.TrimSpace(msg) != "" {
		return msg
	}
	return review.DefaultBranchMessage(session)
}

// branchLeftOut counts the paths refused or protected (not the unselected).
func branchLeftOut(res *overlay.BranchResult) int {
	n := 0
	for _, r := range res.Report.Results {
		if strings.HasPrefix(r, "refused") || strings.HasPrefix(r, "protected") {
			n++
		}
	}
	return n
}
