// Package atomicfile replaces small files whole: a reader sees the old
// content or the new, never a mix or a truncated file, and after a crash
// the file holds one of them. It is a leaf: it imports nothing of the
// project.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, mode perm: a temporary file in the
// same folder is written, synced, given its mode and renamed over path;
// then the folder is synced so the rename itself survives a crash. On
// any error path is untouched and the temporary file is gone.
func WriteFile(path string, data []byte, perm fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	syncDir(dir)
	return nil
}

// syncDir flushes a folder's entries; some file systems refuse to sync a
// folder, which is not an error for the caller.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	if err := d.Sync(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		_ = err
	}
	d.Close()
}
