//go:build unix

package ext4

import (
	"io/fs"
	"syscall"
)

func diskUsage(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return 0
}
