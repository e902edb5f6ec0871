//go:build unix

package overlay

import (
	"os"
	"syscall"
)

// mostlyHoles reports whether the file fi describes is large (over 64 MiB)
// and has less than a quarter of its length on disk: a sparse file, which
// git files never are (an index's object ids do not compress that far
// even on a compressing file system). Git parses an index's entries into
// memory, so a sparse one claiming millions of entries costs host git GiB.
func mostlyHoles(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && fi.Size() > 64<<20 && st.Blocks*512 < fi.Size()/4
}
