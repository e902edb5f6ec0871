// Package atomicfile replaces files whole: a reader sees the old content
// or the new, never a mix or a truncated file, and after a crash the file
// holds one of them. Content is written to a temporary file in the same
// folder, synced, and renamed over the final path; then the folder is
// synced so the rename itself survives a crash.
//
// It does not lock: two writers of one path both succeed and the last
// rename wins. It does not remove temporary files left by a process that
// crashed before committing (they are named "."+base+".tmp-*", never the
// final name). It is a leaf: it imports nothing of the project.
//
// It also reads whole files, bounded (ReadLimited): the one helper for
// "read this small file, refuse it when it is too large", used on the host
// and in the guest alike.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, mode perm. On any error path is
// untouched and the temporary file is gone.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	f, err := New(path, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Commit()
}

// File is the pending new content of a path: an open temporary file in
// the path's folder. Write (or WriteAt, Seek, Read …) through the embedded
// *os.File, then Commit to put it in place or Abort to drop it. Do not
// Close, rename or remove the embedded file yourself; its Name is the
// temporary name, not the final one.
type File struct {
	*os.File
	path string
	perm fs.FileMode
	done bool
}

// New starts replacing path with content of mode perm. Until Commit, path
// is untouched (absent if it was absent). A process that dies before
// Commit leaves at most a temporary file beside path.
func New(path string, perm fs.FileMode) (*File, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return &File{File: tmp, path: path, perm: perm}, nil
}

// Path is the final path the file replaces.
func (f *File) Path() string { return f.path }

// Commit gives the content its mode, syncs it, closes it and renames it
// over the final path, then syncs the folder. On error the final path is
// untouched and the temporary file is gone. A second Commit, or one
// after Abort, returns ErrDone and changes nothing.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("write %s: %w", f.path, ErrDone)
	}
	f.done = true
	err := f.Chmod(f.perm)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	SyncDir(filepath.Dir(f.path))
	return nil
}

// ErrDone is returned by Commit on a File already committed or aborted.
var ErrDone = errors.New("already committed or aborted")

// Abort drops the pending content: the temporary file is closed and
// removed, the final path untouched. After Commit it does nothing, so
// `defer f.Abort()` is safe.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.Close()
	os.Remove(f.Name())
}

// Move renames the complete file from over to, for content that had to
// be built at a name of its own (a resumable download, a clone): from is
// synced first and to's folder after, so after a crash to is absent, old
// or complete. from and to must be on one file system. On error to is
// untouched and from is left for the caller.
func Move(from, to string) error {
	f, err := os.Open(from)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return err
	}
	if err := os.Rename(from, to); err != nil {
		return err
	}
	SyncDir(filepath.Dir(to))
	if filepath.Dir(from) != filepath.Dir(to) {
		SyncDir(filepath.Dir(from))
	}
	return nil
}

// SyncDir flushes a folder's entries, making renames into it and files
// created in it durable. It is best effort: some file systems refuse to
// sync a folder, and the caller could do nothing else anyway.
func SyncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}

// WriteNew writes data to path, which must not exist yet, and flushes it
// to disk: for a file in a staging folder that is later renamed into place
// whole (its folder is synced by that rename's caller, not here).
func WriteNew(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	return errors.Join(werr, serr, cerr)
}
