package initramfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"strings"
)

// File is one file of a session's boot data. Data may be secret (the guest's
// SSH host key): String, GoString, LogValue and MarshalJSON never show it.
type File struct {
	// Path is the absolute path in the guest.
	Path string
	// Mode is the permission bits.
	Mode fs.FileMode
	// Data is the content.
	Data []byte
}

// String describes f without its content.
func (f File) String() string {
	return fmt.Sprintf("%s (%v, %d bytes)", f.Path, f.Mode.Perm(), len(f.Data))
}

// GoString describes f without its content, for %#v.
func (f File) GoString() string {
	return fmt.Sprintf("initramfs.File{Path: %q, Mode: %#o, Data: <%d bytes redacted>}", f.Path, uint32(f.Mode.Perm()), len(f.Data))
}

// LogValue logs f without its content.
func (f File) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("path", f.Path),
		slog.String("mode", f.Mode.Perm().String()),
		slog.Int("bytes", len(f.Data)),
	)
}

// MarshalJSON encodes f without its content, so a File inside a logged or
// serialised structure cannot leak it.
func (f File) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Path  string `json:"path"`
		Mode  string `json:"mode"`
		Bytes int    `json:"bytes"`
	}{f.Path, f.Mode.Perm().String(), len(f.Data)})
}

// sessionDir is where session data lives in the guest (proto's paths).
const sessionDir = "vibedom"

// ErrSessionFile means a session file's path or mode was refused.
var ErrSessionFile = errors.New("bad session file")

// SessionArchive returns the cpio archive of files, to be appended to a
// base initramfs. Files must live directly in /vibedom/ (the boot data
// directory, created 0755) or at the top level, where they replace the base
// image's entry of the same name (tests replace /init this way). Anything
// else is refused: an appended archive re-creating a directory of the base
// image would reset its owner and mode (say /tmp's sticky bit).
func SessionArchive(files []File) ([]byte, error) {
	var ar Archive
	needDir := false
	for _, f := range files {
		if !strings.HasPrefix(f.Path, "/") {
			return nil, fmt.Errorf("%w: %q is not absolute", ErrSessionFile, f.Path)
		}
		name, err := CleanName(f.Path)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSessionFile, err)
		}
		switch dir := path.Dir(name); {
		case dir == sessionDir:
			needDir = true
		case dir == "." && name != sessionDir:
		default:
			return nil, fmt.Errorf("%w: %s: session files go in /%s/ or at the top level", ErrSessionFile, f.Path, sessionDir)
		}
		if f.Mode&^fs.ModePerm != 0 {
			return nil, fmt.Errorf("%w: %s: mode %v is not a plain file's", ErrSessionFile, f.Path, f.Mode)
		}
		if err := ar.File(name, f.Mode, f.Data); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSessionFile, err)
		}
	}
	if needDir {
		if err := ar.Dir(sessionDir, 0o755); err != nil {
			return nil, err
		}
	}
	return ar.Bytes()
}
