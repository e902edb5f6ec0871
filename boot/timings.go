package boot

import (
	"bufio"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Step is one named step of a boot and how long it took.
type Step struct {
	Name string
	Took time.Duration
}

// maxGuestSteps bounds what GuestTimings keeps of a (hostile) console line.
const maxGuestSteps = 16

const guestPrefix = `msg="boot timings" src=vibedom-guest`

// guestLine matches the guest's "boot timings" console line (PID 1 writes
// it once set up); guestStep one name=duration pair in it.
var (
	guestLine = regexp.MustCompile(`^level=INFO msg="boot timings" src=vibedom-guest( [a-z_]{1,20}=[0-9a-zµ.]{1,20})+\r?$`)
	guestStep = regexp.MustCompile(` ([a-z_]{1,20})=([0-9a-zµ.]{1,20})`)
	serving   = regexp.MustCompile(`^level=INFO msg="serving the control channel" src=vibedom-guest .*uptime=([0-9a-zµ.]{1,20})\r?$`)
)

// GuestTimings reads the guest's own account of its boot from the console
// log: the kernel (its clock's reading when PID 1 started), PID 1's steps
// (modules, mounts, network) and, as "agent", the guest's clock when the
// agent served the control channel. The console is guest output: only
// well-formed lines count, values that are not durations are dropped, and
// at most a few steps are kept. It returns nil when there is no such line.
func GuestTimings(console string) []Step {
	f, err := os.Open(console)
	if err != nil {
		return nil
	}
	defer f.Close()
	var steps []Step
	var agent time.Duration
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		line := sc.Text()
		if m := serving.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil && d >= 0 {
				agent = d
			}
			continue
		}
		if !guestLine.MatchString(line) {
			continue
		}
		steps = steps[:0]
		pairs := line[strings.Index(line, guestPrefix)+len(guestPrefix):]
		for _, m := range guestStep.FindAllStringSubmatch(pairs, maxGuestSteps) {
			d, err := time.ParseDuration(m[2])
			if err != nil || d < 0 {
				continue
			}
			steps = append(steps, Step{Name: m[1], Took: d})
		}
	}
	if agent > 0 {
		steps = append(steps, Step{Name: "agent", Took: agent})
	}
	return steps
}

// FormatSteps is "name 1.23s, name 45ms, …".
func FormatSteps(steps []Step) string {
	parts := make([]string, len(steps))
	for i, s := range steps {
		parts[i] = s.Name + " " + s.Took.Round(time.Millisecond).String()
	}
	return strings.Join(parts, ", ")
}

// firstRead is a connection that records when its first read returned
// data: when the guest agent first answered on the control channel.
type firstRead struct {
	net.Conn
	once sync.Once
	at   func()
}

func (c *firstRead) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(c.at)
	}
	return n, err
}
