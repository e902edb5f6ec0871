package image

import (
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// cloneFile creates dstPath (which must not exist) with permissions perm
// as an APFS clone of srcPath (clonefile(2)) and returns it open for
// writing at its end. Where cloning is not possible it fails, leaves
// nothing behind, and the caller copies instead.
func cloneFile(dstPath, srcPath string, perm fs.FileMode) (*os.File, error) {
	if err := unix.Clonefile(srcPath, dstPath, unix.CLONE_NOFOLLOW); err != nil {
		return nil, err
	}
	// The clone has the source's mode; tighten it before anything secret is
	// appended.
	if err := os.Chmod(dstPath, perm); err != nil {
		os.Remove(dstPath)
		return nil, err
	}
	dst, err := os.OpenFile(dstPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		os.Remove(dstPath)
		return nil, err
	}
	return dst, nil
}
