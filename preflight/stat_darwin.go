package preflight

import (
	"bytes"
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
		Mtime: st.Mtimespec.Nano(),
		Ctime: st.Ctimespec.Nano(),
		Ino:   uint64(st.Ino),
		Dev:   uint64(st.Dev),
	}, true
}

// statTrusted reports whether path is on a file system whose stat the memo
// trusts (APFS, HFS+: local, the kernel sets ctime on every change), and
// names the file system. Network (smbfs, nfs, afpfs, webdav) and FUSE file
// systems can serve stat from a cache that lags behind a write elsewhere.
func statTrusted(path string) (bool, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, "unknown (" + err.Error() + ")"
	}
	name := string(bytes.TrimRight(st.Fstypename[:], "\x00"))
	return name == "apfs" || name == "hfs", name
}
