//go:build !linux

package overlay

import (
	"errors"
	"io/fs"
)

// platformOverlay is a stub: OverlayFS exists only on Linux, where the guest
// runs ScanChanges.
type platformOverlay struct{}

var errNoOverlay = errors.New("scan overlay: OverlayFS exists only on Linux")

func (platformOverlay) kind(string, fs.FileInfo) (upperKind, error) { return 0, errNoOverlay }
func (platformOverlay) opaque(string) (bool, error)                 { return false, errNoOverlay }
func (platformOverlay) xattrs(string) (map[string]string, error)    { return nil, errNoOverlay }
