package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// setup performs every step from the kernel's hand-off (with the base
// filesystems mounted) to a guest ready to serve the control channel.
//
// It loads only the kernel modules this boot needs before it mounts
// anything; the rest of the image's modules are returned in later, for
// PID 1 to load once the agent runs. bt receives how long each step took.
func setup(log *slog.Logger, bt *bootTimes) (bc *proto.BootConfig, later []module, err error) {
	os.Setenv("PATH", defaultPath)
	data, err := os.ReadFile(proto.BootConfigPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read boot data %s: %w (the session initramfs is missing or damaged)", proto.BootConfigPath, err)
	}
	bc, err = proto.Parse(data)
	if err != nil {
		return nil, nil, err
	}
	log = consoleLogger(os.Stderr, bc.Debug)
	t := time.Now()
	later = loadModules(log, neededModules(bc))
	bt.since("modules", t)
	host := bc.Hostname
	if host == "" {
		host = "vibedom"
	}
	if err := unix.Sethostname([]byte(host)); err != nil {
		log.Warn("set hostname", "err", err)
	}
	step := func(name string, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return err
		}
		bt.since(name, t)
		return nil
	}
	// In-process: starting busybox ip from PID 1 costs a fork and an exec,
	// a good part of a second under emulation.
	if err := step("loopback", loopbackUp); err != nil {
		log.Warn("loopback interface", "err", err)
	}
	if err := step("workspace", func() error { return mountWorkspace(bc.Workspace) }); err != nil {
		return nil, nil, err
	}
	if err := step("scratch", func() error { return mountScratch(log, bc.Scratch.Device) }); err != nil {
		return nil, nil, err
	}
	if err := step("overlay", mountOverlay); err != nil {
		return nil, nil, err
	}
	if bc.Network != nil {
		if err := step("network", func() error { return setupNetwork(log, bc.Network) }); err != nil {
			return nil, nil, err
		}
	}
	if err := writeProfile("/", SessionEnv(bc, caBundle(bc))); err != nil {
		return nil, nil, fmt.Errorf("write the shell profile: %w", err)
	}
	if bc.Root != nil {
		if err := step("root", func() error { return mountRoot(log, bc.Root, bc.Layers) }); err != nil {
			return nil, nil, err
		}
		if err := writeProfile(proto.RootDir, SessionEnv(bc, caBundle(bc))); err != nil {
			return nil, nil, fmt.Errorf("write the shell profile in the root: %w", err)
		}
	}
	return bc, later, nil
}

// loopbackUp brings the loopback interface up, as `ip link set lo up`
// does.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode
}

// mountBase mounts the kernel filesystems and the tmpfs the guest needs.
func mountBase() error {
	for _, m := range []mountSpec{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	} {
		if err := os.MkdirAll(m.target, m.mode); err != nil {
			return fmt.Errorf("create mount point %s: %w", m.target, err)
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// /dev/ptmx must open the devpts instance mounted above.
	_ = os.Remove("/dev/ptmx")
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return fmt.Errorf("link /dev/ptmx: %w", err)
	}
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}} {
		_ = os.Symlink(l[0], l[1])
	}
	return nil
}

func errText(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// workspaceMount returns the filesystem type and options of the workspace
// share. Read-only is also enforced by the hypervisor on the host side; the
// flag here only makes writes fail early.
func workspaceMount(w proto.Workspace) (fstype, data string, err error) {
	switch w.FSType {
	case proto.FS9P:
		// 512 KiB messages: large reads and directory listings take a
		// fraction of the round trips of the 8 KiB default.
		return "9p", "trans=virtio,version=9p2000.L,msize=524288,access=any", nil
	case proto.FSVirtiofs:
		return "virtiofs", "", nil
	}
	return "", "", fmt.Errorf("unknown workspace filesystem %q", w.FSType)
}

func mountWorkspace(w proto.Workspace) error {
	if err := os.MkdirAll(proto.WorkspaceMount, 0o755); err != nil {
		return err
	}
	fstype, data, err := workspaceMount(w)
	if err != nil {
		return err
	}
	// The device may register a moment after its module loads.
	for i := 0; ; i++ {
		err = unix.Mount(w.Tag, proto.WorkspaceMount, fstype, unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, data)
		if err == nil {
			return nil
		}
		retry := errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL)
		if !retry || i >= 40 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	hint := ""
	if tags := shareTags(fstype); len(tags) > 0 {
		hint = " (the VM offers " + strings.Join(tags, ", ") + ")"
	} else if fstype == "9p" {
		hint = " (the VM offers no 9p share)"
	}
	return fmt.Errorf("mount the workspace share %q (%s) on %s: %w%s", w.Tag, fstype, proto.WorkspaceMount, err, hint)
}

// shareTags lists the tags of the shares the VM offers, for error
// messages. Only 9p devices list theirs in sysfs on every kernel.
func shareTags(fstype string) []string {
	if fstype != "9p" {
		return nil
	}
	files, _ := filepath.Glob("/sys/bus/virtio/drivers/9pnet_virtio/virtio*/mount_tag")
	var tags []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			tags = append(tags, strconv.Quote(strings.TrimRight(string(b), "\x00\n")))
		}
	}
	return tags
}

// mountScratch mounts the scratch disk, making a filesystem on it first if
// it has none. An existing filesystem is kept: it holds the overlay's upper
// layer, which must survive a guest crash.
func mountScratch(log *slog.Logger, dev string) error {
	if !strings.HasPrefix(dev, "/dev/") || strings.Contains(dev, "..") {
		return fmt.Errorf("scratch device %q is not under /dev", dev)
	}
	if err := waitFor(dev, 5*time.Second); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	has, err := hasExtFS(dev)
	if err != nil {
		return fmt.Errorf("scratch disk %s: %w", dev, err)
	}
	if !has {
		t := time.Now()
		// Busybox mke2fs makes ext2 only (no journal); the ext4 driver
		// mounts it. One inode per 64 KiB keeps formatting quick (the
		// inode tables are written in full) and still gives an 8 GiB disk
		// 131072 inodes.
		if err := run(log, "mke2fs", "-F", "-b", "4096", "-i", "65536", "-m", "0", "-L", "vibedom-scratch", dev); err != nil {
			return fmt.Errorf("make a filesystem on the scratch disk %s: %w", dev, err)
		}
		log.Debug("scratch disk formatted", "took", time.Since(t).Round(time.Millisecond))
	}
	if err := os.MkdirAll(proto.ScratchMount, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, proto.ScratchMount, "ext4", unix.MS_NOATIME|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount the scratch disk %s on %s: %w", dev, proto.ScratchMount, err)
	}
	return nil
}

// extMagicOffset is where an ext2/3/4 superblock keeps its magic number.
const extMagicOffset = 1024 + 56

// hasExtFS reports whether the device or file at path holds an ext2/3/4
// superblock. A device too small to hold one has none.
func hasExtFS(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var magic [2]byte
	if _, err := f.ReadAt(magic[:], extMagicOffset); err != nil {
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		return false, fmt.Errorf("read the superblock: %w", err)
	}
	return binary.LittleEndian.Uint16(magic[:]) == 0xEF53, nil
}

// overlayOptions are the OverlayFS mount options of /work. redirect_dir,
// metacopy and index are off so every change shows in the upper dir as a
// plain copy-up, a whiteout or an opaque dir: what the change set reads.
func overlayOptions() string {
	return "lowerdir=" + proto.WorkspaceMount + ",upperdir=" + proto.UpperDir + ",workdir=" + proto.OverlayWorkDir +
		",redirect_dir=off,metacopy=off,index=off"
}

func mountOverlay() error {
	for _, d := range []string{proto.UpperDir, proto.OverlayWorkDir, proto.WorkDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("overlay", proto.WorkDir, "overlay", unix.MS_NODEV, overlayOptions()); err != nil {
		return fmt.Errorf("mount the overlay on %s: %w", proto.WorkDir, err)
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
