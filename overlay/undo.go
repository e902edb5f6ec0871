//go:build unix

package overlay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ErrNothingToUndo means a session has no apply left to undo.
var ErrNothingToUndo = errors.New("nothing to undo")

// ErrForceNeedsBackup means Undo was asked to force without naming the
// apply: forcing overwrites later edits, so it only ever touches the apply
// the user named.
var ErrForceNeedsBackup = errors.New("undo --force needs the apply named")

// UndoOptions tunes Undo.
type UndoOptions struct {
	// BackupID names the apply to undo (a folder under backups/, as
	// Backups lists); "" is the latest apply not fully undone. What an undo
	// overwrote is undone only when named.
	BackupID string
	// Force restores paths the user changed after the apply too. Their
	// current content is backed up first (an undo backup, undoable by
	// name). Force needs BackupID.
	Force bool
}

// UndoReport is what Undo did.
type UndoReport struct {
	// BackupID is the apply undone.
	BackupID string
	// UndoBackupID names the backup of what this undo overwrote ("" when
	// it overwrote nothing): Undo with it as BackupID puts that back.
	UndoBackupID string
	Restored     []string
	// Kept lists paths changed since the apply, left as they are. The
	// apply then stays undoable (state partial).
	Kept []FileError
}

// BackupSummary describes one backup folder.
type BackupSummary struct {
	ID string
	// State is applying, applied, incomplete, partial or undone.
	State string
	// Undo is true for what an undo overwrote; Of is the backup it undid.
	Undo bool
	Of   string
}

// Backups lists a session's backup folders (one per apply, one per undo
// that overwrote something), oldest first, with their state: applying,
// applied, incomplete, partial (an undo kept paths) or undone.
func Backups(sessionDir string) ([]string, map[string]string, error) {
	list, err := ListBackups(sessionDir)
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	states := map[string]string{}
	for _, b := range list {
		ids = append(ids, b.ID)
		states[b.ID] = b.State
	}
	return ids, states, nil
}

// ListBackups is Backups with each folder's kind.
func ListBackups(sessionDir string) ([]BackupSummary, error) {
	ents, err := os.ReadDir(filepath.Join(sessionDir, BackupsDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list backups: %w", err)
	}
	var out []BackupSummary
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		m, err := readBackupMeta(filepath.Join(sessionDir, BackupsDir, e.Name()))
		if err != nil {
			continue
		}
		out = append(out, BackupSummary{ID: e.Name(), State: m.State, Undo: m.Kind == kindUndo, Of: m.Of})
	}
	slices.SortFunc(out, func(a, b BackupSummary) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Undo reverts one apply of the session (opts.BackupID, else the latest
// apply not fully undone): every path it wrote or removed gets its prior
// content, mode or symlink target back, files it created go, directories it
// made or removed are removed or made again. A path changed since the
// apply is kept and reported, and the apply stays undoable (state partial)
// so that naming it again with Force finishes it; Undo never moves on to
// an earlier apply while one is partial, and Force never touches an apply
// that was not named. Everything an undo overwrites or removes is backed
// up first, in a backup folder of its own (UndoReport.UndoBackupID).
//
// The phases are those of an undoer: pick the backup, open it, check its
// journal, revert (the apply's phases in reverse), finish.
func Undo(ctx context.Context, sessionDir, workspace string, opts UndoOptions) (*UndoReport, error) {
	unlock, err := lockSession(sessionDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	id, err := pickBackup(sessionDir, opts)
	if err != nil {
		return nil, err
	}
	u, err := openUndo(ctx, sessionDir, workspace, id, opts)
	if err != nil {
		return nil, err
	}
	defer u.close()
	if err := u.check(); err != nil {
		return u.rep, err
	}
	if err := u.revert(); err != nil {
		if u.uj != nil {
			u.uj.finish(stateIncomplete)
		}
		return u.rep, err
	}
	return u.rep, u.finish()
}

// pickBackup is the backup Undo reverts: the one named, else the latest
// apply not fully undone. It reads only.
func pickBackup(sessionDir string, opts UndoOptions) (string, error) {
	list, err := ListBackups(sessionDir)
	if err != nil {
		return "", err
	}
	id := opts.BackupID
	if id == "" {
		for i := len(list) - 1; i >= 0; i-- {
			if !list[i].Undo && list[i].State != stateUndone {
				id = list[i].ID
				break
			}
		}
		if id == "" {
			return "", fmt.Errorf("%w in %s", ErrNothingToUndo, sessionDir)
		}
		if opts.Force {
			return "", fmt.Errorf("%w: it overwrites what you changed since; to force the latest apply: vibedom undo --force --backup %s", ErrForceNeedsBackup, id)
		}
		return id, nil
	}
	i := slices.IndexFunc(list, func(b BackupSummary) bool { return b.ID == id })
	switch {
	case i < 0:
		return "", fmt.Errorf("no backup %q in %s; `vibedom undo --list` shows them", id, sessionDir)
	case list[i].State == stateUndone:
		return "", fmt.Errorf("%w: backup %s is already undone", ErrNothingToUndo, id)
	}
	return id, nil
}

// undoer is one Undo of the apply whose backup folder is dir.
type undoer struct {
	ctx        context.Context
	opts       UndoOptions
	sessionDir string
	workspace  string
	id, dir    string
	meta       backupMeta
	entries    []journalEntry
	root       *hostRoot
	rep        *UndoReport
	// uj is the undo's own backup folder, made when the undo first
	// overwrites or removes something; seq numbers its file entries.
	uj  *journal
	seq int
}

// openUndo reads backup id's meta and journal, opens the workspace (the
// one the apply wrote when workspace is "") and removes the temporary
// files interrupted applies left. Nothing else is written.
func openUndo(ctx context.Context, sessionDir, workspace, id string, opts UndoOptions) (*undoer, error) {
	u := &undoer{ctx: ctx, opts: opts, sessionDir: sessionDir, id: id, dir: filepath.Join(sessionDir, BackupsDir, id)}
	var err error
	if u.meta, err = readBackupMeta(u.dir); err != nil {
		return nil, fmt.Errorf("read backup %s: unreadable meta.json", id)
	}
	if workspace == "" {
		workspace = u.meta.Workspace
	}
	u.workspace = workspace
	if u.entries, err = readJournal(filepath.Join(u.dir, journalName)); err != nil {
		return nil, err
	}
	if u.root, err = openHostRoot(workspace); err != nil {
		return nil, err
	}
	if err := cleanInterrupted(u.root, sessionDir, nil); err != nil {
		u.root.Close()
		return nil, err
	}
	u.rep = &UndoReport{BackupID: id}
	return u, nil
}

func (u *undoer) close() {
	if u.uj != nil {
		u.uj.close()
	}
	u.root.Close()
}

// check refuses a journal naming a path that is not a clean relative
// path, before anything is touched.
func (u *undoer) check() error {
	for _, e := range u.entries {
		if err := ValidatePath(e.Path); err != nil {
			return fmt.Errorf("backup %s journal: %w", u.id, err)
		}
	}
	return nil
}

// revert undoes in the reverse order of the apply, which removed files,
// then removed the directories that emptied, then made directories and
// wrote files. Every step is in the undo's own journal, durable, before it
// touches the workspace: dying at any point leaves each path as the apply
// left it or as before it, the apply still undoable, and what the undo
// overwrote undoable by its backup's name.
func (u *undoer) revert() error {
	if err := u.files(true); err != nil {
		return err
	}
	if err := u.removeMadeDirs(); err != nil {
		return err
	}
	if err := u.remakeRemovedDirs(); err != nil {
		return err
	}
	if err := u.files(false); err != nil {
		return err
	}
	return u.root.sync()
}

// openJournal makes the undo's own backup folder on first need.
func (u *undoer) openJournal() error {
	if u.uj != nil {
		return nil
	}
	var err error
	if u.uj, err = newJournal(u.sessionDir, u.workspace, kindUndo, u.id); err != nil {
		return err
	}
	u.rep.UndoBackupID = u.uj.id
	return nil
}

// undoStep is one file to restore: its apply journal entry, what is there
// now, and the nonce of its temporary file.
type undoStep struct {
	e     journalEntry
	cur   snapshot
	nonce string
}

// files undoes one batch of file entries: those the apply wrote (written)
// or those it removed, newest first. The batch is decided path by path,
// and what it will overwrite is backed up and made durable, before any of
// it is touched (see journalSteps); then each path is restored atomically.
func (u *undoer) files(written bool) error {
	steps, err := u.decide(written)
	if err != nil || len(steps) == 0 {
		return err
	}
	if err := u.journalSteps(steps); err != nil {
		return err
	}
	for _, st := range steps {
		if err := restore(u.root, u.dir, st.e, st.cur, st.nonce); err != nil {
			return err
		}
		u.rep.Restored = append(u.rep.Restored, st.e.Path)
	}
	return nil
}

// decide picks the paths of the batch to restore: those still as the apply
// left them (any, with Force). A path already as before is skipped; one
// changed since, or behind a symlink, is kept and reported. It removes the
// temporary files an interrupted apply left, and writes nothing else.
func (u *undoer) decide(written bool) ([]undoStep, error) {
	var steps []undoStep
	for i := len(u.entries) - 1; i >= 0; i-- {
		e := u.entries[i]
		if e.Kind != "file" || (e.After.Type != "") != written {
			continue
		}
		if err := u.ctx.Err(); err != nil {
			return nil, err
		}
		if e.Tmp != "" {
			u.root.remove(e.Tmp, false) // left by an interrupted apply
		}
		cur, _, err := readState(u.root, e.Path)
		if err != nil {
			if errors.Is(err, ErrSymlinkInPath) {
				u.rep.Kept = append(u.rep.Kept, FileError{e.Path, err})
				continue
			}
			return nil, err
		}
		switch {
		case cur == e.Prior:
			continue // never applied, or already restored
		case cur == e.After || u.opts.Force:
		default:
			u.rep.Kept = append(u.rep.Kept, FileError{e.Path, fmt.Errorf(
				"changed since the apply; kept (to restore it anyway, your version backed up first: vibedom undo --force --backup %s)", u.id)})
			continue
		}
		steps = append(steps, undoStep{e: e, cur: cur, nonce: randomNonce()})
	}
	return steps, nil
}

// journalSteps backs up what each step overwrites (read again: what is
// backed up must be what is overwritten) and journals each step, durable
// before it returns. Dying during it leaves the workspace untouched.
func (u *undoer) journalSteps(steps []undoStep) error {
	if err := u.openJournal(); err != nil {
		return err
	}
	for _, st := range steps {
		var ref *backupRef
		if st.cur.Type == TypeFile {
			cur, data, err := readState(u.root, st.e.Path)
			if err != nil {
				return err
			}
			if cur != st.cur {
				return fmt.Errorf("%s changed during the undo; run it again", DisplayPath(st.e.Path))
			}
			if ref, err = u.uj.backup(data); err != nil {
				return err
			}
		}
		tmp := ""
		if st.e.Prior.Type != "" {
			tmp = join(parentDir(st.e.Path), tempPrefix+st.nonce+"-"+shortName(filepath.Base(st.e.Path)))
		}
		u.seq++
		if err := u.uj.add(journalEntry{Seq: u.seq, Kind: "file", Path: st.e.Path, Prior: st.cur, After: st.e.Prior, Tmp: tmp, Backup: ref}); err != nil {
			return err
		}
	}
	return u.uj.sync()
}

// removeMadeDirs removes the directories the apply made, deepest first,
// when empty; each removal is journaled (durable) before it is done.
func (u *undoer) removeMadeDirs() error {
	for i := len(u.entries) - 1; i >= 0; i-- {
		e := u.entries[i]
		if e.Kind != "mkdir" {
			continue
		}
		if names, err := u.root.readDirNames(e.Path); err == nil && names != nil && len(names) == 0 {
			cur, err := u.root.lstat(e.Path)
			if err != nil {
				return err
			}
			if err := u.openJournal(); err != nil {
				return err
			}
			if err := errors.Join(u.uj.add(journalEntry{Kind: "rmdir", Path: e.Path, Prior: snapshot{Type: TypeDir, Perm: cur.Mode}}), u.uj.sync()); err != nil {
				return err
			}
			if err := u.root.remove(e.Path, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// remakeRemovedDirs makes again the directories the apply removed,
// shallowest first, with their modes; each is journaled (durable) before
// it is made. A path it cannot read is kept and reported.
func (u *undoer) remakeRemovedDirs() error {
	for i := len(u.entries) - 1; i >= 0; i-- {
		e := u.entries[i]
		if e.Kind != "rmdir" {
			continue
		}
		cur, err := u.root.lstat(e.Path)
		if err != nil {
			u.rep.Kept = append(u.rep.Kept, FileError{e.Path, err})
			continue
		}
		if cur.Type == "" {
			if err := u.openJournal(); err != nil {
				return err
			}
			if err := errors.Join(u.uj.add(journalEntry{Kind: "mkdir", Path: e.Path, After: snapshot{Type: TypeDir}}), u.uj.sync()); err != nil {
				return err
			}
			if err := u.root.mkdir(e.Path, e.Prior.Perm); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish marks the undo's own backup applied and the apply undone, or
// partial when paths were kept (it stays undoable). Dying before it leaves
// the apply in its old state: undoing it again skips what is restored.
func (u *undoer) finish() error {
	if u.uj != nil {
		if err := u.uj.finish(stateApplied); err != nil {
			return err
		}
	}
	u.meta.State = stateUndone
	if len(u.rep.Kept) > 0 {
		u.meta.State = statePartial
	}
	if err := writeBackupMeta(u.dir, u.meta); err != nil {
		return fmt.Errorf("mark backup %s %s: %w", u.id, u.meta.State, err)
	}
	slices.Sort(u.rep.Restored)
	return nil
}

// readState snapshots what is at p now.
func readState(root *hostRoot, p string) (snapshot, []byte, error) {
	e, err := root.lstat(p)
	if err != nil {
		return snapshot{}, nil, err
	}
	var data []byte
	if e.Type == TypeFile {
		if data, err = root.readFile(p); err != nil {
			return snapshot{}, nil, err
		}
	}
	return snapshotOf(e, data), data, nil
}

// restore puts the prior state of a journal entry back.
func restore(root *hostRoot, backupDir string, e journalEntry, cur snapshot, nonce string) error {
	if cur.Type == TypeDir {
		return fmt.Errorf("restore %s: a directory is in the way", DisplayPath(e.Path))
	}
	switch e.Prior.Type {
	case "":
		return root.remove(e.Path, false)
	case TypeSymlink:
		tmp, _, err := root.stageSymlink(e.Path, e.Prior.Target, nonce)
		if err != nil {
			return err
		}
		return root.rename(tmp, e.Path)
	case TypeFile:
		if e.Backup == nil || e.Backup.Off < 0 || e.Backup.Len < 0 || e.Backup.Len > maxBinarySize {
			return fmt.Errorf("restore %s: no backup recorded", DisplayPath(e.Path))
		}
		pack, err := os.Open(filepath.Join(backupDir, packName))
		if err != nil {
			return fmt.Errorf("restore %s: backup missing: %w", DisplayPath(e.Path), err)
		}
		data := make([]byte, e.Backup.Len)
		_, err = pack.ReadAt(data, e.Backup.Off)
		pack.Close()
		if err != nil && !(err == io.EOF && e.Backup.Len == 0) {
			return fmt.Errorf("restore %s: read backup: %w", DisplayPath(e.Path), err)
		}
		if blobID(data) != e.Prior.Blob {
			return fmt.Errorf("restore %s: backup is corrupt", DisplayPath(e.Path))
		}
		tmp, _, err := root.stageFile(e.Path, data, e.Prior.Perm, nonce)
		if err != nil {
			return err
		}
		if err := root.sync(); err != nil {
			return err
		}
		if err := root.rename(tmp, e.Path); err != nil {
			root.remove(tmp, false)
			return err
		}
		if e.Prior.Perm&^0o777 != 0 {
			return root.chmod(e.Path, e.Prior.Perm)
		}
		return nil
	}
	return fmt.Errorf("restore %s: cannot restore a %s", DisplayPath(e.Path), e.Prior.Type)
}
