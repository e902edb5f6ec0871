package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// platformOverlay reads OverlayFS markers on Linux: whiteouts are 0:0
// character devices (or, on newer kernels, empty files with an
// overlay.whiteout xattr); opaque directories carry overlay.opaque=y, under
// trusted.* (or user.* when mounted with userxattr).
type platformOverlay struct{}

var xattrPrefixes = []string{"trusted.overlay.", "user.overlay."}

func getxattr(path, name string) (string, bool, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	switch {
	case err == nil:
		return string(buf[:n]), true, nil
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EPERM):
		return "", false, nil
	case errors.Is(err, unix.ERANGE):
		return "", true, nil // longer than any marker value: present
	}
	return "", false, fmt.Errorf("read xattr %s of %s: %w", name, path, err)
}

func hasOverlayXattr(path, suffix string) (string, bool, error) {
	for _, p := range xattrPrefixes {
		v, ok, err := getxattr(path, p+suffix)
		if err != nil || ok {
			return v, ok, err
		}
	}
	return "", false, nil
}

func (platformOverlay) kind(path string, fi fs.FileInfo) (upperKind, error) {
	m := fi.Mode()
	if m&fs.ModeCharDevice != 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Rdev == 0 {
			return upperWhiteout, nil
		}
		return upperNormal, nil
	}
	if m.IsRegular() {
		if fi.Size() == 0 {
			if _, ok, err := hasOverlayXattr(path, "whiteout"); err != nil {
				return 0, err
			} else if ok {
				return upperWhiteout, nil
			}
		}
		if _, ok, err := hasOverlayXattr(path, "metacopy"); err != nil {
			return 0, err
		} else if ok {
			return 0, fmt.Errorf("%s: %w", path, ErrUnsupportedOverlay)
		}
	}
	return upperNormal, nil
}

func (platformOverlay) opaque(path string) (bool, error) {
	if _, ok, err := hasOverlayXattr(path, "redirect"); err != nil {
		return false, err
	} else if ok {
		return false, fmt.Errorf("%s: %w", path, ErrUnsupportedOverlay)
	}
	v, ok, err := hasOverlayXattr(path, "opaque")
	if err != nil {
		return false, err
	}
	return ok && v == "y", nil
}

// maxXattrs bounds what xattrs reads of one entry.
const maxXattrs = 64 << 10

// xattrs lists path's extended attributes other than the overlay's own
// (trusted.overlay.*, user.overlay.*), with their values. A file system
// without xattrs has none.
func (platformOverlay) xattrs(path string) (map[string]string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(path, buf)
	if errors.Is(err, unix.ERANGE) {
		buf = make([]byte, maxXattrs)
		n, err = unix.Llistxattr(path, buf)
	}
	switch {
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		return nil, nil
	case err != nil:
		return nil, &fs.PathError{Op: "listxattr", Path: path, Err: err}
	}
	var out map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" || strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.") {
			continue
		}
		if out == nil {
			out = make(map[string]string)
		}
		v := make([]byte, maxXattrs)
		k, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			k, v = 0, []byte("?unreadable")
		}
		out[name] = string(v[:k])
	}
	return out, nil
}
