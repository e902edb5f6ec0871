package guest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// shutdownGrace is how long processes get between SIGTERM and SIGKILL when
// the guest powers off.
const shutdownGrace = 2 * time.Second

// Init is PID 1. It sets the guest up from the boot data, starts
// "vibedom-guest agent" as its only child, and from then on only reaps
// processes. The guest powers off when setup fails, when the agent dies,
// when PID 1 is asked to (busybox poweroff, halt and reboot signal PID 1)
// and when the agent handles the host's poweroff request. Every reason is
// logged to the console first, which the host reads to tell the user what
// happened. Init never returns.
func Init() {
	start := time.Now()
	// Nothing can be logged before /dev is mounted: the initramfs has no
	// device nodes, so the kernel gave PID 1 no console.
	baseErr := mountBase()
	attachConsole()
	log := consoleLogger(os.Stderr, false)
	// The first line: a console that lacks it tells a kernel that never
	// reached PID 1 from a set-up that stalled.
	log.Info("guest init started")
	defer func() {
		if r := recover(); r != nil {
			log.Error(fmt.Sprintf("guest init crashed: %v\n%s", r, debug.Stack()))
			halt(log)
		}
	}()
	if baseErr != nil {
		log.Error("guest setup failed: " + baseErr.Error())
		halt(log)
	}
	// The kernel's share of the boot: its clock started with it.
	bt := &bootTimes{}
	bt.add("kernel", uptime()-time.Since(start))
	bc, later, err := setup(log, bt)
	if err != nil {
		log.Error("guest setup failed: " + err.Error())
		halt(log)
	}
	log = consoleLogger(os.Stderr, bc.Debug)
	bt.add("setup", time.Since(start))
	log.Info("guest set up", "took", time.Since(start).Round(time.Millisecond))
	// One line the host reads into its own timings (boot.GuestTimings).
	log.Info("boot timings", bt.steps...)
	supervise(log, func() {
		// Beside the agent's start and the host's SSH handshake, which
		// come first: this thread at the lowest CPU priority (the kernel
		// does much of a CPU's start-up and of a module's load in it).
		runtime.LockOSThread()
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
		onlineCPUs(log, cpuSysfs)
		loadLater(log, later)
	})
}

// attachConsole makes /dev/console PID 1's stdin, stdout and stderr, so
// the agent inherits it and a Go crash report reaches the console.
func attachConsole() {
	f, err := os.OpenFile("/dev/console", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for fd := 0; fd <= 2; fd++ {
		if int(f.Fd()) != fd {
			_ = unix.Dup3(int(f.Fd()), fd, 0)
		}
	}
	if f.Fd() > 2 {
		f.Close()
	}
}

// consoleLogger returns the guest's logger: text lines without a time (the
// console log has the kernel's), tagged so they stand out from kernel
// messages.
func consoleLogger(w io.Writer, debug bool) *slog.Logger {
	lvl := slog.LevelInfo
	if debug {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: lvl,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	})).With("src", "vibedom-guest")
}

// pid1 is PID 1's state after setup.
type pid1 struct {
	log          *slog.Logger
	shuttingDown atomic.Bool
	shutdown     sync.Once
}

// supervise starts the agent, reaps every process that ends up parented to
// PID 1, and powers off when the agent dies or PID 1 is signalled.
//
// afterStart runs beside the agent once it has started.
func supervise(log *slog.Logger, afterStart func()) {
	p := &pid1{log: log}
	sigs := make(chan os.Signal, 4)
	// busybox halt, poweroff and reboot send USR1, USR2 and TERM to PID 1;
	// ctrl-alt-del sends INT; PWR is the UPS convention. A sandbox VM is
	// never rebooted: each ends in a power off.
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPWR, syscall.SIGHUP, syscall.SIGQUIT)
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGHUP || sig == syscall.SIGQUIT {
				continue
			}
			p.powerOff("PID 1 got " + sigName(sig.(syscall.Signal)))
		}
	}()
	self, err := os.Executable()
	if err != nil {
		self = proto.GuestBinaryPath
	}
	agent := exec.Command(self, "agent")
	agent.Stdin, agent.Stdout, agent.Stderr = nil, os.Stdout, os.Stderr
	if err := agent.Start(); err != nil {
		p.powerOff("cannot start the guest agent: " + err.Error())
	}
	pid := agent.Process.Pid
	if afterStart != nil {
		go afterStart()
	}
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			// ECHILD: nothing left; wait for whatever powers off.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if got != pid || p.shuttingDown.Load() {
			continue
		}
		if ws.Exited() && ws.ExitStatus() == 0 {
			// The agent returns only once poweroff is under way.
			go p.powerOff("the guest agent finished")
		} else {
			go p.powerOff("the guest agent died (" + describeWait(ws) + "); see the lines above")
		}
	}
}

// powerOff runs the shutdown once; later calls only log.
func (p *pid1) powerOff(reason string) {
	first := false
	p.shutdown.Do(func() { first = true })
	if !first {
		p.log.Debug("already powering off", "also", reason)
		return
	}
	// halt does not return: the caller's goroutine ends here.
	p.shuttingDown.Store(true)
	p.log.Info("powering off: " + reason)
	Shutdown(p.log)
	halt(p.log)
}

func describeWait(ws unix.WaitStatus) string {
	switch {
	case ws.Signaled() && ws.CoreDump():
		return "killed by " + sigName(ws.Signal()) + ", core dumped"
	case ws.Signaled():
		return "killed by " + sigName(ws.Signal())
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// sigName is "SIGKILL" for 9, or the number for a signal without a name.
func sigName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return n
	}
	return fmt.Sprintf("signal %d", int(sig))
}

// halt syncs and powers the machine off. It never returns.
func halt(log *slog.Logger) {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Only reached when the process may not power off (not root, or a
	// container); PID 1 must not exit, so it stays.
	log.Error("power off failed", "err", err)
	for {
		time.Sleep(time.Hour)
	}
}

// Shutdown ends every process but PID 1 and the caller (SIGTERM, then
// SIGKILL after a short grace), syncs, and unmounts the overlay, the
// scratch disk and the workspace, so the scratch disk is clean for a later
// look. It does not power off.
func Shutdown(log *slog.Logger) {
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(shutdownGrace)
	for time.Now().Before(deadline) && othersAlive() {
		time.Sleep(50 * time.Millisecond)
	}
	if othersAlive() {
		log.Debug("processes ignored SIGTERM; killing them")
		_ = unix.Kill(-1, unix.SIGKILL)
		for i := 0; i < 20 && othersAlive(); i++ {
			time.Sleep(25 * time.Millisecond)
		}
	}
	unix.Sync()
	// The root overlay and what is mounted inside it go first (detached:
	// they hold /work and the scratch disk).
	if _, err := os.Stat(proto.RootDir); err == nil {
		_ = unix.Unmount(proto.RootDir, unix.MNT_DETACH)
		_ = unix.Unmount(proto.RootLower, unix.MNT_DETACH)
	}
	for _, m := range []string{proto.WorkDir, proto.ScratchMount, proto.WorkspaceMount} {
		if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			log.Warn("unmount failed; detaching it", "path", m, "err", err)
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	unix.Sync()
}

// othersAlive reports whether any process other than PID 1 and the caller
// remains (kernel threads and zombies, which have an empty command line,
// do not count).
func othersAlive() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self := os.Getpid()
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == 1 || pid == self {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}
