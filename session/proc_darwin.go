package session

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// procStart is the start time of process pid, or "" when it cannot be read.
func procStart(pid int) string {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil || kp.Proc.P_pid != int32(pid) {
		return ""
	}
	t := kp.Proc.P_starttime
	return fmt.Sprintf("%d.%06d", t.Sec, t.Usec)
}

// procZombie is not told apart on macOS: a zombie counts as alive until
// reaped.
func procZombie(int) bool { return false }
