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

// rusageThread is RUSAGE_THREAD (Linux), which the syscall package does
// not name.
const rusageThread = 1

// threadCPU is the CPU time the calling thread has used. A benchmark
// locked to its thread measures with it the caller's share of a scrub,
// without what the known-value worker does on another core: the length of
// the critical path, which bounds the wall-clock rate an idle machine
// can reach.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
