package dlp

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used, on all its threads:
// unlike wall-clock time it hardly moves when other jobs share the cores.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
