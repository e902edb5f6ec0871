package guest

import (
	"time"

	"golang.org/x/sys/unix"
)

// uptime is the guest's boot clock: the time since the kernel started.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// bootTimes are the named steps of a boot, in order, for the "boot
// timings" console line the host reads (boot.ParseGuestTimings).
type bootTimes struct {
	steps []any // name, duration, name, duration …
}

func (b *bootTimes) add(name string, d time.Duration) {
	if b == nil {
		return
	}
	b.steps = append(b.steps, name, d.Round(time.Millisecond))
}

// since adds the step name as the time since t and returns now.
func (b *bootTimes) since(name string, t time.Time) time.Time {
	now := time.Now()
	b.add(name, now.Sub(t))
	return now
}
