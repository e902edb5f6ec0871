// Package overlay turns what the agent did in the guest's OverlayFS into a
// reviewed, safely applied change to the host workspace: the change set
// (computed in the guest from the overlay's upper dir), the git-style patch,
// the baseline snapshot of the workspace taken at session start, the safe
// apply with conflict detection, and undo. It never touches the network.
package overlay

import "errors"

// ChangeSetVersion is the version of the ChangeSet JSON format.
const ChangeSetVersion = 1

// ChangeSet lists what differs between the overlay's merged view and its
// lower (the read-only workspace). It is produced in the guest and parsed by
// the host, which treats it as untrusted input.
type ChangeSet struct {
	Version int      `json:"version"`
	Changes []Change `json:"changes"`
}

// Change is one changed path. (Fields are completed by the change set
// implementation; see ScanChanges.)
type Change struct {
	// Path is slash-separated and relative to the overlay root.
	Path string `json:"path"`
}

// ErrNotImplemented is temporary scaffolding removed when ScanChanges lands.
var ErrNotImplemented = errors.New("not implemented")

// ScanChanges walks the overlay upper dir against lower and returns the
// change set. It must run where the overlay's whiteouts and opaque xattrs are
// visible (in the guest, as root).
func ScanChanges(lower, upper string) (*ChangeSet, error) {
	return nil, ErrNotImplemented
}
