package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrSaveLockBusy means another process (or machine) kept the host's
// save/restore lock longer than the caller would wait.
var ErrSaveLockBusy = errors.New("another vibedom VM is saving or restoring its state")

// SaveLockWait is how long a backend waits for the save/restore lock before
// giving up with ErrSaveLockBusy: long enough for another machine to write
// or read several GiB of memory.
const SaveLockWait = 2 * time.Minute

// saveLockPoll is how often a waiting AcquireSaveLock retries.
const saveLockPoll = 50 * time.Millisecond

// DefaultSaveLockPath is the lock file backends serialise saving and
// restoring through: one per user, in os.TempDir, whatever VIBEDOM_HOME
// says. The hazard is the hypervisor on this host, not one vibedom home: two
// homes (a test's and the user's) must still take turns. Per user rather
// than per host because the lock is a file the holder writes its process id
// into; a file shared by users would need to be writable by all of them,
// so any one could hold it forever. On macOS os.TempDir is the user's own
// $TMPDIR; the uid in the name keeps users apart where it is a shared /tmp.
func DefaultSaveLockPath() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("vibedom-%d-save-restore.lock", os.Getuid()))
}

// AcquireSaveLock takes the exclusive host lock at path (see
// DefaultSaveLockPath), waiting up to wait or until ctx ends. It returns the
// function that releases it. A lock it cannot get in time is an error
// wrapping ErrSaveLockBusy that names the process holding it; one that ctx
// ends wraps ctx.Err(). The lock is an advisory flock: it is released when
// the holding process exits, however it exits.
func AcquireSaveLock(ctx context.Context, path string, wait time.Duration) (release func(), err error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, fmt.Errorf("save/restore lock %s: %w", path, err)
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(saveLockPoll)
	defer tick.Stop()
	for {
		ok, err := tryFlock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("save/restore lock %s: %w", path, err)
		}
		if ok {
			// The holder's pid is for the message of whoever waits; failing
			// to write it does not weaken the lock.
			if err := f.Truncate(0); err == nil {
				f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
			}
			return func() {
				f.Truncate(0)
				unFlock(f)
				f.Close()
			}, nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			holder := lockHolder(path)
			f.Close()
			return nil, fmt.Errorf("%w (%s holds %s; waited %s): try again once it has finished", ErrSaveLockBusy, holder, path, wait)
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for the save/restore lock %s: %w", path, ctx.Err())
		}
	}
}

// lockHolder describes the process named in the lock file.
func lockHolder(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "another process"
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return "another process"
	}
	if pid == os.Getpid() {
		return "another machine of this process"
	}
	return "process " + strconv.Itoa(pid)
}
