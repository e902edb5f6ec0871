//go:build unix

package mitm

import "syscall"

// canReadFD says whether readFD works here.
const canReadFD = true

// readFD reads once from the non-blocking descriptor fd (retrying when
// interrupted); again reports that it has nothing to read yet.
func readFD(fd uintptr, p []byte) (n int, again bool, err error) {
	for {
		n, err = syscall.Read(int(fd), p)
		if err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EAGAIN {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	return n, false, nil
}
