package preflight

import (
	"fmt"
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// statID extracts what the memo compares: size, mtime, ctime, inode and
// device. ok is false when the platform gives no such data.
func statID(fi fs.FileInfo) (statKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return statKey{}, false
	}
	return statKey{
		Size:  fi.Size(),
		Mtime: st.Mtim.Nano(),
		Ctime: st.Ctim.Nano(),
		Ino:   uint64(st.Ino),
		Dev:   uint64(st.Dev),
	}, true
}

// localFileSystems are the file systems whose stat the memo trusts: local
// ones, where the kernel sets ctime on every change and stat is never
// served from a cache that can lag behind another machine's write.
var localFileSystems = map[int64]string{
	unix.EXT4_SUPER_MAGIC:      "ext2/3/4",
	unix.XFS_SUPER_MAGIC:       "xfs",
	unix.BTRFS_SUPER_MAGIC:     "btrfs",
	unix.TMPFS_MAGIC:           "tmpfs",
	unix.RAMFS_MAGIC:           "ramfs",
	unix.OVERLAYFS_SUPER_MAGIC: "overlay",
	unix.F2FS_SUPER_MAGIC:      "f2fs",
	unix.BCACHEFS_SUPER_MAGIC:  "bcachefs",
	0x2fc12fc1:                 "zfs",
}

// statTrusted reports whether path is on a file system whose stat the memo
// trusts, and names the file system.
func statTrusted(path string) (bool, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, "unknown (" + err.Error() + ")"
	}
	if name, ok := localFileSystems[int64(st.Type)]; ok {
		return true, name
	}
	return false, fmt.Sprintf("type %#x", st.Type)
}
