package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Host-side git: the one place vibedom runs git on the host (the baseline's
// blob ids, old contents from the object store, the hooks directory, the
// three-way merge). A workspace is untrusted, and git run in a repository
// runs what its config names: clean and smudge filters (on any command that
// hashes a work-tree file, `git diff-files` included), core.fsmonitor,
// hooks, external diff and textconv drivers, credential helpers, an
// ssh command or a promisor remote's lazy fetch. None of it may run here.
//
// So git never sees the repository's config, nor the user's or the
// system's: reads of the index and objects go through a private git
// directory (an empty config, no hooks, HEAD and refs only) with the
// repository's object store (GIT_OBJECT_DIRECTORY) and index
// (GIT_INDEX_FILE) and work tree (GIT_WORK_TREE) named in the environment.
// A filter named in .gitattributes has no definition there, so nothing runs
// (the file then counts as dirty: no blob id, never a wrong one). Only
// repoHooksDir and repoConfig let git read the repository's config (and the
// user's), with `git rev-parse` and `git config --list`, which read no
// index, attributes or hooks and run nothing.

// gitRepo is a work tree's repository as found on disk, without git.
type gitRepo struct {
	top       string // the work tree's top directory
	gitDir    string // its git directory (a linked worktree's own)
	commonDir string // objects, refs and config (the main repository's)
}

// plainFiles reports whether the files git opens first in r are regular
// files (or absent) and its refs and objects folders are folders: a FIFO
// as .git/config or HEAD blocks every git command that reads it, forever,
// and a symlink to a device as objects/info/alternates or as the branch
// HEAD names has git read it into memory without end.
// The files git reads whole into memory (HEAD, the branch ref, commondir,
// config, every alternates file down the chain) must also be small: a
// sparse regular file of many GiB there has git allocate all of it.
// A repository that fails is treated as none (the session takes its
// baseline without git). Deeper files (a ref, an object) are covered by
// the deadline on every host git command (gitTimeout).
func (r *gitRepo) plainFiles() bool {
	for _, dir := range []string{r.gitDir, r.commonDir} {
		for _, f := range gitFirstReads {
			if !smallRegularOrAbsent(filepath.Join(dir, f.name), f.max) {
				return false
			}
		}
		for _, d := range []string{"refs", "objects"} {
			if fi, err := os.Stat(filepath.Join(dir, d)); err == nil && !fi.IsDir() {
				return false
			}
		}
		// Read by every command that reads objects, and the branch HEAD
		// names: a symlink to /dev/zero there has git read until the
		// host runs out of memory (a deadline does not help).
		if !alternatesOK(filepath.Join(dir, "objects"), 0, map[string]bool{}) {
			return false
		}
	}
	// HEAD's ref and the refs it leads to (a symbolic ref may name another,
	// git follows five), each read as git reads it: "ref:", any blanks,
	// the name, blanks at the end.
	p := filepath.Join(r.gitDir, "HEAD")
	for range 6 {
		data, err := readSmallRegular(p)
		if err != nil {
			break
		}
		ref, ok := strings.CutPrefix(strings.TrimSpace(string(data)), "ref:")
		ref = strings.TrimSpace(ref)
		if !ok || !filepath.IsLocal(ref) {
			break
		}
		p = filepath.Join(r.commonDir, ref)
		if !smallRegularOrAbsent(p, gitReadMax) {
			return false
		}
	}
	return true
}

// gitFirstReads are the files of a git directory that git opens before
// any deadline can help, each with the largest size it may read whole
// (0: any size; the index is parsed entry by entry, see mostlyHoles).
var gitFirstReads = []struct {
	name string
	max  int64
}{
	{"config", gitConfigMax}, {"config.worktree", gitConfigMax}, {"HEAD", gitReadMax}, {"commondir", gitReadMax},
	{"index", 0}, {"packed-refs", 0}, {"shallow", 64 << 20}, {"info/grafts", 64 << 20},
}

// smallRegularOrAbsent reports whether p (followed) is absent, or a
// regular file of at most max bytes (any size when max is 0): never a
// FIFO or device git would wait on or read without end.
func smallRegularOrAbsent(p string, max int64) bool {
	fi, err := os.Stat(p)
	if err != nil {
		return true
	}
	return fi.Mode().IsRegular() && (max == 0 || fi.Size() <= max)
}

// gitReadMax is the largest size allowed for a file git reads whole into
// memory (plainFiles): far above any real HEAD, ref, commondir, config or
// alternates list.
const gitReadMax = 1 << 20

// gitConfigMax is the largest config file (a repository's, or one it
// includes) host git is let read: a config with thousands of branch
// sections stays far below it.
const gitConfigMax = 16 << 20

// alternatesOK follows the alternates chain from the object store objects
// as git does (objects/info/alternates lists further object stores, one a
// line, relative ones from the store that names them, '#' comments; git
// reads five levels below the repository's own): every alternates file on
// the way, and every store's commit-graph chain, must be a small regular
// file. A quoted entry (git's C-style
// quoting) is not followed here, so it fails.
func alternatesOK(objects string, depth int, seen map[string]bool) bool {
	if seen[objects] || depth > 6 {
		return true // git stops here too
	}
	seen[objects] = true
	// Each object store's commit-graph chain too: git reads it line by
	// line, one line of a sparse file without end.
	if !smallRegularOrAbsent(filepath.Join(objects, "info", "commit-graphs", "commit-graph-chain"), gitReadMax) {
		return false
	}
	p := filepath.Join(objects, "info", "alternates")
	if !exists(p) {
		return true
	}
	if !smallRegularOrAbsent(p, gitReadMax) {
		return false
	}
	f, err := os.Open(p)
	if err != nil {
		return true // git cannot read it either
	}
	data, err := io.ReadAll(io.LimitReader(f, gitReadMax+1))
	f.Close()
	if err != nil || len(data) > gitReadMax {
		return false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "\"") || strings.ContainsRune(line, 0) {
			return false
		}
		next := line
		if !filepath.IsAbs(next) {
			next = filepath.Join(objects, next)
		}
		if !alternatesOK(filepath.Clean(next), depth+1, seen) {
			return false
		}
	}
	return true
}

// gitTimeout bounds every git command vibedom runs on a workspace's
// repository: a FIFO planted deeper in .git (a ref, an object) would
// otherwise hang the session. Far above what reading the refs or the index
// of a large repository takes.
var gitTimeout = 5 * time.Minute

// findGitRepo finds the repository ws (absolute, symlink-free) is in, the
// way git's discovery does for a .git directory or a "gitdir:" file, without
// running git. ok is false when there is none.
func findGitRepo(ws string) (*gitRepo, bool) {
	for d := ws; ; d = filepath.Dir(d) {
		dot := filepath.Join(d, ".git")
		if fi, err := os.Stat(dot); err == nil { // git follows a .git symlink too
			r := &gitRepo{top: d}
			switch {
			case fi.IsDir():
				r.gitDir = dot
			case fi.Mode().IsRegular():
				// As git reads it: everything after "gitdir: ", newlines
				// trimmed at the end only (a newline inside is part of
				// the path).
				data, err := readSmallRegular(dot)
				target, ok := strings.CutPrefix(strings.TrimRight(string(data), "\r\n"), "gitdir: ")
				if err != nil || !ok || target == "" || strings.ContainsRune(target, 0) {
					return nil, false
				}
				if !filepath.IsAbs(target) {
					target = filepath.Join(d, target)
				}
				r.gitDir = target
			default:
				return nil, false
			}
			r.commonDir = r.gitDir
			if cd := filepath.Join(r.gitDir, "commondir"); exists(cd) {
				// Read as git does (newlines trimmed at the end only); one
				// that cannot be read so is no repository of ours.
				data, err := readSmallRegular(cd)
				c := strings.TrimRight(string(data), "\r\n")
				if err != nil || c == "" || strings.ContainsRune(c, 0) {
					return nil, false
				}
				if !filepath.IsAbs(c) {
					c = filepath.Join(r.gitDir, c)
				}
				r.commonDir = c
			}
			if _, err := os.Stat(filepath.Join(r.commonDir, "objects")); err != nil {
				return nil, false
			}
			if !r.plainFiles() {
				return nil, false
			}
			return r, true
		}
		if d == filepath.Dir(d) {
			return nil, false
		}
	}
}

// hostGitEnv is the environment of every git vibedom runs: no system or
// global config, no attributes file, home and XDG config in private (an
// empty directory), no prompts, no lazy fetch, no optional locks.
func hostGitEnv(private string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + private,
		"XDG_CONFIG_HOME=" + private,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=" + os.DevNull,
		"GIT_ATTR_NOSYSTEM=1",
		"GIT_CEILING_DIRECTORIES=" + filepath.Dir(private),
		"GIT_NO_LAZY_FETCH=1",
		"GIT_NO_REPLACE_OBJECTS=1",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C",
	}
}

// hostGitOverrides are passed on every command line too: belt and braces
// over the empty config.
var hostGitOverrides = []string{
	"-c", "core.fsmonitor=false", "-c", "core.quotepath=false", "-c", "diff.external=", "-c", "credential.helper=",
}

// privateGitDir makes an empty git directory: HEAD, refs/ and objects/, a
// config with nothing in it. The caller removes it.
func privateGitDir() (string, error) {
	dir, err := os.MkdirTemp("", "vibedom-git-")
	if err != nil {
		return "", fmt.Errorf("git: %w", err)
	}
	g := filepath.Join(dir, "git")
	for _, d := range []string{g, filepath.Join(g, "refs"), filepath.Join(g, "objects")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("git: %w", err)
		}
	}
	for name, text := range map[string]string{"HEAD": "ref: refs/heads/main\n", "config": ""} {
		if err := os.WriteFile(filepath.Join(g, name), []byte(text), 0o600); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("git: %w", err)
		}
	}
	return dir, nil
}

// runHostGit runs git with hostGitEnv plus extra environment, in dir, and
// returns its stdout.
func runHostGit(ctx context.Context, dir, private string, extra []string, args ...string) ([]byte, error) {
	return runHostGitInput(ctx, dir, private, extra, nil, args...)
}

// runHostGitInput is runHostGit with stdin (nil: none).
func runHostGitInput(ctx context.Context, dir, private string, extra []string, stdin io.Reader, args ...string) ([]byte, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return nil, errNoGit
	}
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", append(append([]string{}, hostGitOverrides...), args...)...)
	cmd.Dir = dir
	cmd.Stdin = stdin
	cmd.Env = withoutUnset(append(hostGitEnv(private), extra...))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("git %s did not finish within %v in %s: is a file under its .git a FIFO or on a stalled mount?",
			strings.Join(args, " "), gitTimeout, DisplayPath(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// repoGit runs a git command that reads ws's repository's index, objects
// and work tree, and nothing of its config (see the top of this file). dir
// is where it runs (paths come out relative to it); ws must be in the
// repository.
func repoGit(ctx context.Context, ws string, args ...string) ([]byte, error) {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	r, ok := findGitRepo(real)
	if !ok {
		return nil, fmt.Errorf("git: %s is not in a repository", ws)
	}
	private, err := privateGitDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	return runHostGit(ctx, real, private, []string{
		"GIT_DIR=" + filepath.Join(private, "git"),
		"GIT_OBJECT_DIRECTORY=" + filepath.Join(r.commonDir, "objects"),
		"GIT_INDEX_FILE=" + filepath.Join(r.gitDir, "index"),
		"GIT_WORK_TREE=" + r.top,
	}, args...)
}

// repoHooksDir is the absolute directory git runs ws's repository's hooks
// from: core.hooksPath when the repository's config sets it, else hooks/ in
// its git directory. This one command lets git read the repository's config
// (that is the question); `git rev-parse` reads no index, no attributes and
// no hooks, and runs nothing.
func repoHooksDir(ctx context.Context, ws string) (string, error) {
	out, err := userConfigGit(ctx, ws, "rev-parse", "--path-format=absolute", "--git-path", "hooks")
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(out), "\n"), nil
}

// userConfigGit runs a git command that reads ws's repository's config as
// the user's own git does (with the user's global and system config: a
// core.hooksPath or a hook command set there counts for this repository
// too), with the rest of hostGitEnv. Only commands that read config and run
// nothing (rev-parse, config) go through here. It runs in the repository's
// top directory, so relative paths in its output are relative to that.
func userConfigGit(ctx context.Context, ws string, args ...string) ([]byte, error) {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	r, ok := findGitRepo(real)
	if !ok {
		return nil, fmt.Errorf("git: %s is not in a repository", ws)
	}
	private, err := os.MkdirTemp("", "vibedom-git-")
	if err != nil {
		return nil, fmt.Errorf("git: %w", err)
	}
	defer os.RemoveAll(private)
	for _, f := range []string{filepath.Join(r.commonDir, "config"), filepath.Join(r.gitDir, "config.worktree")} {
		if err := configIncludesOK(ctx, private, f, 0); err != nil {
			return nil, err
		}
	}
	user := []string{"GIT_DIR=" + r.gitDir, "GIT_WORK_TREE=" + r.top, "GIT_CONFIG_NOSYSTEM=", "GIT_CONFIG_GLOBAL="}
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME"} {
		user = append(user, k+"="+os.Getenv(k))
	}
	return runHostGit(ctx, r.top, private, user, args...)
}

// configIncludesOK checks the config files git includes from the config
// file p (include.path and every includeIf's path, whatever its condition,
// followed as git does, ten deep): git reads an included file to its end,
// so a FIFO, a device (/dev/tty: the user's keystrokes) or a sparse file of
// many GiB there would have host git hang, read the terminal or allocate
// without end. Each must be absent or a regular file of at most gitConfigMax.
// p itself is read with includes off (git config --file).
func configIncludesOK(ctx context.Context, private, p string, depth int) error {
	fi, err := os.Stat(p)
	if err != nil {
		return nil // git skips a missing include too
	}
	if !fi.Mode().IsRegular() || fi.Size() > gitConfigMax {
		return fmt.Errorf("git: the repository's config includes %s, which is not a regular file of at most 16 MiB: not read", DisplayPath(p))
	}
	if depth >= 10 {
		return nil // git refuses deeper includes itself
	}
	out, err := runHostGit(ctx, private, private, nil, "config", "--file", p, "--no-includes", "-z", "--get-regexp", `^include(if\..*)?\.path$`)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			return nil // no include
		}
		return err
	}
	for rec := range strings.SplitSeq(string(out), "\x00") {
		_, inc, ok := strings.Cut(rec, "\n")
		if !ok || inc == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(inc, "~/"); ok {
			home, err := os.UserHomeDir()
			if err != nil {
				continue // git cannot expand it either
			}
			inc = filepath.Join(home, rest)
		} else if !filepath.IsAbs(inc) {
			inc = filepath.Join(filepath.Dir(p), inc)
		}
		if err := configIncludesOK(ctx, private, inc, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// configEntry is one setting of `git config --list --show-origin`.
type configEntry struct {
	origin string // the file it is set in, absolute ("" when not a file)
	key    string // lower-cased section and name, the subsection as written
	value  string
}

// repoConfig is every setting git sees for ws's repository: its own config
// with what it includes, the user's global and the system's (see
// userConfigGit), read with `git config --list`, which runs nothing. top is
// the repository's top directory, where git runs the programs it names.
func repoConfig(ctx context.Context, ws string) (top string, entries []configEntry, err error) {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return "", nil, fmt.Errorf("git: %w", err)
	}
	r, ok := findGitRepo(real)
	if !ok {
		return "", nil, fmt.Errorf("git: %s is not in a repository", ws)
	}
	out, err := userConfigGit(ctx, real, "config", "--list", "-z", "--show-origin", "--show-scope")
	if err != nil {
		return "", nil, err
	}
	// Each entry: scope NUL origin NUL key LF value NUL.
	f := strings.Split(string(out), "\x00")
	for i := 0; i+2 < len(f); i += 3 {
		if f[i] == "command" {
			continue // hostGitOverrides
		}
		e := configEntry{}
		if o, ok := strings.CutPrefix(f[i+1], "file:"); ok {
			if !filepath.IsAbs(o) {
				o = filepath.Join(r.top, o)
			}
			e.origin = filepath.Clean(o)
		}
		e.key, e.value, _ = strings.Cut(f[i+2], "\n")
		entries = append(entries, e)
	}
	return r.top, entries, nil
}

// withoutUnset keeps the last value of each variable in env and drops the
// variables whose last value is empty: an extra "NAME=" unsets what
// hostGitEnv set (git takes an empty GIT_CONFIG_GLOBAL as a file name).
func withoutUnset(env []string) []string {
	last := map[string]string{}
	var order []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, seen := last[k]; !seen {
			order = append(order, k)
		}
		last[k] = v
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		if last[k] != "" {
			out = append(out, k+"="+last[k])
		}
	}
	return out
}

// exists reports whether p is there (a dangling symlink is).
func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// readSmallRegular reads a file of git's discovery (".git" as a file,
// commondir) only when it is a regular file of at most 4 KiB: a FIFO there
// would block the session's start for good.
func readSmallRegular(p string) ([]byte, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > 4<<10 {
		return nil, fmt.Errorf("%s is not a small regular file", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<10))
}
