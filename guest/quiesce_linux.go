//go:build linux

package guest

import (
	"bytes"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// quiesceRounds bounds how often stopOthers looks for processes again
// (one that forks while it is being killed comes back in the next round).
const quiesceRounds = 200

// stopOthers kills every process of the guest but the caller and its
// ancestors (the collector, the shell that may run it, the guest agent,
// PID 1), and waits until they are gone: the agent, the commands of
// `vibedom exec`, their children and whatever they left running in the
// background. What the collection then reads cannot change under it. It
// returns how many processes it killed. Kernel threads ignore the signal
// and are not waited for.
func stopOthers() int {
	keep := map[int]bool{}
	for pid := os.Getpid(); pid > 1; {
		keep[pid] = true
		pid = parentOf(pid)
	}
	keep[1] = true
	killed := map[int]bool{}
	for round := 0; round < quiesceRounds; round++ {
		left := 0
		for _, pid := range userProcesses() {
			if keep[pid] {
				continue
			}
			left++
			if unix.Kill(pid, unix.SIGKILL) == nil {
				killed[pid] = true
			}
		}
		if left == 0 {
			break
		}
		// A killed process becomes a zombie (empty command line) at once,
		// but may take a moment under load to get there.
		time.Sleep(10 * time.Millisecond)
	}
	return len(killed)
}

// userProcesses lists the PIDs of processes with a command line: not
// kernel threads, not zombies.
func userProcesses() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// parentOf is pid's parent from /proc/PID/stat, 0 when unknown.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	return ppid
}
