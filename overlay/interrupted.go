//go:build unix

package overlay

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrSessionBusy means another apply or undo of the session is running.
var ErrSessionBusy = errors.New("another apply or undo of this session is running")

// lockSession takes the session's apply/undo lock (a flock on
// backups/.lock, released by the kernel if the process dies) without
// waiting.
func lockSession(sessionDir string) (unlock func(), err error) {
	dir := filepath.Join(sessionDir, BackupsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make backup folder: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock session: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s); wait for it to finish, then try again", ErrSessionBusy, sessionDir)
		}
		return nil, fmt.Errorf("lock session: %w", err)
	}
	// Unlocked explicitly, not only by the close: a child forked meanwhile
	// (git, the pager) shares the open file until it execs, and would keep
	// the lock past the close.
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// cleanInterrupted removes the temporary files of applies and undos that
// were killed part way (state still "applying": with the session lock held,
// no live process owns them) and marks them incomplete. Every temporary
// file is named in the journal, which is durable before the file is made,
// so none is missed; only names with the temporary prefix are removed.
func cleanInterrupted(root *hostRoot, sessionDir string, log *slog.Logger) error {
	list, err := ListBackups(sessionDir)
	if err != nil {
		return err
	}
	for _, b := range list {
		if b.State != stateApplying {
			continue
		}
		dir := filepath.Join(sessionDir, BackupsDir, b.ID)
		entries, err := readJournal(filepath.Join(dir, journalName))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Tmp == "" || ValidatePath(e.Tmp) != nil || !strings.HasPrefix(filepath.Base(e.Tmp), tempPrefix) {
				continue
			}
			if err := root.remove(e.Tmp, false); err != nil && !errors.Is(err, ErrSymlinkInPath) && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove a temporary file an interrupted apply left: %w", err)
			}
		}
		if err := root.sync(); err != nil {
			return err
		}
		m, err := readBackupMeta(dir)
		if err != nil {
			continue
		}
		m.State = stateIncomplete
		if err := writeBackupMeta(dir, m); err != nil {
			return err
		}
		if log != nil {
			log.Debug("cleaned an interrupted apply", "backup", b.ID)
		}
	}
	return nil
}
