package session

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// availableMemoryMiB is the memory the host can give a new VM without
// swapping: MemAvailable from /proc/meminfo.
func availableMemoryMiB() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "MemAvailable" {
			continue
		}
		kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		if err != nil {
			return 0, fmt.Errorf("parse MemAvailable %q: %w", v, err)
		}
		return kb / 1024, nil
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}
