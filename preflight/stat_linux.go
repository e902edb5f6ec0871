package preflight

import (
	"io/fs"
	"syscall"
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
