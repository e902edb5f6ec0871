//go:build unix

package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The patch as a git branch (`vibedom apply --branch`): the paths apply
// would write become one commit on a new branch whose parent is the commit
// the workspace had checked out when the session started. The working
// tree, the index, HEAD and every existing ref are left alone.
//
// Everything goes through git plumbing in the clean environment of
// hostgit.go. Blobs, the tree and the commit are made with a private git
// directory (empty config, no hooks) over the repository's object store
// and a temporary index. show-ref and update-ref run with another private
// git directory whose refs/ and packed-refs are the repository's (refsGit):
// the branch lands among the repository's refs while git reads none of its
// config, so no hook runs on update-ref's reference-transaction event,
// neither a hooks folder nor one named by config (`hook.<name>.command`,
// git 2.54). Only rev-parse of HEAD at the baseline and `config --get
// user.*` for the author run with the repository's own git directory, and
// so read its config: they read no index, attributes or work tree and run
// no hook, and core.hooksPath is set on their command line to an empty
// directory all the same.

// Errors of CommitBranch. Each leaves the repository as it was.
var (
	// ErrNotGitRepo: the workspace is not in a git repository.
	ErrNotGitRepo = errors.New("not in a git repository")
	// ErrBranchExists: the branch is there already; it is never moved.
	ErrBranchExists = errors.New("branch exists")
	// ErrNoBaseCommit: the session's starting commit is unknown or no
	// longer in the repository.
	ErrNoBaseCommit = errors.New("no base commit")
	// ErrNothingToCommit: no path of the plan could go on the branch.
	ErrNothingToCommit = errors.New("nothing to commit")
)

// BranchOptions says what to commit to which new branch. Apply holds the
// same choices as an apply (Workspace, SessionDir, Files, AllowProtected,
// AllowOutsideSymlinks); its Resolve is not used: a branch starts from the
// session's commit, so the user's own edits since do not conflict with it.
type BranchOptions struct {
	Apply ApplyOptions
	// Branch is the new branch's name (without refs/heads/).
	Branch string
	// Message is the commit message; "" is a one-line default.
	Message string
}

// BranchResult is what CommitBranch did. Report.Results says, path by
// path, what went on the branch and what did not (protected, refused, not
// selected: the same decisions and words as an apply); Report.Applied
// lists the paths the commit changes.
type BranchResult struct {
	Report Report
	// Branch is the branch name, Commit the new commit, Base its parent.
	Branch, Commit, Base string
}

// BaseCommit is the commit the workspace's repository had checked out when
// the session's baseline was taken. It fails with ErrNotGitRepo when the
// workspace was in no repository and ErrNoBaseCommit when none is known (a
// repository without commits, a session from before it was recorded).
func BaseCommit(sessionDir string) (string, error) {
	bl, err := OpenBaseline(filepath.Join(sessionDir, BaselineDir))
	if err != nil {
		return "", err
	}
	defer bl.Close()
	switch {
	case validBlobID(bl.meta.Head):
		return bl.meta.Head, nil
	case bl.meta.Repo:
		return "", fmt.Errorf("%w: the repository had no commit when the session started; use `vibedom apply`", ErrNoBaseCommit)
	case bl.meta.Git:
		return "", fmt.Errorf("%w: this session did not record the commit it started from (an older vibedom); use `vibedom apply`", ErrNoBaseCommit)
	}
	return "", fmt.Errorf("%w: %s was not in a git repository when the session started; use `vibedom apply`", ErrNotGitRepo, DisplayPath(bl.meta.Workspace))
}

// headCommit says whether ws is in a git repository and which commit its
// HEAD names ("" when there is none, or no git).
func headCommit(ctx context.Context, ws string) (repo bool, head string) {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return false, ""
	}
	r, ok := findGitRepo(real)
	if !ok {
		return false, ""
	}
	private, err := privateGitDir()
	if err != nil {
		return true, ""
	}
	defer os.RemoveAll(private)
	out, err := refGit(ctx, r, private, nil, "rev-parse", "-q", "--verify", "HEAD^{commit}")
	if err != nil {
		return true, ""
	}
	h := strings.TrimSpace(string(out))
	if !validBlobID(h) {
		return true, ""
	}
	return true, h
}

// refGit runs git on r's own git directory (for its refs), from private,
// with hostGitEnv and core.hooksPath set to private's empty hooks folder
// on the command line. Only commands that read no index, attributes or
// work tree may be run through it.
func refGit(ctx context.Context, r *gitRepo, private string, extra []string, args ...string) ([]byte, error) {
	// git reads r's config and what it includes (configIncludesOK).
	for _, f := range []string{filepath.Join(r.commonDir, "config"), filepath.Join(r.gitDir, "config.worktree")} {
		if err := configIncludesOK(ctx, private, f, 0); err != nil {
			return nil, err
		}
	}
	hooks := filepath.Join(private, "no-hooks")
	if err := os.MkdirAll(hooks, 0o700); err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	env := append([]string{"GIT_DIR=" + r.gitDir}, extra...)
	return runHostGit(ctx, private, private, env, append([]string{"-c", "core.hooksPath=" + hooks}, args...)...)
}

// refsGit returns a runner of git commands on r's branches that reads
// nothing of r's config: its git directory is a private one (empty config,
// no hooks) whose refs/ and packed-refs are symlinks to r's, over r's
// object store (update-ref checks the new commit is there). A repository
// that keeps its refs in a reftable is refused.
func refsGit(ctx context.Context, r *gitRepo, private, objects string) (func(args ...string) ([]byte, error), error) {
	if _, err := os.Lstat(filepath.Join(r.commonDir, "reftable")); err == nil {
		return nil, fmt.Errorf("branch: %s keeps its refs in a reftable, which apply --branch does not write; use `vibedom apply`", DisplayPath(r.commonDir))
	}
	dir := filepath.Join(private, "refs-git")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("branch: %w", err)
	}
	for _, f := range []string{"refs", "packed-refs"} {
		if err := os.Symlink(filepath.Join(r.commonDir, f), filepath.Join(dir, f)); err != nil {
			return nil, fmt.Errorf("branch: %w", err)
		}
	}
	for name, text := range map[string]string{"HEAD": "ref: refs/heads/main\n", "config": ""} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return nil, fmt.Errorf("branch: %w", err)
		}
	}
	env := []string{"GIT_DIR=" + dir, "GIT_OBJECT_DIRECTORY=" + objects}
	return func(args ...string) ([]byte, error) {
		return runHostGit(ctx, private, private, env, args...)
	}, nil
}

// Branch plans the session's patch as an apply would (MakePlan with the
// same options) and commits it to a new branch (CommitBranch).
func Branch(ctx context.Context, opts BranchOptions) (*BranchResult, error) {
	pl, err := MakePlan(ctx, opts.Apply)
	if err != nil {
		return nil, err
	}
	return CommitBranch(ctx, pl, opts)
}

// CommitBranch makes one commit of pl's paths on the new branch
// opts.Branch, with the session's base commit (BaseCommit) as its parent.
// A path goes on the branch with the agent's content when apply would
// write it (applied, merged, already there, or in conflict with the user's
// edits since: the branch starts from the session's commit, so it takes
// the agent's version); protected, refused and unselected paths stay off
// it, reported with apply's reasons. Paths inside a submodule stay off it
// too. Nothing in the working tree, the index or HEAD changes; the branch
// is created only if it does not exist (update-ref with a zero old value).
func CommitBranch(ctx context.Context, pl *Plan, opts BranchOptions) (*BranchResult, error) {
	name := opts.Branch
	if name == "" || strings.HasPrefix(name, "-") || name == "HEAD" {
		return nil, fmt.Errorf("branch name %q: give a name such as vibedom/my-change", name)
	}
	if strings.ContainsRune(opts.Message, 0) {
		return nil, errors.New("commit message: it holds a NUL byte")
	}
	base, err := BaseCommit(opts.Apply.SessionDir)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(opts.Apply.Workspace)
	if err != nil {
		return nil, fmt.Errorf("branch: %w", err)
	}
	r, ok := findGitRepo(real)
	if !ok {
		return nil, fmt.Errorf("%w: %s; use `vibedom apply`", ErrNotGitRepo, DisplayPath(real))
	}
	prefix, err := filepath.Rel(r.top, real)
	if err != nil || strings.HasPrefix(prefix, "..") {
		return nil, fmt.Errorf("branch: %s is not inside its repository's work tree %s", DisplayPath(real), DisplayPath(r.top))
	}
	prefix = filepath.ToSlash(prefix)
	if prefix == "." {
		prefix = ""
	} else {
		prefix += "/"
	}
	private, err := privateGitDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	ref := "refs/heads/" + name
	if _, err := runHostGit(ctx, private, private, nil, "check-ref-format", ref); err != nil {
		return nil, fmt.Errorf("branch name %q is not one git accepts (git check-ref-format)", name)
	}
	objects := filepath.Join(r.commonDir, "objects")
	refs, err := refsGit(ctx, r, private, objects)
	if err != nil {
		return nil, err
	}
	// A branch a blocks a/b and a/b blocks a (a ref is a file, its
	// prefixes folders): for-each-ref matches a pattern whole or up to a
	// slash, and a checked name holds no glob character.
	pats := []string{ref}
	for i := range len(name) {
		if name[i] == '/' {
			pats = append(pats, "refs/heads/"+name[:i])
		}
	}
	// git reads those refs and appends to the new one's reflog: none may
	// be a FIFO or a device.
	for _, pat := range pats {
		for _, p := range []string{filepath.Join(r.commonDir, filepath.FromSlash(pat)), filepath.Join(r.commonDir, "logs", filepath.FromSlash(pat))} {
			if err := plainRefFiles(p); err != nil {
				return nil, err
			}
		}
	}
	if _, err := refs("show-ref", "--verify", "-q", ref); err == nil {
		return nil, fmt.Errorf("%w: %s is already a branch; pick another name (it is never overwritten)", ErrBranchExists, name)
	}
	if out, err := refs(append([]string{"for-each-ref", "--count=1", "--format=%(refname:strip=2)"}, pats...)...); err == nil && len(bytes.TrimSpace(out)) > 0 {
		return nil, fmt.Errorf("%w: the branch %s is in the way of %s; pick another name", ErrBranchExists, DisplayPath(string(bytes.TrimSpace(out))), name)
	}
	index := filepath.Join(private, "index")
	obj := []string{
		"GIT_DIR=" + filepath.Join(private, "git"),
		"GIT_OBJECT_DIRECTORY=" + objects,
		"GIT_INDEX_FILE=" + index,
	}
	git := func(stdin []byte, args ...string) ([]byte, error) {
		var in *bytes.Reader
		if stdin != nil {
			in = bytes.NewReader(stdin)
			return runHostGitInput(ctx, private, private, obj, in, args...)
		}
		return runHostGit(ctx, private, private, obj, args...)
	}
	if _, err := git(nil, "cat-file", "-e", base+"^{commit}"); err != nil {
		return nil, fmt.Errorf("%w: the session started from commit %s, which is no longer in the repository", ErrNoBaseCommit, base[:12])
	}
	if _, err := git(nil, "read-tree", base+"^{tree}"); err != nil {
		return nil, fmt.Errorf("branch: read the base commit's tree: %w", err)
	}
	gitlinks, tracked, err := indexEntries(git)
	if err != nil {
		return nil, err
	}
	ignored, err := ignoredPaths(ctx, r, private, prefix, pl, tracked)
	if err != nil {
		return nil, err
	}

	res := &BranchResult{Branch: name, Base: base, Report: Report{Plan: pl, Results: map[string]string{}}}
	type put struct {
		pf   *PlannedFile
		mode uint32
		data []byte
	}
	var dels []string
	var puts []put
	for _, pf := range pl.Files {
		switch pf.Status {
		case StatusApply, StatusMerged, StatusAlready, StatusConflict:
		default:
			res.Report.Results[pf.Path] = string(pf.Status)
			if pf.Why != "" && pf.Status != StatusSkipped {
				res.Report.Results[pf.Path] += ": " + pf.Why
			}
			continue
		}
		if sub := insideGitlink(prefix+pf.Path, gitlinks); sub != "" {
			res.Report.Results[pf.Path] = "refused: inside the submodule " + DisplayPath(sub) + "; commit it in the submodule's own repository"
			continue
		}
		if ignored[pf.Path] {
			res.Report.Results[pf.Path] = "skipped: new, and .gitignore names it (`git add -f` it yourself if it belongs)"
			continue
		}
		res.Report.Applied = append(res.Report.Applied, pf.Path)
		res.Report.Results[pf.Path] = "on the branch"
		switch pf.newT {
		case "":
			dels = append(dels, prefix+pf.Path)
		case TypeSymlink:
			puts = append(puts, put{pf, ModeSymlink, pf.newData})
		default:
			mode := pf.newGitMode
			if mode != ModeFile && mode != ModeExec {
				mode = pf.oldGitMode // a modify that names no mode keeps it
			}
			if mode != ModeExec {
				mode = ModeFile
			}
			puts = append(puts, put{pf, mode, pf.newData})
		}
	}
	if len(dels)+len(puts) == 0 {
		return res, fmt.Errorf("%w: no path can go on the branch (see above)", ErrNothingToCommit)
	}

	// The blobs: one hash-object for all, from files in the private folder.
	var paths bytes.Buffer
	blobDir := filepath.Join(private, "blobs")
	if err := os.Mkdir(blobDir, 0o700); err != nil {
		return nil, fmt.Errorf("branch: %w", err)
	}
	for i, p := range puts {
		f := filepath.Join(blobDir, strconv.Itoa(i))
		if err := os.WriteFile(f, p.data, 0o600); err != nil {
			return nil, fmt.Errorf("branch: %w", err)
		}
		paths.WriteString(f + "\n")
	}
	var ids []string
	if len(puts) > 0 {
		out, err := git(paths.Bytes(), "hash-object", "-w", "--no-filters", "--stdin-paths")
		if err != nil {
			return nil, fmt.Errorf("branch: write the agent's files: %w", err)
		}
		ids = strings.Fields(string(out))
		if len(ids) != len(puts) {
			return nil, fmt.Errorf("branch: git hash-object gave %d ids for %d files", len(ids), len(puts))
		}
		for i, p := range puts {
			if ids[i] != blobID(p.data) {
				return nil, fmt.Errorf("branch: git stored %s as %s, not %s (a repository in another object format?); use `vibedom apply`", DisplayPath(p.pf.Path), ids[i], blobID(p.data))
			}
		}
	}
	// The tree: the base's, then deletions, then the agent's entries
	// (--replace: a file where the base has a directory, or the reverse).
	var info bytes.Buffer
	for _, d := range dels {
		fmt.Fprintf(&info, "0 %s\t%s\x00", zeroID, d)
	}
	for i, p := range puts {
		fmt.Fprintf(&info, "%o %s\t%s\x00", p.mode, ids[i], prefix+p.pf.Path)
	}
	if _, err := git(info.Bytes(), "update-index", "-z", "--replace", "--index-info"); err != nil {
		return nil, fmt.Errorf("branch: build the tree: %w", err)
	}
	// update-index drops with a mere warning a path git never puts in a
	// tree (a .git component in any case, git~1): such a path is refused,
	// not reported as on the branch.
	_, tracked, err = indexEntries(git)
	if err != nil {
		return nil, err
	}
	for _, p := range puts {
		if !tracked[prefix+p.pf.Path] {
			res.Report.Results[p.pf.Path] = "refused: git does not accept this path in a commit"
			res.Report.Applied = slices.DeleteFunc(res.Report.Applied, func(a string) bool { return a == p.pf.Path })
		}
	}
	out, err := git(nil, "write-tree")
	if err != nil {
		return nil, fmt.Errorf("branch: build the tree: %w", err)
	}
	tree := strings.TrimSpace(string(out))
	if out, err := git(nil, "rev-parse", base+"^{tree}"); err == nil && strings.TrimSpace(string(out)) == tree {
		return res, fmt.Errorf("%w: the branch would hold exactly the session's starting commit", ErrNothingToCommit)
	}
	msg := opts.Message
	if strings.TrimSpace(msg) == "" {
		msg = "The agent's changes from a vibedom session"
	}
	if !strings.HasSuffix(msg, "\n") {
		msg += "\n"
	}
	ident, err := commitIdentity(ctx, r, private)
	if err != nil {
		return nil, err
	}
	out, err = runHostGitInput(ctx, private, private, append(obj, ident...), strings.NewReader(msg), "commit-tree", tree, "-p", base, "-F", "-")
	if err != nil {
		return nil, fmt.Errorf("branch: make the commit: %w", err)
	}
	res.Commit = strings.TrimSpace(string(out))
	if _, err := refs("update-ref", "-m", "vibedom apply --branch", ref, res.Commit, zeroID); err != nil {
		if _, e := refs("show-ref", "--verify", "-q", ref); e == nil {
			return nil, fmt.Errorf("%w: %s appeared meanwhile; it was left as it is (the commit is %s)", ErrBranchExists, name, res.Commit[:12])
		}
		return nil, fmt.Errorf("branch: create %s: %w", name, err)
	}
	return res, nil
}

// indexEntries lists the submodules (mode 160000) and every path of the
// temporary index.
func indexEntries(git func([]byte, ...string) ([]byte, error)) (gitlinks []string, tracked map[string]bool, err error) {
	out, err := git(nil, "ls-files", "-s", "-z")
	if err != nil {
		return nil, nil, fmt.Errorf("branch: read the base commit's tree: %w", err)
	}
	tracked = map[string]bool{}
	for rec := range bytes.SplitSeq(out, []byte{0}) {
		meta, p, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			continue
		}
		tracked[string(p)] = true
		if bytes.HasPrefix(meta, []byte("160000 ")) {
			gitlinks = append(gitlinks, string(p))
		}
	}
	return gitlinks, tracked, nil
}

// ignoredPaths are the plan's paths that the branch would add (not in the
// base commit) and that the workspace's .gitignore files name, as `git add`
// would leave them out (a dependency folder the agent installed). git reads
// the .gitignore files of the work tree, and no config.
func ignoredPaths(ctx context.Context, r *gitRepo, private, prefix string, pl *Plan, tracked map[string]bool) (map[string]bool, error) {
	var in bytes.Buffer
	dirs := map[string]bool{}
	for _, pf := range pl.Files {
		// git stops at a path beyond a symlink of the work tree (the
		// agent made a folder of it), and with it the whole check: such a
		// path is not asked about, and is not ignored.
		if pf.newT != "" && !tracked[prefix+pf.Path] && !beyondSymlink(r.top, prefix+pf.Path) {
			in.WriteString(prefix + pf.Path + "\x00")
			for d := path.Dir(prefix + pf.Path); !dirs[d]; d = path.Dir(d) {
				dirs[d] = true
			}
		}
	}
	if in.Len() == 0 {
		return nil, nil
	}
	// git opens the .gitignore of every folder on the way and would wait
	// for good on a FIFO there.
	for d := range dirs {
		gi := filepath.Join(r.top, filepath.FromSlash(d), ".gitignore")
		if fi, err := os.Stat(gi); err == nil && !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("branch: %s is not a regular file; remove it, or use `vibedom apply`", DisplayPath(gi))
		}
	}
	out, err := runHostGitInput(ctx, r.top, private, []string{
		"GIT_DIR=" + filepath.Join(private, "git"),
		"GIT_WORK_TREE=" + r.top,
	}, &in, "check-ignore", "--no-index", "-z", "--stdin")
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == 1 {
		return nil, nil // nothing is ignored
	} else if err != nil {
		return nil, fmt.Errorf("branch: read the workspace's .gitignore files: %w", err)
	}
	ignored := map[string]bool{}
	for p := range bytes.SplitSeq(out, []byte{0}) {
		if rel, ok := strings.CutPrefix(string(p), prefix); ok && len(p) > 0 {
			ignored[rel] = true
		}
	}
	return ignored, nil
}

// beyondSymlink says whether a folder on p's way (p relative to top, with
// slashes) is a symlink in the work tree.
func beyondSymlink(top, p string) bool {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if fi, err := os.Lstat(filepath.Join(top, filepath.FromSlash(d))); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return true
		}
	}
	return false
}

// insideGitlink returns the submodule p is or is inside of, or "".
func insideGitlink(p string, links []string) string {
	for _, l := range links {
		if p == l || strings.HasPrefix(p, l+"/") {
			return l
		}
	}
	return ""
}

// commitIdentity is the author and committer for the commit: the user's
// GIT_AUTHOR_*/GIT_COMMITTER_* when set, else user.name and user.email as
// git reads them for this repository (its config, the user's global and
// the system's; reading runs nothing), else a vibedom placeholder.
func commitIdentity(ctx context.Context, r *gitRepo, private string) ([]string, error) {
	get := func(key string) string {
		user := []string{"GIT_CONFIG_NOSYSTEM=", "GIT_CONFIG_GLOBAL="}
		for _, k := range []string{"HOME", "XDG_CONFIG_HOME"} {
			user = append(user, k+"="+os.Getenv(k))
		}
		out, err := refGit(ctx, r, private, user, "config", "--get", key)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(out))
	}
	name, email := get("user.name"), get("user.email")
	if name == "" {
		name = "vibedom"
	}
	if email == "" {
		email = "vibedom@localhost"
	}
	var env []string
	for _, who := range []string{"AUTHOR", "COMMITTER"} {
		for k, def := range map[string]string{"NAME": name, "EMAIL": email} {
			v := os.Getenv("GIT_" + who + "_" + k)
			if v == "" {
				v = def
			}
			env = append(env, "GIT_"+who+"_"+k+"="+v)
		}
		if d := os.Getenv("GIT_" + who + "_DATE"); d != "" {
			env = append(env, "GIT_"+who+"_DATE="+d)
		}
	}
	slices.Sort(env)
	return env, nil
}

// plainRefFiles checks the loose ref (or reflog) p and, when it is a
// folder, everything under it, before git reads or writes them: each must
// be a regular file of at most gitReadMax. git reads a ref whole and opens
// a reflog to append: a FIFO there would block it until its deadline, a
// symlink to /dev/zero have it read without end.
func plainRefFiles(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return nil // absent (or a dangling symlink: git finds no ref there)
	}
	bad := func(p string) error {
		return fmt.Errorf("branch: %s is not a regular file of at most 1 MiB (git would wait on it or read it without end); remove it, or pick another branch name", DisplayPath(p))
	}
	if !fi.IsDir() {
		if !smallRegularOrAbsent(p, gitReadMax) {
			return bad(p)
		}
		return nil
	}
	return filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := os.Stat(q); err == nil && !fi.IsDir() && !smallRegularOrAbsent(q, gitReadMax) {
			return bad(q)
		}
		return nil
	})
}
