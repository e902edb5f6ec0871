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
)

// ErrNothingToUndo means a session has no apply left to undo.
var ErrNothingToUndo = errors.New("nothing to undo")

// UndoOptions tunes Undo.
type UndoOptions struct {
	// Force restores paths the user changed after the apply too (their
	// current content is lost).
	Force bool
}

// UndoReport is what Undo did.
type UndoReport struct {
	BackupID string
	Restored []string
	// Kept lists paths changed since the apply, left as they are.
	Kept []FileError
}

// Backups lists a session's backup folders (one per apply), oldest first,
// with their state: applying, applied, incomplete or undone.
func Backups(sessionDir string) ([]string, map[string]string, error) {
	ents, err := os.ReadDir(filepath.Join(sessionDir, BackupsDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list backups: %w", err)
	}
	var ids []string
	states := map[string]string{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sessionDir, BackupsDir, e.Name(), "meta.json"))
		if err != nil {
			continue
		}
		var m backupMeta
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		ids = append(ids, e.Name())
		states[e.Name()] = m.State
	}
	slices.Sort(ids)
	return ids, states, nil
}

// Undo reverts the latest apply of the session that is not undone yet: every
// path it wrote or removed gets its prior content, mode or symlink target
// back, files it created go, directories it made or removed are removed or
// made again. A path changed since the apply is kept and reported (unless
// Force). Undoing again reverts the apply before.
func Undo(ctx context.Context, sessionDir, workspace string, opts UndoOptions) (*UndoReport, error) {
	ids, states, err := Backups(sessionDir)
	if err != nil {
		return nil, err
	}
	id := ""
	for i := len(ids) - 1; i >= 0; i-- {
		if states[ids[i]] != "undone" {
			id = ids[i]
			break
		}
	}
	if id == "" {
		return nil, fmt.Errorf("%w in %s", ErrNothingToUndo, sessionDir)
	}
	dir := filepath.Join(sessionDir, BackupsDir, id)
	var meta backupMeta
	data, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil || json.Unmarshal(data, &meta) != nil {
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
	rep := &UndoReport{BackupID: id}
	for _, e := range entries {
		if err := ValidatePath(e.Path); err != nil {
			return rep, fmt.Errorf("backup %s journal: %w", id, err)
		}
	}
	// Undo in the reverse order of the apply, which removed files, then
	// removed the directories that emptied, then made directories and wrote
	// files.
	undoFile := func(e journalEntry) error {
		if e.Tmp != "" {
			root.remove(e.Tmp, false) // left by an interrupted apply
		}
		cur, data, err := readState(root, e.Path)
		if err != nil {
			if errors.Is(err, ErrSymlinkInPath) {
				rep.Kept = append(rep.Kept, FileError{e.Path, err})
				return nil
			}
			return err
		}
		switch {
		case cur == e.Prior:
			return nil // never applied, or already restored
		case cur == e.After || opts.Force:
		default:
			rep.Kept = append(rep.Kept, FileError{e.Path, errors.New("changed since the apply; kept (undo --force restores it anyway)")})
			return nil
		}
		if err := restore(root, dir, e, cur, data); err != nil {
			return err
		}
		rep.Restored = append(rep.Restored, e.Path)
		return nil
	}
	// Written files, newest first.
	for i := len(entries) - 1; i >= 0; i-- {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		if e := entries[i]; e.Kind == "file" && e.After.Type != "" {
			if err := undoFile(e); err != nil {
				return rep, err
			}
		}
	}
	// Directories made for them, deepest first, when empty.
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if e.Kind != "mkdir" {
			continue
		}
		if names, err := root.readDirNames(e.Path); err == nil && names != nil && len(names) == 0 {
			if err := root.remove(e.Path, true); err != nil {
				return rep, err
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
			if err := root.mkdir(e.Path, e.Prior.Perm); err != nil {
				return rep, err
			}
		}
	}
	// Removed files.
	for i := len(entries) - 1; i >= 0; i-- {
		if e := entries[i]; e.Kind == "file" && e.After.Type == "" {
			if err := undoFile(e); err != nil {
				return rep, err
			}
		}
	}
	if err := root.sync(); err != nil {
		return rep, err
	}
	meta.State = "undone"
	out, _ := json.MarshalIndent(meta, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), append(out, '\n'), 0o600); err != nil {
		return rep, fmt.Errorf("mark backup %s undone: %w", id, err)
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
func restore(root *hostRoot, backupDir string, e journalEntry, cur snapshot, _ []byte) error {
	if cur.Type == TypeDir {
		return fmt.Errorf("restore %s: a directory is in the way", DisplayPath(e.Path))
	}
	switch e.Prior.Type {
	case "":
		return root.remove(e.Path, false)
	case TypeSymlink:
		tmp, _, err := root.stageSymlink(e.Path, e.Prior.Target, randomNonce())
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
		tmp, _, err := root.stageFile(e.Path, data, e.Prior.Perm, randomNonce())
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
