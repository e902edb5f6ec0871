package session

import (
	"fmt"
	"os"
)

// ensureDir makes dir (and its parents) with mode 0700 and checks that an
// existing dir is not group- or world-writable, nor owned by another user
// (root excepted).
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
	// Another user who owns the folder can swap what is in it (a session's
	// state, its host options, its logs) whatever its mode says.
	if uid, ok := fileUID(fi); ok && uid != os.Getuid() && uid != 0 {
		return fmt.Errorf("%s is owned by another user (uid %d): use a folder you own (VIBEDOM_HOME)", dir, uid)
	}
	return nil
}
