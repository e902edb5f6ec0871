//go:build !linux

package dlp

import "time"

// processCPU is not measured here (0).
func processCPU() time.Duration { return 0 }

// threadCPU is not measured here (0).
func threadCPU() time.Duration { return 0 }
