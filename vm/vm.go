// Package vm describes a virtual machine that runs one vibedom session and the
// interfaces a hypervisor backend implements to run it.
//
// The package is pure Go and builds on every platform. It does not start
// anything itself: backends live in sub-packages (vm/qemu for Linux hosts and
// tests, vm/vz for Apple's Virtualization.framework) and turn a Config into a
// running Machine. The conformance suite in boot/vmtest is the one body of
// tests every backend must pass (it lives above vm because it boots the real
// guest image).
//
// For pausing to disk it also owns the record written next to a saved
// machine's state file (SavedState, with the Config's Fingerprint), the
// check that refuses restoring into a different machine (CheckRestore) and
// the host-wide lock backends take around saving and restoring
// (AcquireSaveLock).
package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Sentinel errors shared by every backend. Check them with errors.Is.
var (
	// ErrUnavailable means the backend cannot run on this host (wrong OS,
	// hypervisor missing, entitlement absent). The wrapped message says what
	// the user should install or change.
	ErrUnavailable = errors.New("hypervisor unavailable")
	// ErrNotSupported means the machine lacks an optional capability, such as
	// pausing or saving its state.
	ErrNotSupported = errors.New("not supported by this backend")
	// ErrNotRunning means the operation needs a running (or paused) machine.
	ErrNotRunning = errors.New("machine is not running")
	// ErrInvalidConfig means the Config was rejected before anything started.
	ErrInvalidConfig = errors.New("invalid machine configuration")
)

// Arch is a guest CPU architecture, spelled as GOARCH spells it.
type Arch string

// Architectures a guest may have.
const (
	ArchAMD64 Arch = "amd64"
	ArchARM64 Arch = "arm64"
)

// Share is a host directory exported to the guest.
type Share struct {
	// Tag is the name the guest mounts the share by (9p mount_tag, virtiofs tag).
	Tag string
	// HostPath is an absolute path to an existing directory on the host.
	HostPath string
	// ReadOnly makes the hypervisor refuse every write from the guest. vibedom
	// always shares the workspace read-only; the guard lives on the host side,
	// so root in the guest cannot lift it with a remount.
	ReadOnly bool
}

// Disk is a raw disk image attached as a virtio block device. Disks appear in
// the guest in the order given: the first is /dev/vda, the second /dev/vdb.
type Disk struct {
	// Path is the raw image file on the host. It must exist.
	Path string
	// ReadOnly attaches the disk read-only.
	ReadOnly bool
}

// Network attaches one virtio-net NIC whose Ethernet frames are exchanged
// over a datagram socket, one frame per datagram, with a userspace network
// stack on the host. There is no other route out of the guest.
type Network struct {
	// Conn is the VM's end of a connected AF_UNIX SOCK_DGRAM socket pair. The
	// backend hands it to the hypervisor; the caller keeps the other end.
	// The backend does not close it; the caller closes it after Wait returns.
	Conn *os.File
	// MAC is the NIC's hardware address, e.g. "52:54:00:12:34:56". Empty
	// lets the backend choose a locally administered one.
	MAC string
}

// Config is everything needed to boot one machine. It is a description only:
// building it has no side effects, and it holds no open resources other than
// Network.Conn.
type Config struct {
	// Name identifies the machine in logs and process titles.
	Name string
	// Arch is the guest architecture. Backends reject what they cannot run.
	Arch Arch
	// CPUs is the number of virtual CPUs (>= 1).
	CPUs int
	// MemoryMiB is the guest RAM in MiB (>= 128).
	MemoryMiB int
	// Kernel is the path of the kernel image (bzImage on amd64, an
	// uncompressed arm64 Image on arm64).
	Kernel string
	// Initrd is the path of the initramfs (possibly several cpio archives
	// concatenated).
	Initrd string
	// Cmdline holds extra kernel arguments. The backend adds the console
	// argument that matches the console device it provides.
	Cmdline string
	// Shares are host directories exported to the guest.
	Shares []Share
	// Disks are attached as virtio block devices, in order.
	Disks []Disk
	// Network, when non-nil, attaches the guest's only NIC.
	Network *Network
	// ConsoleLog is a file the guest's console output is written to. Empty
	// discards it.
	ConsoleLog string
	// StateDir is a private directory (0700) where the backend may keep
	// sockets and runtime files. It must exist and should have a short path:
	// unix socket paths are limited to about 100 bytes.
	StateDir string
	// ControlPort is the vsock port the guest agent listens on, for backends
	// whose control channel is vsock. Zero means DefaultControlPort.
	ControlPort uint32
	// MachineID is the machine's hardware identity as the backend spells it
	// (opaque bytes; vz's GenericMachineIdentifier data representation).
	// Empty lets the backend make a new one, which a machine implementing
	// Identified reports. A machine restored from saved state needs the
	// identity it was saved with, so a caller that may save a machine keeps
	// what MachineID reported and passes it back here. Two machines running
	// at once must not share one.
	MachineID []byte
}

// DefaultControlPort is the vsock port of the guest agent's SSH server.
const DefaultControlPort uint32 = 2222

// ControlPortName is the name of the virtio-serial port that carries the
// control channel on backends without vsock.
const ControlPortName = "vibedom.control"

// Validate reports the first problem that would stop the machine from
// booting, wrapped in ErrInvalidConfig. It checks the host paths exist.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch c.Arch {
	case ArchAMD64, ArchARM64:
	default:
		return bad("unknown guest architecture %q", c.Arch)
	}
	if c.CPUs < 1 {
		return bad("cpus must be at least 1, got %d", c.CPUs)
	}
	if c.MemoryMiB < 128 {
		return bad("memory must be at least 128 MiB, got %d MiB", c.MemoryMiB)
	}
	for _, p := range []struct{ what, path string }{{"kernel", c.Kernel}, {"initrd", c.Initrd}} {
		if p.path == "" {
			return bad("no %s given", p.what)
		}
		if fi, err := os.Stat(p.path); err != nil {
			return bad("%s: %v", p.what, err)
		} else if !fi.Mode().IsRegular() {
			return bad("%s %s is not a regular file", p.what, p.path)
		}
	}
	tags := map[string]bool{}
	for _, s := range c.Shares {
		if s.Tag == "" || len(s.Tag) > 31 {
			return bad("share tag %q must be 1 to 31 bytes", s.Tag)
		}
		if tags[s.Tag] {
			return bad("share tag %q used twice", s.Tag)
		}
		tags[s.Tag] = true
		fi, err := os.Stat(s.HostPath)
		if err != nil {
			return bad("share %q: %v", s.Tag, err)
		}
		if !fi.IsDir() {
			return bad("share %q: %s is not a directory", s.Tag, s.HostPath)
		}
	}
	for i, d := range c.Disks {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return bad("disk %d: %v", i, err)
		}
		if !fi.Mode().IsRegular() {
			return bad("disk %d: %s is not a regular file", i, d.Path)
		}
	}
	if c.Network != nil && c.Network.Conn == nil {
		return bad("network has no socket")
	}
	if c.StateDir == "" {
		return bad("no state directory")
	}
	if fi, err := os.Stat(c.StateDir); err != nil || !fi.IsDir() {
		return bad("state directory %s does not exist", c.StateDir)
	}
	return nil
}

// State is the lifecycle state of a Machine.
type State string

// Machine states.
const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopping State = "stopping"
	StateStopped  State = "stopped"
	StateError    State = "error"
)

// Driver creates machines on one hypervisor.
type Driver interface {
	// Name is a short identifier such as "qemu" or "vz", for logs and
	// messages. Callers never branch on it: what differs between backends
	// is reported by Info.
	Name() string
	// Info reports how machines of this driver reach the guest: the
	// control channel's transport and the filesystem of its shares. It
	// answers from what the host offers (a helper program found or not)
	// and does not change for the driver's life.
	Info() Info
	// Available reports whether the driver can start a machine for arch on
	// this host. A non-nil error wraps ErrUnavailable and says what to
	// install or change.
	Available(ctx context.Context, arch Arch) error
	// Start validates cfg, boots the machine and returns once the hypervisor
	// runs it (not once the guest is ready: use DialControl for that). If ctx
	// is cancelled during Start, the machine is torn down. After Start
	// returns, ctx no longer governs the machine's life.
	Start(ctx context.Context, cfg Config) (Machine, error)
}

// CheckStatus grades one Check.
type CheckStatus string

// Check grades.
const (
	CheckOK   CheckStatus = "ok"
	CheckWarn CheckStatus = "warn" // works, but slower or less safe than it could
	CheckFail CheckStatus = "fail" // stops a session
)

// Check is one finding about the host, for `vibedom doctor`.
type Check struct {
	Name   string      `json:"name"`
	Status CheckStatus `json:"status"`
	Detail string      `json:"detail,omitempty"`
	// Fix says what to do about a warn or fail.
	Fix string `json:"fix,omitempty"`
}

// Doctor is implemented by drivers that can say more about their host than
// Available: each thing they need, and what to do about what is missing.
type Doctor interface {
	Doctor(ctx context.Context, arch Arch) []Check
}

// AccelFallback is implemented by drivers that choose hardware
// acceleration by probing the host rather than because the user asked
// (QEMU's KVM probe). A probe can pass on a host whose real guests then
// hang without a word (nested virtualisation, SMP bring-up): boot.Start
// uses this to give such a guest a shorter wait and, when it stays
// silent, to boot once more emulated.
type AccelFallback interface {
	// Probed reports whether m, started by this driver, runs under
	// acceleration the driver chose by a probe.
	Probed(m Machine) bool
	// FallBack records that guests of cfg do not run under that
	// acceleration on this host: later Starts emulate, in this process
	// and (where the driver keeps the probe's verdict) in later ones.
	FallBack(cfg Config)
}

// Transport is how the control channel reaches the guest agent.
type Transport string

// Control channel transports.
const (
	// TransportVsock is an AF_VSOCK stream on Config.ControlPort.
	TransportVsock Transport = "vsock"
	// TransportVirtioSerial is a virtio-serial port named ControlPortName.
	TransportVirtioSerial Transport = "virtio-serial"
)

// ShareFS is the filesystem a share reaches the guest through.
type ShareFS string

// Share filesystems.
const (
	ShareVirtiofs ShareFS = "virtiofs"
	Share9P       ShareFS = "9p"
)

// Info describes what a driver's machines offer the guest.
type Info struct {
	Transport Transport
	ShareFS   ShareFS
	// FreePageReporting means the hypervisor takes back by itself the
	// memory a guest frees (virtio-balloon free page reporting), so the
	// host need not steer the balloon (Ballooner) for an idle guest to
	// give memory back.
	FreePageReporting bool
}

// Machine is one running (or finished) virtual machine.
//
// All methods are safe for concurrent use.
type Machine interface {
	// DialControl opens the control channel to the guest agent. It retries
	// until the channel accepts a connection or ctx ends; the returned error
	// then wraps ctx.Err(). On backends whose channel is a single byte
	// stream (virtio-serial), only one connection is open at a time and a
	// second dial waits for the first to close.
	DialControl(ctx context.Context) (net.Conn, error)
	// State reports the current lifecycle state.
	State() State
	// StateChanges delivers each new state once, in order; the channel is
	// closed after StateStopped or StateError. Slow readers miss no final
	// state: the last value is always delivered before close.
	StateChanges() <-chan State
	// Wait blocks until the machine has stopped or ctx ends. It returns nil
	// for a clean guest power-off and an error describing how the machine
	// died otherwise.
	Wait(ctx context.Context) error
	// Stop asks the guest to power off (ACPI power button or equivalent) and,
	// if it has not stopped when ctx ends, stops it forcefully. It returns
	// once the machine has stopped. Stopping a stopped machine is a no-op.
	Stop(ctx context.Context) error
	// Kill stops the machine at once, without asking the guest.
	Kill() error
}

// Pauser is implemented by machines that can freeze and thaw their vCPUs in
// memory. Paused machines keep their memory and open files; the guest sees no
// time pass other than its clock jumping.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// StateSaver is implemented by machines that can write their whole state to
// a file and be restored from it later by the same driver.
//
// SaveState pauses the machine if it runs, writes its state to path, which
// must not exist yet, and stops it; Wait then returns nil. If it fails, the
// machine is left running (or paused) as it was and path does not exist.
// SaveToDisk wraps it with the record Restore checks against.
type StateSaver interface {
	SaveState(ctx context.Context, path string) error
}

// Ballooner is implemented by machines with a memory balloon whose size the
// host sets: inflating it takes memory from the guest and gives it back to
// the host, deflating it returns the memory to the guest.
//
// Sizes are the guest's logical memory size in MiB: Config.MemoryMiB with
// the balloon empty, less as it inflates. The guest reaches a new target
// over the time its balloon driver takes to give or take the pages back; a
// guest without the driver never does.
type Ballooner interface {
	// SetMemoryTarget asks the guest to shrink or grow to mib MiB. It
	// clamps mib to what the machine can be set to (at most
	// Config.MemoryMiB) and returns without waiting for the guest.
	SetMemoryTarget(ctx context.Context, mib int) error
	// MemoryTarget reports the guest's memory size as the hypervisor knows
	// it: where it reports the guest's progress (QEMU's query-balloon),
	// the size the guest has reached; where it only keeps the target
	// (vz), the target last set.
	MemoryTarget(ctx context.Context) (mib int, err error)
}

// Identified is implemented by machines that have a hardware identity the
// backend chose or was given (Config.MachineID). MachineID returns a copy of
// it; it never changes for the machine's life.
type Identified interface {
	MachineID() []byte
}

// SaveStateChecker is implemented by machines whose StateSaver support
// depends on the host or the configuration (an OS version, a device the
// hypervisor cannot save). CanSaveState returns nil when SaveState can be
// attempted, else an error wrapping ErrNotSupported that says why.
type SaveStateChecker interface {
	CanSaveState() error
}

// Restorer is implemented by drivers whose machines can be restored from a
// file written by StateSaver.SaveState. Restore builds a machine from cfg,
// which must describe the saved machine exactly (CheckRestore decides; a
// backend may refuse more), loads statePath into it and returns it paused:
// call Resume to run it. Connections into the old machine (the control
// channel, the network socket) do not survive: dial again. If ctx is
// cancelled during Restore, the machine is torn down.
type Restorer interface {
	Restore(ctx context.Context, cfg Config, statePath string) (Machine, error)
}

// ErrSaveUnsupported is what SaveStateSupported returns for a machine that
// cannot save its state at all. It wraps ErrNotSupported.
var ErrSaveUnsupported = fmt.Errorf("%w: pausing to disk needs the vz backend on macOS 14+; on QEMU, `vibedom pause` keeps the VM paused in memory", ErrNotSupported)

// SaveStateSupported reports whether m can save its state to disk now: nil,
// or an error wrapping ErrNotSupported whose message says what to do
// instead.
func SaveStateSupported(m Machine) error {
	s, ok := m.(StateSaver)
	if !ok {
		return ErrSaveUnsupported
	}
	if c, ok := s.(SaveStateChecker); ok {
		return c.CanSaveState()
	}
	return nil
}

// Pause pauses m if it supports pausing, else returns ErrNotSupported.
func Pause(ctx context.Context, m Machine) error {
	p, ok := m.(Pauser)
	if !ok {
		return fmt.Errorf("pause: %w", ErrNotSupported)
	}
	return p.Pause(ctx)
}

// Resume resumes m if it supports pausing, else returns ErrNotSupported.
func Resume(ctx context.Context, m Machine) error {
	p, ok := m.(Pauser)
	if !ok {
		return fmt.Errorf("resume: %w", ErrNotSupported)
	}
	return p.Resume(ctx)
}

// Backoff returns the delay before retry attempt n (0-based) of a dial loop:
// exponential from 10 ms, capped at 500 ms.
func Backoff(n int) time.Duration {
	d := 10 * time.Millisecond
	for i := 0; i < n && d < 500*time.Millisecond; i++ {
		d *= 2
	}
	return min(d, 500*time.Millisecond)
}
