//go:build unix

package overlay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vibedom/vibedom/atomicfile"
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

func readBackupMeta(dir string) (backupMeta, error) {
	var m backupMeta
	data, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, err
	}
	return m, nil
}

func writeBackupMeta(dir string, m backupMeta) error {
	out, _ := json.MarshalIndent(m, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(dir, "meta.json"), append(out, '\n'), 0o600); err != nil {
		return fmt.Errorf("write backup meta: %w", err)
	}
	return nil
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
func Undo(ctx context.Context, sessionDir, workspace string, opts UndoOptions) (*UndoReport, error) {
	unlock, err := lockSession(sessionDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	list, err := ListBackups(sessionDir)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("%w in %s", ErrNothingToUndo, sessionDir)
		}
		if opts.Force {
			return nil, fmt.Errorf("%w: it overwrites what you changed since; to force the latest apply: vibedom undo --force --backup %s", ErrForceNeedsBackup, id)
		}
	} else {
		i := slices.IndexFunc(list, func(b BackupSummary) bool { return b.ID == id })
		switch {
		case i < 0:
			return nil, fmt.Errorf("no backup %q in %s; `vibedom undo --list` shows them", id, sessionDir)
		case list[i].State == stateUndone:
			return nil, fmt.Errorf("%w: backup %s is already undone", ErrNothingToUndo, id)
		}
	}
	dir := filepath.Join(sessionDir, BackupsDir, id)
	meta, err := readBackupMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("read backup %s: unreadable meta.json", id)
	}
	if workspace == "" {
		workspace = meta.Workspace
	}
	entries, err := readJournal(filepath.Join(dir, "journal.jsonl"))
	if err != nil {
		return nil, err
	}
	root, err := openHostRoot(workspace)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	if err := cleanInterrupted(root, sessionDir, nil); err != nil {
		return nil, err
	}
	rep := &UndoReport{BackupID: id}
	for _, e := range entries {
		if err := ValidatePath(e.Path); err != nil {
			return rep, fmt.Errorf("backup %s journal: %w", id, err)
		}
	}
	// Files are undone in two batches: those the apply wrote (newest
	// first), then, after the directories, those it removed. Each batch is
	// decided path by path, and what it will overwrite is backed up and
	// made durable, before any of it is touched.
	var uj *journal
	defer func() {
		if uj != nil {
			uj.close()
		}
	}()
	seq := 0
	openUndoJournal := func() error {
		if uj != nil {
			return nil
		}
		var err error
		if uj, err = newJournal(sessionDir, workspace, kindUndo, id); err != nil {
			return err
		}
		rep.UndoBackupID = uj.id
		return nil
	}
	fail := func(err error) (*UndoReport, error) {
		if uj != nil {
			uj.finish(stateIncomplete)
		}
		return rep, err
	}
	undoFiles := func(written bool) error {
		type step struct {
			e     journalEntry
			cur   snapshot
			nonce string
		}
		var steps []step
		for i := len(entries) - 1; i >= 0; i-- {
			e := entries[i]
			if e.Kind != "file" || (e.After.Type != "") != written {
				continue
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if e.Tmp != "" {
				root.remove(e.Tmp, false) // left by an interrupted apply
			}
			cur, _, err := readState(root, e.Path)
			if err != nil {
				if errors.Is(err, ErrSymlinkInPath) {
					rep.Kept = append(rep.Kept, FileError{e.Path, err})
					continue
				}
				return err
			}
			switch {
			case cur == e.Prior:
				continue // never applied, or already restored
			case cur == e.After || opts.Force:
			default:
				rep.Kept = append(rep.Kept, FileError{e.Path, fmt.Errorf(
					"changed since the apply; kept (to restore it anyway, your version backed up first: vibedom undo --force --backup %s)", id)})
				continue
			}
			steps = append(steps, step{e: e, cur: cur, nonce: randomNonce()})
		}
		if len(steps) == 0 {
			return nil
		}
		if err := openUndoJournal(); err != nil {
			return err
		}
		for _, st := range steps {
			var ref *backupRef
			if st.cur.Type == TypeFile {
				// Read again: what is backed up must be what is overwritten.
				cur, data, err := readState(root, st.e.Path)
				if err != nil {
					return err
				}
				if cur != st.cur {
					return fmt.Errorf("%s changed during the undo; run it again", DisplayPath(st.e.Path))
				}
				if ref, err = uj.backup(data); err != nil {
					return err
				}
			}
			tmp := ""
			if st.e.Prior.Type != "" {
				tmp = join(parentDir(st.e.Path), tempPrefix+st.nonce+"-"+shortName(filepath.Base(st.e.Path)))
			}
			seq++
			if err := uj.add(journalEntry{Seq: seq, Kind: "file", Path: st.e.Path, Prior: st.cur, After: st.e.Prior, Tmp: tmp, Backup: ref}); err != nil {
				return err
			}
		}
		if err := uj.sync(); err != nil {
			return err
		}
		for _, st := range steps {
			if err := restore(root, dir, st.e, st.cur, st.nonce); err != nil {
				return err
			}
			rep.Restored = append(rep.Restored, st.e.Path)
		}
		return nil
	}
	// Undo in the reverse order of the apply, which removed files, then
	// removed the directories that emptied, then made directories and wrote
	// files.
	if err := undoFiles(true); err != nil {
		return fail(err)
	}
	// Directories made for them, deepest first, when empty.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Kind != "mkdir" {
			continue
		}
		if names, err := root.readDirNames(e.Path); err == nil && names != nil && len(names) == 0 {
			cur, err := root.lstat(e.Path)
			if err != nil {
				return fail(err)
			}
			if err := openUndoJournal(); err != nil {
				return fail(err)
			}
			if err := errors.Join(uj.add(journalEntry{Kind: "rmdir", Path: e.Path, Prior: snapshot{Type: TypeDir, Perm: cur.Mode}}), uj.sync()); err != nil {
				return fail(err)
			}
			if err := root.remove(e.Path, true); err != nil {
				return fail(err)
			}
		}
	}
	// Directories removed, shallowest first.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Kind != "rmdir" {
			continue
		}
		cur, err := root.lstat(e.Path)
		if err != nil {
			rep.Kept = append(rep.Kept, FileError{e.Path, err})
			continue
		}
		if cur.Type == "" {
			if err := openUndoJournal(); err != nil {
				return fail(err)
			}
			if err := errors.Join(uj.add(journalEntry{Kind: "mkdir", Path: e.Path, After: snapshot{Type: TypeDir}}), uj.sync()); err != nil {
				return fail(err)
			}
			if err := root.mkdir(e.Path, e.Prior.Perm); err != nil {
				return fail(err)
			}
		}
	}
	// Removed files.
	if err := undoFiles(false); err != nil {
		return fail(err)
	}
	if err := root.sync(); err != nil {
		return fail(err)
	}
	if uj != nil {
		if err := uj.finish(stateApplied); err != nil {
			return rep, err
		}
	}
	meta.State = stateUndone
	if len(rep.Kept) > 0 {
		meta.State = statePartial
	}
	if err := writeBackupMeta(dir, meta); err != nil {
		return rep, fmt.Errorf("mark backup %s %s: %w", id, meta.State, err)
	}
	slices.Sort(rep.Restored)
	return rep, nil
}

func readJournal(path string) ([]journalEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	defer f.Close()
	var out []journalEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e journalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			break // a torn last line from a crash
		}
		out = append(out, e)
	}
	return out, nil
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
