package image

import (
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// cloneFile creates dstPath (which must not exist) with permissions perm
// as a reflink copy of srcPath (FICLONE: btrfs, XFS, bcachefs …) and
// returns it open for writing at its end. On a filesystem without reflinks
// it fails, leaves nothing behind, and the caller copies instead.
func cloneFile(dstPath, srcPath string, perm fs.FileMode) (*os.File, error) {
	src, err := os.Open(srcPath)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	dst, err := os.OpenFile(dstPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
		dst.Close()
		os.Remove(dstPath)
		return nil, err
	}
	if _, err := dst.Seek(0, io.SeekEnd); err != nil {
		dst.Close()
		os.Remove(dstPath)
		return nil, err
	}
	return dst, nil
}
