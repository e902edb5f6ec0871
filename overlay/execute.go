//go:build unix

package overlay

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/atomicfile"
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

// snapshot is the state of one path, for the journal.
type snapshot struct {
	Type   FileType `json:"type,omitempty"`
	Perm   uint32   `json:"perm,omitempty"`
	Blob   string   `json:"blob,omitempty"`
	Target string   `json:"target,omitempty"`
}

// backupRef locates a backed-up content in the backup folder's pack file.
type backupRef struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// journalEntry is one line of a backup folder's journal.jsonl.
type journalEntry struct {
	Seq   int      `json:"seq"`
	Kind  string   `json:"kind"` // "file", "mkdir", "rmdir"
	Path  string   `json:"path,omitempty"`
	Prior snapshot `json:"prior"`
	After snapshot `json:"after"`
	Tmp   string   `json:"tmp,omitempty"`
	// Backup is where the prior content of a file is kept.
	Backup *backupRef `json:"backup,omitempty"`
}

type backupMeta struct {
	Version   int       `json:"version"`
	Workspace string    `json:"workspace"`
	Created   time.Time `json:"created"`
	State     string    `json:"state"` // applying, applied, incomplete, partial (an undo kept paths), undone
	// Kind is "" for an apply, "undo" for what an undo overwrote (undone
	// only when named); Of is the backup that undo reverted.
	Kind string `json:"kind,omitempty"`
	Of   string `json:"of,omitempty"`
}

// Backup states and kinds.
const (
	stateApplying   = "applying"
	stateApplied    = "applied"
	stateIncomplete = "incomplete"
	statePartial    = "partial"
	stateUndone     = "undone"
	kindUndo        = "undo"
)

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

// Execute carries out a plan made by MakePlan with the same options.
func Execute(ctx context.Context, pl *Plan, opts ApplyOptions) (*Report, error) {
	if opts.SessionDir == "" {
		return nil, errors.New("apply: a session folder is needed for the backups undo uses")
	}
	log := opts.log()
	unlock, err := lockSession(opts.SessionDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rep := &Report{Plan: pl, Results: map[string]string{}}
	var acts []*action
	for _, pf := range pl.Files {
		var data []byte
		final := pf.newT
		switch pf.Status {
		case StatusApply:
			data = pf.newData
		case StatusMerged:
			data = pf.merged
		case StatusConflict:
			res := KeepMine
			if opts.Resolve != nil {
				res = opts.Resolve(pf.Conflict)
			}
			if !slices.Contains(pf.Conflict.Options, res) {
				res = KeepMine
			}
			switch res {
			case KeepMine:
				rep.Results[pf.Path] = "conflict: kept yours"
				continue
			case TakeAgent:
				data = pf.newData
			case WriteMarks:
				data, final = pf.marks, TypeFile
			}
		default:
			rep.Results[pf.Path] = string(pf.Status)
			if pf.Why != "" && pf.Status != StatusAlready && pf.Status != StatusSkipped {
				rep.Results[pf.Path] += ": " + pf.Why
			}
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
		acts = append(acts, a)
	}
	root, err := openHostRoot(opts.Workspace)
	if err != nil {
		return rep, err
	}
	defer root.Close()
	// Temporary files an apply or undo killed part way left behind go
	// first, whatever this apply does.
	if err := cleanInterrupted(root, opts.SessionDir, log); err != nil {
		return rep, err
	}
	if len(acts) == 0 {
		return rep, nil
	}
	if testHookBeforeExecute != nil {
		testHookBeforeExecute()
	}
	// Removals first (a type change removes, then creates), then writes.
	slices.SortStableFunc(acts, func(a, b *action) int {
		ra, rb := a.after.Type != "", b.after.Type != ""
		if ra != rb {
			if !ra {
				return -1
			}
			return 1
		}
		return strings.Compare(a.path, b.path)
	})
	j, err := newJournal(opts.SessionDir, opts.Workspace, "", "")
	if err != nil {
		return rep, err
	}
	defer j.close()
	rep.BackupID = j.id
	// Back up and record every prior state before touching anything.
	for i, a := range acts {
		a.seq = i + 1
		var ref *backupRef
		if a.prior.Type == TypeFile {
			if ref, err = j.backup(a.pf.curData); err != nil {
				return rep, err
			}
		}
		if a.after.Type != "" {
			a.tmp = join(parentDir(a.path), tempPrefix+randomNonce()+"-"+shortName(filepath.Base(a.path)))
		}
		if err := j.add(journalEntry{Seq: a.seq, Kind: "file", Path: a.path, Prior: a.prior, After: a.after, Tmp: a.tmp, Backup: ref}); err != nil {
			return rep, err
		}
	}
	if err := j.sync(); err != nil {
		return rep, err
	}
	fail := func(a *action, err error) {
		rep.Failed = append(rep.Failed, FileError{a.path, err})
		rep.Results[a.path] = "failed: " + err.Error()
		log.Debug("apply failed", "path", DisplayPath(a.path), "err", err)
	}
	var fatal error
	removedParents := map[string]bool{}
	writeAncestors := map[string]bool{}
	var removals, writes []*action
	for _, a := range acts {
		if a.after.Type == "" {
			removals = append(removals, a)
			continue
		}
		writes = append(writes, a)
		for d := parentDir(a.path); d != ""; d = parentDir(d) {
			writeAncestors[d] = true
		}
	}
	done := func(a *action) {
		a.staged = false
		rep.Applied = append(rep.Applied, a.path)
		rep.Results[a.path] = resultText(a)
	}
	// Removals first: a type change removes, then creates.
	for _, a := range removals {
		if err := ctx.Err(); err != nil {
			fatal = err
			break
		}
		if err := commit(root, a); err != nil {
			if errors.Is(err, errChangedMeanwhile) || errors.Is(err, ErrSymlinkInPath) {
				fail(a, err)
				continue
			}
			fatal = fmt.Errorf("%s: %w", DisplayPath(a.path), err)
			break
		}
		done(a)
		for d := parentDir(a.path); d != ""; d = parentDir(d) {
			removedParents[d] = true
		}
	}
	// Directories the removals emptied go too, deepest first (as git does),
	// unless something is written into them.
	if fatal == nil && len(removedParents) > 0 {
		dirs := make([]string, 0, len(removedParents))
		for d := range removedParents {
			if !writeAncestors[d] {
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
			names, err := root.readDirNames(d)
			if err != nil || names == nil || len(names) > 0 {
				continue
			}
			e, err := root.lstat(d)
			if err != nil || e.Type != TypeDir {
				continue
			}
			if err := j.add(journalEntry{Kind: "rmdir", Path: d, Prior: snapshot{Type: TypeDir, Perm: e.Mode}}); err != nil {
				fatal = err
				break
			}
			if err := j.sync(); err != nil {
				fatal = err
				break
			}
			if err := root.remove(d, true); err != nil {
				log.Debug("remove emptied directory", "dir", DisplayPath(d), "err", err)
			}
		}
	}
	if fatal == nil {
		if err := errors.Join(root.sync(), j.sync()); err != nil {
			fatal = err
		}
	}
	const chunk = 512
	madeDirs := map[string]bool{}
	for start := 0; start < len(writes) && fatal == nil; start += chunk {
		batch := writes[start:min(start+chunk, len(writes))]
		// The directories the batch will make are in the journal, durable,
		// before any is made: undo removes them even when the apply is
		// killed right after a mkdir.
		if err := journalMissingDirs(root, j, batch, madeDirs); err != nil {
			fatal = err
			break
		}
		// Stage the new contents next to their targets.
		for _, a := range batch {
			if err := ctx.Err(); err != nil {
				fatal = err
				break
			}
			var created []string
			var err error
			nonce := strings.TrimPrefix(filepath.Base(a.tmp), tempPrefix)[:12]
			if a.after.Type == TypeSymlink {
				_, created, err = root.stageSymlink(a.path, a.after.Target, nonce)
			} else {
				_, created, err = root.stageFile(a.path, a.data, a.after.Perm, nonce)
			}
			for _, d := range created {
				if madeDirs[d] {
					continue // journaled before it was made
				}
				if jerr := j.add(journalEntry{Kind: "mkdir", Path: d, After: snapshot{Type: TypeDir}}); jerr != nil {
					fatal = jerr
				}
			}
			if err != nil {
				if errors.Is(err, ErrSymlinkInPath) {
					fail(a, fmt.Errorf("%w; refusing to write through it", err))
					continue
				}
				fatal = fmt.Errorf("%s: %w", DisplayPath(a.path), err)
				break
			}
			a.staged = true
			if testHookStaged != nil {
				testHookStaged()
			}
		}
		if fatal == nil {
			if err := errors.Join(root.sync(), j.sync()); err != nil {
				fatal = err
			}
		}
		if testHookAfterStage != nil {
			testHookAfterStage()
		}
		// Commit: check the host is still as planned, then rename.
		for _, a := range batch {
			if fatal != nil {
				break
			}
			if !a.staged {
				continue
			}
			if err := commit(root, a); err != nil {
				if errors.Is(err, errChangedMeanwhile) || errors.Is(err, ErrSymlinkInPath) {
					fail(a, err)
					continue
				}
				fatal = fmt.Errorf("%s: %w", DisplayPath(a.path), err)
				break
			}
			done(a)
		}
		// Anything staged and not committed goes away.
		for _, a := range batch {
			if a.staged {
				root.remove(a.tmp, false)
			}
		}
		if err := errors.Join(root.sync(), j.sync()); err != nil && fatal == nil {
			fatal = err
		}
	}
	state := stateApplied
	if fatal != nil {
		state = stateIncomplete
	}
	if err := j.finish(state); err != nil && fatal == nil {
		fatal = err
	}
	if fatal != nil {
		return rep, fmt.Errorf("%w: %v; nothing is half-written: `vibedom undo` returns to before, `vibedom apply` again finishes the rest", ErrApplyIncomplete, fatal)
	}
	return rep, nil
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

// commit checks the path still holds its prior state and puts the staged
// content in place (or removes the path).
func commit(root *hostRoot, a *action) error {
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

// journal is a backup folder: journal.jsonl, meta.json and backups.pack
// (the prior contents, one after another; the journal holds their offsets).
type journal struct {
	dir    string
	id     string
	f      *os.File
	w      *bufio.Writer
	pack   *os.File
	packW  *bufio.Writer
	packN  int64
	packed map[string]*backupRef
	meta   backupMeta
}

func newJournal(sessionDir, workspace, kind, of string) (*journal, error) {
	base := filepath.Join(sessionDir, BackupsDir)
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fmt.Errorf("make backup folder: %w", err)
	}
	var id, dir string
	for i := 0; ; i++ {
		id = time.Now().UTC().Format("20060102-150405.000000")
		if i > 0 {
			id += fmt.Sprintf("-%d", i)
		}
		dir = filepath.Join(base, id)
		if err := os.Mkdir(dir, 0o700); err == nil {
			break
		} else if !errors.Is(err, os.ErrExist) || i > 100 {
			return nil, fmt.Errorf("make backup folder: %w", err)
		}
	}
	pack, err := os.OpenFile(filepath.Join(dir, packName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("make backup folder: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "journal.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		pack.Close()
		return nil, fmt.Errorf("make journal: %w", err)
	}
	j := &journal{dir: dir, id: id, f: f, w: bufio.NewWriter(f), pack: pack, packW: bufio.NewWriterSize(pack, 1<<20),
		packed: map[string]*backupRef{}, meta: backupMeta{Version: 1, Workspace: workspace, Created: time.Now().UTC(), State: stateApplying, Kind: kind, Of: of}}
	if err := j.writeMeta(); err != nil {
		j.close()
		return nil, err
	}
	return j, nil
}

func (j *journal) writeMeta() error {
	data, _ := json.MarshalIndent(j.meta, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(j.dir, "meta.json"), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write backup meta: %w", err)
	}
	return nil
}

func (j *journal) add(e journalEntry) error {
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	j.w.Write(data)
	return j.w.WriteByte('\n')
}

// packName is the file holding a backup folder's contents.
const packName = "backups.pack"

// backup appends content to the pack (once per distinct content).
func (j *journal) backup(data []byte) (*backupRef, error) {
	id := blobID(data)
	if ref, ok := j.packed[id]; ok {
		return ref, nil
	}
	if _, err := j.packW.Write(data); err != nil {
		return nil, fmt.Errorf("back up: %w", err)
	}
	ref := &backupRef{Off: j.packN, Len: int64(len(data))}
	j.packN += int64(len(data))
	j.packed[id] = ref
	return ref, nil
}

// sync makes the journal and the backups durable.
func (j *journal) sync() error {
	if err := j.packW.Flush(); err != nil {
		return fmt.Errorf("write backups: %w", err)
	}
	if err := j.w.Flush(); err != nil {
		return fmt.Errorf("write journal: %w", err)
	}
	if batchSync {
		if err := syncFS(int(j.f.Fd())); err != nil {
			return fmt.Errorf("sync backups: %w", err)
		}
		return nil
	}
	return errors.Join(j.pack.Sync(), j.f.Sync())
}

func (j *journal) finish(state string) error {
	if err := j.sync(); err != nil {
		return err
	}
	j.meta.State = state
	return j.writeMeta()
}

func (j *journal) close() {
	j.f.Close()
	j.pack.Close()
}

// randomNonce is 12 hex digits for temporary names.
func randomNonce() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
