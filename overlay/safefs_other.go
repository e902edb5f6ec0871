//go:build unix && !linux

package overlay

import "errors"

// batchSync is false: each file and directory is fsynced as it is written.
const batchSync = false

var errNoOpenat2 = errors.New("openat2 unavailable")

// openBeneath is Linux-only; the portable O_NOFOLLOW walk is used instead.
func openBeneath(int, string) (int, error) { return -1, errNoOpenat2 }

func syncFS(int) error { return nil }
