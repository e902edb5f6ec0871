package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Conflict marker labels.
const (
	labelMine   = "yours (host)"
	labelBase   = "baseline"
	labelTheirs = "agent"

	markerMine   = "<<<<<<< " + labelMine
	markerBase   = "||||||| " + labelBase
	markerSep    = "======="
	markerTheirs = ">>>>>>> " + labelTheirs
)

// errNoGit means git is not installed: no line merge is attempted.
var errNoGit = errors.New("git not found")

// merge3 merges the changes from base to mine (the host's file) and from
// base to theirs (the agent's), line by line. It returns the merged text and
// whether it is clean; with conflicts the text holds diff3-style markers.
//
// The merge is git's own (`git merge-file --diff3`, run without any
// configuration in a private directory), so a merge vibedom calls clean is
// exactly the one git would make, and every region git calls a conflict is
// one. Without git, only the trivial merges are clean (one side unchanged,
// or both the same); anything else is a conflict whose markers hold the
// whole of each version: no line merge is guessed.
func merge3(base, mine, theirs string) (string, bool) {
	switch {
	case mine == theirs, base == theirs:
		return mine, true
	case base == mine:
		return theirs, true
	}
	if out, clean, err := gitMergeFile(base, mine, theirs); err == nil {
		return out, clean
	}
	return wholeFileMarks(base, mine, theirs), false
}

// wholeFileMarks is one conflict spanning the three versions.
func wholeFileMarks(base, mine, theirs string) string {
	var out strings.Builder
	block := func(marker, text string) {
		out.WriteString(marker + "\n")
		out.WriteString(text)
		if text != "" && !strings.HasSuffix(text, "\n") {
			out.WriteByte('\n')
		}
	}
	block(markerMine, mine)
	block(markerBase, base)
	block(markerSep, theirs)
	out.WriteString(markerTheirs + "\n")
	return out.String()
}

// gitMergeFile runs `git merge-file -p --diff3` on the three versions. Git
// reads no configuration (system, global or a repository's: discovery stops
// at the private directory), so nothing of the user's or the workspace's
// setup changes the merge or runs.
func gitMergeFile(base, mine, theirs string) (string, bool, error) {
	git, err := exec.LookPath("git")
	if err != nil {
		return "", false, errNoGit
	}
	dir, err := os.MkdirTemp("", "vibedom-merge-")
	if err != nil {
		return "", false, fmt.Errorf("merge: %w", err)
	}
	defer os.RemoveAll(dir)
	for name, text := range map[string]string{"mine": mine, "base": base, "theirs": theirs} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return "", false, fmt.Errorf("merge: %w", err)
		}
	}
	cmd := exec.Command(git, "merge-file", "-p", "--diff3", "-L", labelMine, "-L", labelBase, "-L", labelTheirs, "mine", "base", "theirs")
	cmd.Dir = dir
	cmd.Env = hermeticGitEnv(dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), true, nil
	case errors.As(err, &ee) && ee.ExitCode() > 0 && ee.ExitCode() < 128 &&
		strings.Contains(stdout.String(), markerMine+"\n") && strings.Contains(stdout.String(), markerTheirs+"\n"):
		return stdout.String(), false, nil // the number of conflicts
	}
	// Anything else (a git that is only a stub asking to be installed, as
	// /usr/bin/git on a Mac without the developer tools, exits 1 too) is
	// not a merge.
	return "", false, fmt.Errorf("git merge-file: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
}

// hermeticGitEnv is an environment in which git reads no configuration and
// finds no repository above dir (hostGitEnv).
func hermeticGitEnv(dir string) []string { return hostGitEnv(dir) }
