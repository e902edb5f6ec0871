//go:build unix

package overlay

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// A backup folder (backups/<id>/ in the session folder) is what an apply or
// an undo writes before touching the workspace: meta.json, journal.jsonl
// and backups.pack. Undo and the clean-up of interrupted applies read
// folders that older builds wrote, so the JSON below only ever gains
// fields.

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
	f, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
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
	return writeBackupMeta(j.dir, j.meta)
}

func readBackupMeta(dir string) (backupMeta, error) {
	var m backupMeta
	data, err := os.ReadFile(filepath.Join(dir, metaName))
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
	if err := atomicfile.WriteFile(filepath.Join(dir, metaName), append(out, '\n'), 0o600); err != nil {
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

// The files of a backup folder.
const (
	journalName = "journal.jsonl"
	metaName    = "meta.json"
	// packName holds the backed-up contents.
	packName = "backups.pack"
)

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

// readJournal reads a backup folder's journal, up to a torn last line.
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
