package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// cloneTree copies ws into dst with an FICLONE reflink per regular file
// (btrfs, XFS, bcachefs …), recreating directories and symlinks. The first
// file the file system refuses to clone makes it errCloneUnsupported.
func cloneTree(ctx context.Context, ws, dst string) (int, error) {
	root, err := openHostRoot(ws)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return 0, err
	}
	n := 0
	err = walkHost(ctx, root, func(rel string, e hostEntry) error {
		to := filepath.Join(dst, filepath.FromSlash(rel))
		switch e.Type {
		case TypeDir:
			if skipDir(filepath.Base(to)) {
				return nil
			}
			return os.Mkdir(to, 0o700)
		case TypeSymlink:
			return os.Symlink(e.Target, to)
		case TypeFile:
			n++
			return cloneFile(root, rel, to, e.Mode)
		}
		return nil
	})
	return n, err
}

func cloneFile(root *hostRoot, rel, to string, perm uint32) error {
	dir, base := splitParent(rel)
	dfd, _, err := root.openDir(dir, false)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	src, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", DisplayPath(rel), err)
	}
	defer unix.Close(src)
	dst, err := unix.Open(to, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm&0o777|0o400)
	if err != nil {
		return fmt.Errorf("create %s: %w", to, err)
	}
	defer unix.Close(dst)
	if err := unix.IoctlFileClone(dst, src); err != nil {
		if isCloneUnsupported(err) {
			return fmt.Errorf("%w: %v", errCloneUnsupported, err)
		}
		return fmt.Errorf("clone %s: %w", DisplayPath(rel), err)
	}
	return nil
}
