package dlp

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time the calling thread has used (the caller locks
// itself to its thread): unlike wall-clock time it hardly moves when
// other jobs share the cores.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
