package session

import (
	"fmt"
	"os"
)

// ensureDir makes dir (and its parents) with mode 0700 and checks that an
// existing dir is not group- or world-writable.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by other users (mode %v): run chmod go-w %s", dir, fi.Mode().Perm(), dir)
	}
	return nil
}
