package guest

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// cpuSysfs is where the kernel lists the guest's CPUs.
const cpuSysfs = "/sys/devices/system/cpu"

// onlineCPUs brings online every CPU the kernel left offline at boot and
// returns how many it brought up. Under emulation the host boots the
// kernel with one CPU (maxcpus=1): starting the others, and keeping them
// in step while the kernel and its modules load (every cross-CPU TLB
// flush and code patch waits for each emulated CPU), cost a second of an
// emulated boot. PID 1 starts them here, once the agent serves; on every
// other boot all CPUs are online already and this does nothing.
func onlineCPUs(log *slog.Logger, root string) int {
	files, _ := filepath.Glob(filepath.Join(root, "cpu[0-9]*", "online"))
	t := time.Now()
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != "0" {
			continue
		}
		if err := os.WriteFile(f, []byte("1"), 0); err != nil {
			log.Warn("bring a CPU online", "cpu", filepath.Base(filepath.Dir(f)), "err", err)
			continue
		}
		n++
	}
	if n > 0 {
		log.Debug("CPUs brought online", "count", n, "took", time.Since(t).Round(time.Millisecond))
	}
	return n
}
