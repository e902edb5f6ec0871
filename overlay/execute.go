//go:build unix

package overlay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Report is what Apply did.
type Report struct {
	Plan *Plan
	// BackupID names the backup folder (under the session's backups/) that
	// Undo uses; "" when nothing was written.
	BackupID string
	// Results maps each path of the plan to what happened to it.
	Results map[string]string
	// Applied lists the paths written or removed.
	Applied []string
	// Failed lists paths that could not be applied, with the reason.
	Failed []FileError
}

// FileError is one path that failed.
type FileError struct {
	Path string
	Err  error
}

// ErrApplyIncomplete means an apply stopped part way. Nothing is left
// half-written: every path is either as before or as the patch says. Undo
// returns to before; applying again finishes the rest.
var ErrApplyIncomplete = errors.New("apply incomplete")

// action is one path to change.
type action struct {
	pf     *PlannedFile
	path   string
	prior  snapshot
	after  snapshot
	data   []byte
	seq    int
	tmp    string // staged temp (slash path)
	staged bool
}

// testHookBeforeExecute runs after planning and resolving, before anything
// is written (tests swap directories for symlinks here).
var testHookBeforeExecute func()

// testHookStaged runs when one file is staged, before its batch is made
// durable (a test kills the process here).
var testHookStaged func()

// testHookAfterStage runs when a batch is staged and not yet renamed (a test
// kills the process here).
var testHookAfterStage func()

// Apply plans the patch (see MakePlan), asks opts.Resolve about conflicts,
// backs up everything it will overwrite or delete into a new folder under
// the session's backups/, and writes the changes: atomically per file
// (temporary file in the same directory, synced, renamed), re-resolving
// every path without symlinks at write time. Protected and refused paths are
// left alone and reported.
func Apply(ctx context.Context, opts ApplyOptions) (*Report, error) {
	pl, err := MakePlan(ctx, opts)
	if err != nil {
		return nil, err
	}
	return Execute(ctx, pl, opts)
}

// Execute carries out a plan made by MakePlan with the same options, in
// the phases of an applier: decide, journal, remove files, remove emptied
// directories, then write in batches (journal the directories, stage,
// commit), and finish. Whenever the process dies, every path is either as
// before or as the patch says, and the backup folder records enough for
// Undo to return to before (see each phase).
func Execute(ctx context.Context, pl *Plan, opts ApplyOptions) (*Report, error) {
	if opts.SessionDir == "" {
		return nil, errors.New("apply: a session folder is needed for the backups undo uses")
	}
	unlock, err := lockSession(opts.SessionDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	x := &applier{ctx: ctx, opts: opts, log: opts.log(), rep: &Report{Plan: pl, Results: map[string]string{}}}
	x.decide(pl)
	if x.root, err = openHostRoot(opts.Workspace); err != nil {
		return x.rep, err
	}
	defer x.root.Close()
	// Temporary files an apply or undo killed part way left behind go
	// first, whatever this apply does.
	if err := cleanInterrupted(x.root, opts.SessionDir, x.log); err != nil {
		return x.rep, err
	}
	if len(x.acts) == 0 {
		return x.rep, nil
	}
	if testHookBeforeExecute != nil {
		testHookBeforeExecute()
	}
	if err := x.journal(); err != nil {
		return x.rep, err
	}
	defer x.j.close()
	x.removeFiles()
	x.removeEmptiedDirs()
	x.writeAll()
	return x.rep, x.finish()
}

// applier is one Execute: the plan's actions and how far they got. A phase
// that hits an error the apply cannot go on past records it in fatal; every
// later phase then does nothing but finish.
type applier struct {
	ctx  context.Context
	opts ApplyOptions
	log  *slog.Logger
	rep  *Report
	root *hostRoot
	j    *journal
	// acts is every path to change, removals first, then writes, each
	// group sorted by path; removals and writes are its two halves.
	acts, removals, writes []*action
	// removedParents holds the ancestors of the files removed;
	// writeAncestors those of the files to write.
	removedParents, writeAncestors map[string]bool
	// madeDirs holds the directories journaled as made.
	madeDirs map[string]bool
	fatal    error
}

// decide turns each planned file into an action, asking opts.Resolve
// about conflicts, and reports the paths left alone. It touches nothing on
// disk.
func (x *applier) decide(pl *Plan) {
	for _, pf := range pl.Files {
		data, final, ok := x.content(pf)
		if !ok {
			continue
		}
		a := &action{pf: pf, path: pf.Path, data: data}
		a.prior = snapshotOf(pf.cur, pf.curData)
		a.after = snapshot{Type: final}
		switch final {
		case TypeFile:
			a.after.Perm, a.after.Blob = newPerm(pf), blobID(data)
		case TypeSymlink:
			a.after.Target = string(data)
		}
		x.acts = append(x.acts, a)
	}
	// Removals first (a type change removes, then creates), then writes.
	slices.SortStableFunc(x.acts, func(a, b *action) int {
		ra, rb := a.after.Type != "", b.after.Type != ""
		if ra != rb {
			if !ra {
				return -1
			}
			return 1
		}
		return strings.Compare(a.path, b.path)
	})
	x.removedParents, x.writeAncestors, x.madeDirs = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, a := range x.acts {
		if a.after.Type == "" {
			x.removals = append(x.removals, a)
			continue
		}
		x.writes = append(x.writes, a)
		for d := parentDir(a.path); d != ""; d = parentDir(d) {
			x.writeAncestors[d] = true
		}
	}
}

// content is what pf's path gets (its data and type), or ok false when the
// path is left as it is (its result then reported).
func (x *applier) content(pf *PlannedFile) (data []byte, final FileType, ok bool) {
	final = pf.newT
	switch pf.Status {
	case StatusApply:
		return pf.newData, final, true
	case StatusMerged:
		return pf.merged, final, true
	case StatusConflict:
		res := KeepMine
		if x.opts.Resolve != nil {
			res = x.opts.Resolve(pf.Conflict)
		}
		if !slices.Contains(pf.Conflict.Options, res) {
			res = KeepMine
		}
		switch res {
		case KeepMine:
			x.rep.Results[pf.Path] = "conflict: kept yours"
			return nil, "", false
		case TakeAgent:
			data = pf.newData
		case WriteMarks:
			data, final = pf.marks, TypeFile
		}
		return data, final, true
	}
	x.rep.Results[pf.Path] = string(pf.Status)
	if pf.Why != "" && pf.Status != StatusAlready && pf.Status != StatusSkipped {
		x.rep.Results[pf.Path] += ": " + pf.Why
	}
	return nil, "", false
}

// journal makes the backup folder (meta.json in state applying), backs up
// the prior content of every file the apply overwrites or removes into its
// pack, and writes one "file" entry per action (prior and after state, the
// name of its temporary file), all durable before it returns. Nothing in
// the workspace is touched: dying during or after it leaves a backup
// folder in state applying (a torn last journal line is ignored) whose
// every path is still as before; the next apply or undo marks it
// incomplete, and undoing it restores nothing.
// On an error the journal is closed; on success Execute closes it.
func (x *applier) journal() (err error) {
	j, err := newJournal(x.opts.SessionDir, x.opts.Workspace, "", "")
	if err != nil {
		return err
	}
	x.j = j
	x.rep.BackupID = j.id
	defer func() {
		if err != nil {
			j.close()
		}
	}()
	for i, a := range x.acts {
		a.seq = i + 1
		var ref *backupRef
		if a.prior.Type == TypeFile {
			if ref, err = j.backup(a.pf.curData); err != nil {
				return err
			}
		}
		if a.after.Type != "" {
			a.tmp = join(parentDir(a.path), tempPrefix+randomNonce()+"-"+shortName(filepath.Base(a.path)))
		}
		if err := j.add(journalEntry{Seq: a.seq, Kind: "file", Path: a.path, Prior: a.prior, After: a.after, Tmp: a.tmp, Backup: ref}); err != nil {
			return err
		}
	}
	return j.sync()
}

// removeFiles removes the files and symlinks the patch deletes or whose
// type it changes, each after checking it is still as planned. Each
// removal is one unlink of a path journaled with its backup: dying during
// it leaves some paths removed, each of which Undo restores.
func (x *applier) removeFiles() {
	for _, a := range x.commit(x.removals, true) {
		for d := parentDir(a.path); d != ""; d = parentDir(d) {
			x.removedParents[d] = true
		}
	}
}

// removeEmptiedDirs removes the directories the removals emptied, deepest
// first (as git does), unless something is written into them; then makes
// the workspace and the journal durable. Each directory's "rmdir" entry is
// durable before it goes: dying at any point, Undo makes again every
// directory removed.
func (x *applier) removeEmptiedDirs() {
	if x.fatal != nil {
		return
	}
	dirs := make([]string, 0, len(x.removedParents))
	for d := range x.removedParents {
		if !x.writeAncestors[d] {
			dirs = append(dirs, d)
		}
	}
	slices.SortFunc(dirs, func(a, b string) int {
		if c := strings.Count(b, "/") - strings.Count(a, "/"); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	for _, d := range dirs {
		names, err := x.root.readDirNames(d)
		if err != nil || names == nil || len(names) > 0 {
			continue
		}
		e, err := x.root.lstat(d)
		if err != nil || e.Type != TypeDir {
			continue
		}
		if err := x.j.add(journalEntry{Kind: "rmdir", Path: d, Prior: snapshot{Type: TypeDir, Perm: e.Mode}}); err != nil {
			x.fatal = err
			return
		}
		if err := x.j.sync(); err != nil {
			x.fatal = err
			return
		}
		if err := x.root.remove(d, true); err != nil {
			x.log.Debug("remove emptied directory", "dir", DisplayPath(d), "err", err)
		}
	}
	x.fatal = errors.Join(x.root.sync(), x.j.sync())
}

// writeBatch is how many files are staged before they are committed.
const writeBatch = 512

// writeAll writes the new files and symlinks, writeBatch at a time: the
// directories the batch needs journaled, the batch staged and made
// durable, then committed, then its leftovers removed (see writeBatchOf).
func (x *applier) writeAll() {
	for start := 0; start < len(x.writes) && x.fatal == nil; start += writeBatch {
		x.writeBatchOf(x.writes[start:min(start+writeBatch, len(x.writes))])
	}
}

// writeBatchOf writes one batch. The directories it will make are in the
// journal, durable, before any is made; each file is staged under the
// temporary name its journal entry holds, in its target's directory; the
// batch is durable before any rename. Dying while it stages leaves
// temporary files that the next apply or undo removes, and directories
// Undo removes; dying while it commits leaves each path as before or as
// the patch says. Whatever was staged and not committed is removed.
func (x *applier) writeBatchOf(batch []*action) {
	if err := journalMissingDirs(x.root, x.j, batch, x.madeDirs); err != nil {
		x.fatal = err
		return
	}
	x.stage(batch)
	if x.fatal == nil {
		x.fatal = errors.Join(x.root.sync(), x.j.sync())
	}
	if testHookAfterStage != nil {
		testHookAfterStage()
	}
	x.commit(batch, false)
	for _, a := range batch {
		if a.staged {
			x.root.remove(a.tmp, false)
		}
	}
	if err := errors.Join(x.root.sync(), x.j.sync()); err != nil && x.fatal == nil {
		x.fatal = err
	}
}

// stage writes each action's new content next to its target under its
// journaled temporary name, journaling any directory made that was not
// journaled before. A path with a symlink in the way fails alone.
func (x *applier) stage(batch []*action) {
	for _, a := range batch {
		if err := x.ctx.Err(); err != nil {
			x.fatal = err
			return
		}
		var created []string
		var err error
		nonce := strings.TrimPrefix(filepath.Base(a.tmp), tempPrefix)[:12]
		if a.after.Type == TypeSymlink {
			_, created, err = x.root.stageSymlink(a.path, a.after.Target, nonce)
		} else {
			_, created, err = x.root.stageFile(a.path, a.data, a.after.Perm, nonce)
		}
		for _, d := range created {
			if x.madeDirs[d] {
				continue // journaled before it was made
			}
			if jerr := x.j.add(journalEntry{Kind: "mkdir", Path: d, After: snapshot{Type: TypeDir}}); jerr != nil {
				x.fatal = jerr
			}
		}
		if err != nil {
			if errors.Is(err, ErrSymlinkInPath) {
				x.failed(a, fmt.Errorf("%w; refusing to write through it", err))
				continue
			}
			x.fatal = fmt.Errorf("%s: %w", DisplayPath(a.path), err)
			return
		}
		a.staged = true
		if testHookStaged != nil {
			testHookStaged()
		}
	}
}

// commit puts each action in place in order (a removal, or a staged file
// renamed over its target), after checking its path still holds the
// planned prior state; a path changed meanwhile, or with a symlink in the
// way, fails alone. cancelable checks ctx before each path (removals, which
// have no staging where a cancel is noticed). It returns the actions
// committed. Each commit is one unlink or rename: dying at any point leaves
// every path as before or as the patch says.
func (x *applier) commit(acts []*action, cancelable bool) (committed []*action) {
	for _, a := range acts {
		if x.fatal != nil {
			break
		}
		if cancelable {
			if err := x.ctx.Err(); err != nil {
				x.fatal = err
				break
			}
		}
		if a.after.Type != "" && !a.staged {
			continue
		}
		if err := commitAction(x.root, a); err != nil {
			if errors.Is(err, errChangedMeanwhile) || errors.Is(err, ErrSymlinkInPath) {
				x.failed(a, err)
				continue
			}
			x.fatal = fmt.Errorf("%s: %w", DisplayPath(a.path), err)
			break
		}
		a.staged = false
		x.rep.Applied = append(x.rep.Applied, a.path)
		x.rep.Results[a.path] = resultText(a)
		committed = append(committed, a)
	}
	return committed
}

// failed reports one path that could not be applied.
func (x *applier) failed(a *action, err error) {
	x.rep.Failed = append(x.rep.Failed, FileError{a.path, err})
	x.rep.Results[a.path] = "failed: " + err.Error()
	x.log.Debug("apply failed", "path", DisplayPath(a.path), "err", err)
}

// finish marks the backup folder applied, or incomplete when a phase
// stopped, and says what to do next. Dying before it leaves the folder in
// state applying, which the next apply or undo marks incomplete.
func (x *applier) finish() error {
	state := stateApplied
	if x.fatal != nil {
		state = stateIncomplete
	}
	if err := x.j.finish(state); err != nil && x.fatal == nil {
		x.fatal = err
	}
	if x.fatal != nil {
		return fmt.Errorf("%w: %v; nothing is half-written: `vibedom undo` returns to before, `vibedom apply` again finishes the rest", ErrApplyIncomplete, x.fatal)
	}
	return nil
}

// journalMissingDirs adds a "mkdir" entry for every directory the batch's
// files need that the host lacks (parents before children, each once), and
// makes the journal durable. A directory planned and then not made (the
// apply stopped first) is not there for undo to remove: no harm.
func journalMissingDirs(root *hostRoot, j *journal, batch []*action, planned map[string]bool) error {
	added := false
	for _, a := range batch {
		var dirs []string
		for d := parentDir(a.path); d != ""; d = parentDir(d) {
			dirs = append(dirs, d)
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			d := dirs[i]
			if planned[d] {
				continue
			}
			e, err := root.lstat(d)
			if err != nil {
				break // a symlink in the way: staging refuses it
			}
			if e.Type != "" {
				continue
			}
			planned[d] = true
			if err := j.add(journalEntry{Kind: "mkdir", Path: d, After: snapshot{Type: TypeDir}}); err != nil {
				return err
			}
			added = true
		}
	}
	if !added {
		return nil
	}
	return j.sync()
}

func resultText(a *action) string {
	switch {
	case a.after.Type == "":
		return "deleted"
	case a.pf.Status == StatusMerged:
		return "merged"
	case a.pf.Status == StatusConflict && a.pf.marks != nil && a.after.Blob == blobID(a.pf.marks):
		return "conflict: markers written"
	case a.pf.Status == StatusConflict:
		return "conflict: took the agent's"
	}
	return "applied"
}

func snapshotOf(e hostEntry, data []byte) snapshot {
	s := snapshot{Type: e.Type}
	switch e.Type {
	case TypeFile:
		s.Perm, s.Blob = e.Mode, blobID(data)
	case TypeSymlink:
		s.Target = e.Target
	case TypeDir:
		s.Perm = e.Mode
	}
	return s
}

// newPerm is the permission bits a written file gets: the host file's own,
// with the executable bits following the patch's mode change; 0644 or 0755
// for a new file.
func newPerm(pf *PlannedFile) uint32 {
	exec := pf.newGitMode == ModeExec
	if pf.curT != TypeFile {
		if exec {
			return 0o755
		}
		return 0o644
	}
	perm := pf.cur.Mode & 0o777
	switch {
	case pf.newGitMode == 0 || pf.newGitMode == pf.oldGitMode:
	case exec:
		perm |= (perm & 0o444) >> 2
	default:
		perm &^= 0o111
	}
	return perm
}

var errChangedMeanwhile = errors.New("changed on the host while applying; left alone")

// commitAction checks the path still holds its prior state and puts the
// staged content in place (or removes the path).
func commitAction(root *hostRoot, a *action) error {
	dir, base := splitParent(a.path)
	dfd, _, err := root.openDir(dir, a.after.Type != "")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && a.after.Type == "" {
			return nil // already gone
		}
		return err
	}
	defer unix.Close(dfd)
	cur, err := fstatatEntry(dfd, base, a.path)
	if err != nil {
		return err
	}
	p := a.pf.cur
	if cur.Type != p.Type || (cur.Type != "" && (cur.Ino != p.Ino || cur.Size != p.Size || cur.Mtime != p.Mtime || cur.Target != p.Target)) {
		return errChangedMeanwhile
	}
	if a.after.Type == "" {
		if cur.Type == "" {
			return nil
		}
		if err := unix.Unlinkat(dfd, base, 0); err != nil {
			return fmt.Errorf("remove: %w", err)
		}
		return nil
	}
	_, tbase := splitParent(a.tmp)
	if err := unix.Renameat(dfd, tbase, dfd, base); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	if !batchSync {
		unix.Fsync(dfd)
	}
	return nil
}

// randomNonce is 12 hex digits for temporary names.
func randomNonce() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
