package overlay

import (
	"errors"

	"golang.org/x/sys/unix"
)

// batchSync: on Linux one syncfs makes a whole batch of staged files durable,
// much faster than an fsync per file.
const batchSync = true

var errNoOpenat2 = errors.New("openat2 unavailable")

// openBeneath opens the directory rel beneath dirfd in one call, refusing
// symlinks in any component and any escape (openat2, Linux 5.6+).
func openBeneath(dirfd int, rel string) (int, error) {
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
		return -1, errNoOpenat2
	}
	return fd, err
}

func syncFS(fd int) error { return unix.Syncfs(fd) }
