// Package session runs vibedom sessions: it checks the workspace, prepares
// the image, keys and disks, boots the VM, connects to the guest agent, runs
// the agent or a command in it, and on the way out collects the agent's
// changes as a patch, shuts the VM down and leaves nothing behind but the
// session folder and its logs.
package session

import (
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/boot"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/vm"
)

// Errors a user can act on. Each is wrapped with the details.
var (
	ErrLowMemory  = errors.New("not enough memory")
	ErrBootFailed = errors.New("the VM did not come up")
)

// Options configures one session.
type Options struct {
	// Home is the vibedom state folder.
	Home home.Home
	// Workspace is the project folder the agent works on (read-only to it).
	Workspace string
	// Name is the session name; empty derives one from the workspace.
	Name string
	// CPUs and MemoryMiB size the VM.
	CPUs      int
	MemoryMiB int
	// Arch is the guest architecture; empty means the host's.
	Arch vm.Arch
	// Driver runs the VM; nil picks the platform's default.
	Driver vm.Driver
	// Command runs without a TTY when non-empty; otherwise an interactive
	// shell is attached to Terminal.
	Command []string
	// Agent, when set, starts a coding agent (its binary from `vibedom init
	// --agents`) instead of Command or the shell.
	Agent *AgentOptions
	// AsRoot runs the command or shell as root inside the root image
	// (default: its unprivileged agent user). The Debian test image runs
	// everything as root.
	AsRoot bool
	// Stdin, Stdout and Stderr are the user's streams.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Terminal is the user's terminal, nil when there is none.
	Terminal *Terminal
	// Progress receives one human line per step; nil is quiet.
	Progress io.Writer
	// ShowTimings adds the breakdown of the time to a ready guest to the
	// progress lines (session.log always has it).
	ShowTimings bool
	// BootTimeout bounds the wait for the guest agent; zero means 3 minutes.
	BootTimeout time.Duration
	// ScratchSize is the size of the sparse scratch disk holding the
	// agent's writes; zero means 8 GiB.
	ScratchSize int64
	// Preflight configures the secrets scan before boot.
	Preflight PreflightOptions
	// Egress configures the guest's network.
	Egress EgressOptions
	// DLP configures the scrubbing of what the agent sends out.
	DLP policy.DLPOptions
	// Review decides what happens to the agent's changes at the end.
	Review ReviewOptions
	// Detached runs the session without a terminal (the host of `vibedom
	// run --detach`): the agent, shell or command runs on a kept terminal
	// that `vibedom attach` joins, and at the end the changes wait for
	// `vibedom review` instead of a prompt.
	Detached bool
	// Stop, when it closes, asks the session to stop as `vibedom stop`
	// does: the agent is ended and its changes collected.
	Stop <-chan struct{}
	// Interrupts delivers the user's Ctrl-C (SIGINT, SIGTERM): before the
	// changes are collected each asks the session to stop; while they are
	// collected the first says what a second does, and the second aborts
	// the collection and keeps the scratch disk for `vibedom recover`.
	Interrupts <-chan os.Signal
	// CollectIdle is how long the collection waits for the guest's next
	// byte before it gives up and keeps the scratch disk; zero means the
	// default (2 minutes), or $VIBEDOM_COLLECT_IDLE (a Go duration).
	CollectIdle time.Duration
	// Balloon says whether the session steers the VM's memory balloon so
	// an idle guest gives memory back (balloon.go); empty means
	// $VIBEDOM_BALLOON, else BalloonAuto.
	Balloon BalloonMode
	// Ready, when set, is called once the guest is up, the agent started
	// and the control socket serves.
	Ready func(name string)
	// SSHAgent forwards the deploy key's SSH agent to the guest.
	SSHAgent SSHAgentOptions
	// Ports are published from the start (ports.go).
	Ports []PortSpec
	// Log receives the session's own debug log besides session.log; nil
	// writes only session.log.
	Log *slog.Logger

	// reserved: detach (run --detach) made the session folder (empty) for this host.
	reserved bool
	// scanned is the secrets preflight's result when detach ran it; the
	// session then does not scan again.
	scanned *scanResult
}

// CollectIdleEnv names the variable that sets Options.CollectIdle.
const CollectIdleEnv = "VIBEDOM_COLLECT_IDLE"

// Result is what a finished session reports.
type Result struct {
	Name       string
	SessionDir string
	LogDir     string
	// ExitCode is the command's or shell's exit status, shell style:
	// 128+N when killed by signal N.
	ExitCode int
	Timings  Timings
	// Host is set when the session was detached (StartOptions.Detach): it runs on in
	// the background.
	Host *HostInfo
}

// Timings splits the time to a ready guest into host-side work and guest
// boot, for docs/performance.md.
type Timings struct {
	Prepare   time.Duration // workspace checks, image, keys, disks, initrd
	VMStart   time.Duration // hypervisor process start until it runs the VM
	Ready     time.Duration // VM start until the SSH handshake completed
	Handshake time.Duration // SSH handshake once the guest answered
	Total     time.Duration // Run start until the guest was ready
	// Steps are the host preparation's named steps.
	Steps []boot.Step
	// Answer is the VM running until the guest agent's first byte.
	Answer time.Duration
	// Guest is the guest's own account of its boot (boot.GuestTimings).
	Guest []boot.Step
}

func (o *Options) setDefaults() error {
	if o.Home == "" {
		h, err := home.Default()
		if err != nil {
			return err
		}
		o.Home = h
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 2048
	}
	if o.Arch == "" {
		o.Arch = HostArch()
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 3 * time.Minute
	}
	if o.ScratchSize == 0 {
		o.ScratchSize = 8 << 30
	}
	if o.CollectIdle == 0 {
		if v := os.Getenv(CollectIdleEnv); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("$%s=%q: want a duration such as 5m", CollectIdleEnv, v)
			}
			o.CollectIdle = d
		}
	}
	if o.Balloon == "" {
		m, err := parseBalloonMode(os.Getenv(BalloonEnv))
		if err != nil {
			return fmt.Errorf("$%s: %w", BalloonEnv, err)
		}
		o.Balloon = m
	}
	if o.Stdin == nil {
		o.Stdin = strings.NewReader("")
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return nil
}

// CheckMemory refuses a VM bigger than the host can give.
func CheckMemory(wantMiB int) error {
	avail, err := availableMemoryMiB()
	if err != nil {
		return nil // cannot tell; let the hypervisor decide
	}
	// The hypervisor and vibedom itself need some room too.
	if need := wantMiB + 256; need > avail {
		return fmt.Errorf("%w: the VM needs %d MiB but the host has %d MiB available: pass a smaller --memory (e.g. --memory %dM) or close other programs",
			ErrLowMemory, wantMiB, avail, max(128, (avail-256)/128*128))
	}
	return nil
}

// shellQuote quotes args for /bin/sh so the guest runs exactly them.
func shellQuote(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			b.WriteString(a)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(a, "'", `'\''`))
		b.WriteByte('\'')
	}
	return b.String()
}
