package guest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// Init is PID 1: it sets the guest up from the boot data, starts the agent
// as its child, and from then on only reaps orphans. Any setup failure is
// logged to the console and the guest powers off: the host reads the
// console log to tell the user what went wrong. Init never returns.
func Init() {
	log := consoleLogger(false)
	start := time.Now()
	bc, err := setup(log)
	if err != nil {
		log.Error("guest setup failed: " + err.Error())
		halt(log)
	}
	log = consoleLogger(bc.Debug)
	log.Info("guest ready to serve", "setup", time.Since(start).Round(time.Millisecond))
	superviseAgent(log)
	halt(log)
}

// consoleLogger logs to /dev/console.
func consoleLogger(debug bool) *slog.Logger {
	var w io.Writer = os.Stderr
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0); err == nil {
		w = f
	}
	lvl := slog.LevelInfo
	if debug {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: lvl,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	})).With("src", "vibedom-guest")
}

// setup performs every step from the kernel's hand-off to a guest ready to
// serve the control channel.
func setup(log *slog.Logger) (*proto.BootConfig, error) {
	// Helpers are found on PATH: where busybox puts its applets differs
	// between images.
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if err := mountBase(); err != nil {
		return nil, err
	}
	loadModules(log)
	data, err := os.ReadFile(proto.BootConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read boot data: %w", err)
	}
	bc, err := proto.Parse(data)
	if err != nil {
		return nil, err
	}
	if bc.Hostname != "" {
		_ = unix.Sethostname([]byte(bc.Hostname))
	}
	_ = run(log, "ip", "link", "set", "lo", "up")
	if err := mountWorkspace(bc.Workspace); err != nil {
		return nil, err
	}
	if err := mountScratch(log, bc.Scratch.Device); err != nil {
		return nil, err
	}
	if err := mountOverlay(); err != nil {
		return nil, err
	}
	if bc.Network != nil {
		if err := setupNetwork(log, bc.Network); err != nil {
			return nil, err
		}
	}
	if err := writeProfile(bc); err != nil {
		return nil, err
	}
	return bc, nil
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode
}

func mountBase() error {
	for _, m := range []mountSpec{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5", 0o755},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	} {
		if err := os.MkdirAll(m.target, m.mode); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.target, err)
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// /dev/ptmx must open the devpts instance mounted above.
	_ = os.Remove("/dev/ptmx")
	_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}} {
		_ = os.Symlink(l[0], l[1])
	}
	return nil
}

// loadModules loads the image's module list in order. A module that fails
// to load is logged and skipped: some are optional on some CPUs (the
// accelerated crc32c needs SSE 4.2, which an emulated CPU may lack).
func loadModules(log *slog.Logger) {
	f, err := os.Open(proto.ModuleListPath)
	if err != nil {
		log.Debug("no module list", "err", err)
		return
	}
	defer f.Close()
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	release := unix.ByteSliceToString(uts.Release[:])
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rel := strings.TrimSpace(sc.Text())
		if rel == "" || strings.HasPrefix(rel, "#") {
			continue
		}
		path := filepath.Join("/lib/modules", release, rel)
		if err := loadModule(path); err != nil {
			log.Warn("kernel module not loaded", "module", filepath.Base(rel), "err", err)
		}
	}
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err == nil || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// mountWorkspace mounts the host's workspace read-only. The hypervisor
// enforces read-only on the host side too; this flag only makes writes fail
// early.
func mountWorkspace(w proto.Workspace) error {
	if err := os.MkdirAll(proto.WorkspaceMount, 0o755); err != nil {
		return err
	}
	var fstype, data string
	switch w.FSType {
	case proto.FS9P:
		fstype, data = "9p", "trans=virtio,version=9p2000.L,msize=524288,access=any"
	case proto.FSVirtiofs:
		fstype = "virtiofs"
	}
	var err error
	for i := 0; i < 100; i++ { // the device may register after its module loads
		err = unix.Mount(w.Tag, proto.WorkspaceMount, fstype, unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, data)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("mount workspace %q (%s): %w", w.Tag, fstype, err)
}

// mountScratch mounts the scratch disk, making a filesystem on it first if
// it has none. An existing filesystem is kept: it holds the overlay's upper
// layer, which must survive a guest crash.
func mountScratch(log *slog.Logger, dev string) error {
	if !strings.HasPrefix(dev, "/dev/") {
		return fmt.Errorf("scratch device %q is not under /dev", dev)
	}
	if err := waitFor(dev, 5*time.Second); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	has, err := hasExtFS(dev)
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	if !has {
		t := time.Now()
		// Busybox mke2fs makes ext2 (no journal); the ext4 driver mounts
		// it. One inode per 64 KiB keeps formatting quick.
		if err := run(log, "mke2fs", "-F", "-b", "4096", "-i", "65536", "-m", "0", "-L", "vibedom-scratch", dev); err != nil {
			return fmt.Errorf("make a filesystem on the scratch disk: %w", err)
		}
		log.Debug("scratch disk formatted", "took", time.Since(t).Round(time.Millisecond))
	}
	if err := os.MkdirAll(proto.ScratchMount, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, proto.ScratchMount, "ext4", unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount scratch disk %s: %w", dev, err)
	}
	return nil
}

// hasExtFS reports whether dev holds an ext2/3/4 superblock.
func hasExtFS(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := f.ReadAt(magic[:], 1024+56); err != nil {
		return false, err
	}
	return binary.LittleEndian.Uint16(magic[:]) == 0xEF53, nil
}

func mountOverlay() error {
	for _, d := range []string{proto.UpperDir, proto.OverlayWorkDir, proto.WorkDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// redirect_dir and metacopy off: the change set must see every change
	// as a plain copy-up in the upper dir.
	opts := "lowerdir=" + proto.WorkspaceMount + ",upperdir=" + proto.UpperDir + ",workdir=" + proto.OverlayWorkDir +
		",redirect_dir=off,metacopy=off,index=off"
	if err := unix.Mount("overlay", proto.WorkDir, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the overlay at %s: %w", proto.WorkDir, err)
	}
	return nil
}

func waitFor(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", path, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run runs a helper program and returns its output in the error.
func run(log *slog.Logger, name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	if len(out) > 0 {
		log.Debug(name, "output", strings.TrimSpace(string(out)))
	}
	return nil
}

// superviseAgent runs the agent as PID 1's child and reaps every process
// that ends up parented to PID 1 until the agent exits for good.
func superviseAgent(log *slog.Logger) {
	self, err := os.Executable()
	if err != nil {
		self = proto.GuestBinaryPath
	}
	restarts := 0
	for {
		agent := exec.Command(self, "agent")
		agent.Stdout, agent.Stderr = os.Stdout, os.Stderr
		if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
			agent.Stdout, agent.Stderr = f, f
		}
		if err := agent.Start(); err != nil {
			log.Error("start the agent", "err", err)
			return
		}
		pid := agent.Process.Pid
		status := reapUntil(pid)
		if status.Exited() && status.ExitStatus() == 0 {
			log.Info("agent finished")
			return
		}
		restarts++
		log.Error("agent died", "status", describeWait(status), "restart", restarts)
		if restarts > 3 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// reapUntil reaps children until pid exits and returns its status.
func reapUntil(pid int) unix.WaitStatus {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			// ECHILD: nothing left to wait for.
			return ws
		}
		if got == pid {
			return ws
		}
	}
}

func describeWait(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit %d", ws.ExitStatus())
}

// halt syncs and powers off; it never returns.
func halt(log *slog.Logger) {
	unix.Sync()
	log.Info("powering off")
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	for {
		time.Sleep(time.Hour)
	}
}

// Poweroff ends every process but the caller and PID 1, unmounts the
// overlay, scratch disk and workspace, and powers the VM off. Called by the
// agent on the host's request.
func Poweroff(log *slog.Logger) {
	_ = syscall.Kill(-1, syscall.SIGTERM)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && othersAlive() {
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-1, syscall.SIGKILL)
	unix.Sync()
	for _, m := range []string{proto.WorkDir, proto.ScratchMount, proto.WorkspaceMount} {
		if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			log.Warn("unmount", "path", m, "err", err)
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	unix.Sync()
	log.Info("powering off at the host's request")
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// othersAlive reports whether processes other than PID 1, this one and
// kernel threads remain.
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
		// Kernel threads have an empty cmdline.
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}
