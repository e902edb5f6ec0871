package image

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/guest/proto"
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
	return fmt.Sprintf("image.File{Path: %q, Mode: %#o, Data: <%d bytes redacted>}", f.Path, uint32(f.Mode.Perm()), len(f.Data))
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

// SessionFiles returns a session's boot data files: proto.BootConfigPath
// (cfg as JSON, 0644), proto.HostKeyPath (the guest's SSH host private
// key, 0600) and, when caPEM is not empty, proto.CACertPath (0644). cfg is
// validated first.
func SessionFiles(cfg *proto.BootConfig, hostKeyPEM, caPEM []byte) ([]File, error) {
	if cfg == nil {
		return nil, fmt.Errorf("session files: no boot config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("session files: boot config: %w", err)
	}
	if !bytes.HasPrefix(bytes.TrimSpace(hostKeyPEM), []byte("-----BEGIN ")) {
		return nil, fmt.Errorf("session files: the guest host key is not a PEM block")
	}
	data, err := cfg.Marshal()
	if err != nil {
		return nil, fmt.Errorf("session files: encode boot config: %w", err)
	}
	files := []File{
		{Path: proto.BootConfigPath, Mode: 0o644, Data: append(data, '\n')},
		{Path: proto.HostKeyPath, Mode: 0o600, Data: bytes.Clone(hostKeyPEM)},
	}
	if len(bytes.TrimSpace(caPEM)) > 0 {
		if !bytes.HasPrefix(bytes.TrimSpace(caPEM), []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("session files: the CA certificate is not a PEM certificate")
		}
		files = append(files, File{Path: proto.CACertPath, Mode: 0o644, Data: bytes.Clone(caPEM)})
	}
	return files, nil
}

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
		name, err := cleanName(f.Path)
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

// WriteSessionInitrd writes the initrd of one session to dst: the base
// image's initramfs followed by the archive of files (see SessionArchive).
// The kernel unpacks both in order. dst is created 0600, since it holds
// the guest's host key; it is written beside dst and renamed into place, so
// dst is complete or absent. The base is reflinked where the filesystem can
// (FICLONE on Linux, clonefile on macOS), else copied (in the kernel with
// copy_file_range on Linux). dst is not fsynced: it is rebuilt for every
// boot.
func WriteSessionInitrd(dst string, base *Image, files []File) error {
	if base == nil || base.Initrd == "" {
		return fmt.Errorf("write session initrd: no base image")
	}
	extra, err := SessionArchive(files)
	if err != nil {
		return fmt.Errorf("write session initrd: %w", err)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := copyBase(tmp, base)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	_, werr := f.Write(extra)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write session initrd %s: %w", dst, err)
	}
	return nil
}

// copyBase creates path (0600) holding the base initramfs and returns it
// open for writing at its end. The base must be as long as the image
// recorded: a base that shrank or grew since Ensure verified it is refused.
func copyBase(p string, base *Image) (*os.File, error) {
	if f, err := cloneFile(p, base.Initrd, 0o600); err == nil {
		if n, err := f.Seek(0, io.SeekCurrent); err != nil || (base.InitrdSize > 0 && n != base.InitrdSize) {
			f.Close()
			return nil, fmt.Errorf("%w: base initramfs %s changed size", ErrCorrupt, base.Initrd)
		}
		return f, nil
	}
	src, err := os.Open(base.Initrd)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	// *os.File to *os.File: io.Copy uses copy_file_range where it can.
	n, err := io.Copy(f, src)
	if err == nil && base.InitrdSize > 0 && n != base.InitrdSize {
		err = fmt.Errorf("%w: base initramfs %s changed size", ErrCorrupt, base.Initrd)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
