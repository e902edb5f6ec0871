//go:build darwin && arm64

package vz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	vz "github.com/Code-Hex/vz/v3"

	"github.com/vibedom/vibedom/childenv"

	"github.com/vibedom/vibedom/vm"
)

var (
	_ vm.Driver           = (*Driver)(nil)
	_ vm.Machine          = (*machine)(nil)
	_ vm.Pauser           = (*machine)(nil)
	_ vm.Doctor           = (*Driver)(nil)
	_ vm.Restorer         = (*Driver)(nil)
	_ vm.StateSaver       = (*machine)(nil)
	_ vm.SaveStateChecker = (*machine)(nil)
	_ vm.Identified       = (*machine)(nil)
	_ vm.Ballooner        = (*machine)(nil)
)

// The states mirrored in state.go must equal vz's: a difference makes an
// index out of range and fails the build (and tools/check-darwin).
var (
	_ = [1]int{}[int(vz.VirtualMachineStateStopped)-int(hvStopped)]
	_ = [1]int{}[int(vz.VirtualMachineStateRunning)-int(hvRunning)]
	_ = [1]int{}[int(vz.VirtualMachineStatePaused)-int(hvPaused)]
	_ = [1]int{}[int(vz.VirtualMachineStateError)-int(hvError)]
	_ = [1]int{}[int(vz.VirtualMachineStateStarting)-int(hvStarting)]
	_ = [1]int{}[int(vz.VirtualMachineStatePausing)-int(hvPausing)]
	_ = [1]int{}[int(vz.VirtualMachineStateResuming)-int(hvResuming)]
	_ = [1]int{}[int(vz.VirtualMachineStateStopping)-int(hvStopping)]
	_ = [1]int{}[int(vz.VirtualMachineStateSaving)-int(hvSaving)]
	_ = [1]int{}[int(vz.VirtualMachineStateRestoring)-int(hvRestoring)]
)

// New returns the vz driver. log receives the driver's and its machines'
// events; nil discards them. On darwin/arm64 it never fails: whether this
// Mac can run a machine is Available's question.
func New(log *slog.Logger) (*Driver, error) { return newDriver(log), nil }

// Available reports whether this Mac can run an arch guest: arm64 only, on
// macOS 14 or later (minMacOS). A missing entitlement shows up only when Start
// validates a configuration.
func (d *Driver) Available(ctx context.Context, arch vm.Arch) error {
	if err := checkArch(arch); err != nil {
		return err
	}
	product, err := syscall.Sysctl("kern.osproductversion")
	if err != nil {
		return fmt.Errorf("%w: read the macOS version: %v", vm.ErrUnavailable, err)
	}
	return checkMacOSVersion(product)
}

// Doctor implements vm.Doctor: the macOS version, the architecture, and
// whether this binary carries the virtualization entitlement.
func (d *Driver) Doctor(ctx context.Context, arch vm.Arch) []vm.Check {
	var checks []vm.Check
	product, err := syscall.Sysctl("kern.osproductversion")
	switch {
	case err != nil:
		checks = append(checks, vm.Check{Name: "macOS version", Status: vm.CheckFail, Detail: err.Error()})
	case checkMacOSVersion(product) != nil:
		checks = append(checks, vm.Check{Name: "macOS version", Status: vm.CheckFail, Detail: "macOS " + product,
			Fix: fmt.Sprintf("update to macOS %d or later", minMacOS)})
	default:
		checks = append(checks, vm.Check{Name: "macOS version", Status: vm.CheckOK, Detail: "macOS " + product})
	}
	if err := checkArch(arch); err != nil {
		checks = append(checks, vm.Check{Name: "guest architecture", Status: vm.CheckFail, Detail: err.Error()})
	} else {
		checks = append(checks, vm.Check{Name: "guest architecture", Status: vm.CheckOK, Detail: string(arch)})
	}
	checks = append(checks, entitlementCheck(ctx))
	return checks
}

// entitlementCheck asks codesign whether the running binary carries the
// virtualization entitlement.
func entitlementCheck(ctx context.Context) vm.Check {
	c := vm.Check{Name: "virtualization entitlement"}
	exe, err := os.Executable()
	if err != nil {
		c.Status, c.Detail = vm.CheckWarn, "cannot find this binary: "+err.Error()
		return c
	}
	cmd := exec.CommandContext(ctx, "codesign", "-d", "--entitlements", "-", exe)
	cmd.Env = childenv.Environ()
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil && len(out) == 0:
		c.Status, c.Detail = vm.CheckWarn, "codesign did not run: "+err.Error()
		c.Fix = "install Xcode's command line tools (xcode-select --install)"
	case !strings.Contains(string(out), entitlement):
		c.Status, c.Detail = vm.CheckFail, exe+" is not signed with "+entitlement
		c.Fix = "build with `make build`, or run: codesign --force --entitlements entitlements.plist -s - " + exe
	default:
		c.Status, c.Detail = vm.CheckOK, exe
	}
	return c
}

func hostLimits() limits {
	return limits{
		minCPUs: vz.VirtualMachineConfigurationMinimumAllowedCPUCount(),
		maxCPUs: vz.VirtualMachineConfigurationMaximumAllowedCPUCount(),
		minMem:  vz.VirtualMachineConfigurationMinimumAllowedMemorySize(),
		maxMem:  vz.VirtualMachineConfigurationMaximumAllowedMemorySize(),
	}
}

// Start validates cfg, builds the Virtualization.framework configuration,
// validates it too and starts the machine. It returns once the framework
// reports the machine started.
func (d *Driver) Start(ctx context.Context, cfg vm.Config) (vm.Machine, error) {
	if err := d.Available(ctx, cfg.Arch); err != nil {
		return nil, err
	}
	p, err := newPlan(cfg, hostLimits())
	if err != nil {
		return nil, err
	}
	m, err := d.create(p)
	if err != nil {
		return nil, err
	}
	hv := m.hv
	m.log.Info("starting machine", "cpus", p.cpus, "memory_mib", p.memBytes>>20, "shares", len(p.shares), "disks", len(p.disks), "network", p.network != nil)
	started := make(chan error, 1)
	go func() { started <- hv.Start() }()
	select {
	case err := <-started:
		if err != nil {
			m.feed.set(vm.StateError, err)
			return nil, fmt.Errorf("start machine %q: %w", p.name, err)
		}
	case <-ctx.Done():
		// Tear down what the framework is still starting before returning.
		if err := <-started; err == nil {
			if err := m.forceStop(fmt.Errorf("machine %q: start was cancelled", p.name)); err != nil {
				m.log.Warn("stop after cancelled start failed", "err", err)
			}
		} else {
			m.feed.set(vm.StateError, err)
		}
		return nil, fmt.Errorf("start machine %q: %w", p.name, ctx.Err())
	}
	m.feed.set(vm.StateRunning, nil)
	return m, nil
}

// Restore implements vm.Restorer: it builds the machine cfg describes, which
// must carry the saved machine's identity (Config.MachineID) and a fixed
// network MAC, and loads statePath into it under the host's save/restore
// lock. The machine comes back paused.
func (d *Driver) Restore(ctx context.Context, cfg vm.Config, statePath string) (vm.Machine, error) {
	if err := d.Available(ctx, cfg.Arch); err != nil {
		return nil, err
	}
	if err := saveRestoreOS(); err != nil {
		return nil, err
	}
	p, err := newPlan(cfg, hostLimits())
	if err != nil {
		return nil, err
	}
	if err := p.restoreProblem(); err != nil {
		return nil, err
	}
	if err := checkRestorePath(statePath); err != nil {
		return nil, err
	}
	m, err := d.create(p)
	if err != nil {
		return nil, err
	}
	if err := m.validateSaveRestore(); err != nil {
		m.feed.set(vm.StateStopped, err)
		return nil, err
	}
	m.log.Info("restoring machine", "state", statePath)
	took, err := restoreState(ctx, statePath, hostLock(d.lockPath), m.hv.RestoreMachineStateFromURL)
	if err != nil {
		if s := m.hv.State(); s == vz.VirtualMachineStatePaused || s == vz.VirtualMachineStateRunning {
			m.forceStop(err)
		} else {
			m.feed.set(vm.StateStopped, err)
		}
		return nil, fmt.Errorf("restore machine %q: %w", p.name, err)
	}
	m.feed.set(vm.StatePaused, nil)
	m.log.Info("machine restored, paused", "took", took)
	return m, nil
}

// create builds and validates the configuration of p and the machine that
// runs it, not yet started.
func (d *Driver) create(p plan) (*machine, error) {
	var keep []*os.File
	if p.network != nil {
		if err := TuneDatagramSocket(p.network.Conn); err != nil {
			return nil, fmt.Errorf("%w: network: %v", vm.ErrInvalidConfig, err)
		}
		keep = append(keep, p.network.Conn)
	}
	conf, id, err := buildConfig(p)
	if err != nil {
		return nil, err
	}
	if ok, err := conf.Validate(); err != nil {
		return nil, classifyValidateError(err)
	} else if !ok {
		return nil, invalid("Virtualization.framework refused the configuration without saying why")
	}
	hv, err := vz.NewVirtualMachine(conf)
	if err != nil {
		return nil, fmt.Errorf("create machine %q: %w", p.name, err)
	}
	socks := hv.SocketDevices()
	if len(socks) == 0 {
		return nil, fmt.Errorf("create machine %q: the framework made no vsock device", p.name)
	}
	m := &machine{
		name:     p.name,
		log:      d.log.With("vm", p.name, "driver", Name),
		hv:       hv,
		conf:     conf,
		plan:     p,
		id:       id,
		lockPath: d.lockPath,
		sock:     socks[0],
		port:     p.controlPort,
		feed:     newStateFeed(vm.StateStarting),
		keep:     keep,
	}
	go m.watch(hv.StateChangedNotify())
	return m, nil
}

// saveRestoreOS reports whether this macOS can save and restore machines.
func saveRestoreOS() error {
	product, err := syscall.Sysctl("kern.osproductversion")
	if err != nil {
		return fmt.Errorf("%w: pausing to disk: read the macOS version: %v", vm.ErrNotSupported, err)
	}
	return checkSaveRestoreOS(product)
}

// platformConfig gives the machine its identity: p's, or a new one. It
// returns the identity's bytes as the framework holds them.
func platformConfig(p plan) (*vz.GenericPlatformConfiguration, []byte, error) {
	var mid *vz.GenericMachineIdentifier
	var err error
	if len(p.machineID) == 0 {
		mid, err = vz.NewGenericMachineIdentifier()
	} else {
		mid, err = vz.NewGenericMachineIdentifierWithData(p.machineID)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("machine identity: %w", err)
	}
	id, err := acceptedMachineID(p.machineID, mid.DataRepresentation())
	if err != nil {
		return nil, nil, err
	}
	platform, err := vz.NewGenericPlatformConfiguration(vz.WithGenericMachineIdentifier(mid))
	if err != nil {
		return nil, nil, fmt.Errorf("configure platform: %w", err)
	}
	return platform, id, nil
}

// buildConfig turns a plan into a Virtualization.framework configuration
// and reports the machine identity it carries.
func buildConfig(p plan) (*vz.VirtualMachineConfiguration, []byte, error) {
	conf, err := buildDevices(p)
	if err != nil {
		return nil, nil, err
	}
	platform, id, err := platformConfig(p)
	if err != nil {
		return nil, nil, err
	}
	conf.SetPlatformVirtualMachineConfiguration(platform)
	return conf, id, nil
}

// buildDevices makes the configuration of p's boot loader and devices.
func buildDevices(p plan) (*vz.VirtualMachineConfiguration, error) {
	boot, err := vz.NewLinuxBootLoader(p.kernel, vz.WithCommandLine(p.cmdline), vz.WithInitrd(p.initrd))
	if err != nil {
		return nil, fmt.Errorf("%w: boot loader: %v", vm.ErrInvalidConfig, err)
	}
	conf, err := vz.NewVirtualMachineConfiguration(boot, p.cpus, p.memBytes)
	if err != nil {
		return nil, fmt.Errorf("configure machine %q: %w", p.name, err)
	}

	// Console: hvc0, output only, to the log file or nowhere.
	consolePath := p.consoleLog
	if consolePath == "" {
		consolePath = os.DevNull
	}
	consoleOut, err := vz.NewFileSerialPortAttachment(consolePath, true)
	if err != nil {
		return nil, fmt.Errorf("open console log %s: %w", consolePath, err)
	}
	console, err := vz.NewVirtioConsoleDeviceSerialPortConfiguration(consoleOut)
	if err != nil {
		return nil, fmt.Errorf("configure console: %w", err)
	}
	conf.SetSerialPortsVirtualMachineConfiguration([]*vz.VirtioConsoleDeviceSerialPortConfiguration{console})

	// Shares: one virtiofs device per share; read-only is enforced here, on
	// the host, so root in the guest cannot lift it.
	shares := make([]vz.DirectorySharingDeviceConfiguration, 0, len(p.shares))
	for _, s := range p.shares {
		dev, err := vz.NewVirtioFileSystemDeviceConfiguration(s.Tag)
		if err != nil {
			return nil, fmt.Errorf("%w: share %q: %v", vm.ErrInvalidConfig, s.Tag, err)
		}
		dir, err := vz.NewSharedDirectory(s.HostPath, s.ReadOnly)
		if err != nil {
			return nil, fmt.Errorf("%w: share %q: %v", vm.ErrInvalidConfig, s.Tag, err)
		}
		single, err := vz.NewSingleDirectoryShare(dir)
		if err != nil {
			return nil, fmt.Errorf("share %q: %w", s.Tag, err)
		}
		dev.SetDirectoryShare(single)
		shares = append(shares, dev)
	}
	conf.SetDirectorySharingDevicesVirtualMachineConfiguration(shares)

	// Disks, in order: /dev/vda, /dev/vdb… Cached with fsync on flush: the
	// automatic caching mode has been seen to corrupt ext4 under load.
	disks := make([]vz.StorageDeviceConfiguration, 0, len(p.disks))
	for i, d := range p.disks {
		att, err := vz.NewDiskImageStorageDeviceAttachmentWithCacheAndSync(d.Path, d.ReadOnly, vz.DiskImageCachingModeCached, vz.DiskImageSynchronizationModeFsync)
		if err != nil {
			return nil, fmt.Errorf("%w: disk %d (%s): %v", vm.ErrInvalidConfig, i, d.Path, err)
		}
		blk, err := vz.NewVirtioBlockDeviceConfiguration(att)
		if err != nil {
			return nil, fmt.Errorf("disk %d (%s): %w", i, d.Path, err)
		}
		disks = append(disks, blk)
	}
	conf.SetStorageDevicesVirtualMachineConfiguration(disks)

	// Control channel: vsock.
	sock, err := vz.NewVirtioSocketDeviceConfiguration()
	if err != nil {
		return nil, fmt.Errorf("configure vsock: %w", err)
	}
	conf.SetSocketDevicesVirtualMachineConfiguration([]vz.SocketDeviceConfiguration{sock})

	// Data channel: the only NIC, frames over the caller's datagram socket.
	if p.network != nil {
		att, err := vz.NewFileHandleNetworkDeviceAttachment(p.network.Conn)
		if err != nil {
			return nil, fmt.Errorf("%w: network socket: %v", vm.ErrInvalidConfig, err)
		}
		nic, err := vz.NewVirtioNetworkDeviceConfiguration(att)
		if err != nil {
			return nil, fmt.Errorf("configure network: %w", err)
		}
		var mac *vz.MACAddress
		if p.mac != nil {
			mac, err = vz.NewMACAddress(p.mac)
		} else {
			mac, err = vz.NewRandomLocallyAdministeredMACAddress()
		}
		if err != nil {
			return nil, fmt.Errorf("configure network MAC: %w", err)
		}
		nic.SetMACAddress(mac)
		conf.SetNetworkDevicesVirtualMachineConfiguration([]*vz.VirtioNetworkDeviceConfiguration{nic})
	}

	entropy, err := vz.NewVirtioEntropyDeviceConfiguration()
	if err != nil {
		return nil, fmt.Errorf("configure entropy device: %w", err)
	}
	conf.SetEntropyDevicesVirtualMachineConfiguration([]*vz.VirtioEntropyDeviceConfiguration{entropy})

	// A memory balloon, so the host can take back memory an idle guest
	// no longer uses (the guest's virtio_balloon driver is in the image).
	balloon, err := vz.NewVirtioTraditionalMemoryBalloonDeviceConfiguration()
	if err != nil {
		return nil, fmt.Errorf("configure memory balloon: %w", err)
	}
	conf.SetMemoryBalloonDevicesVirtualMachineConfiguration([]vz.MemoryBalloonDeviceConfiguration{balloon})
	return conf, nil
}

// machine is one Virtualization.framework VM.
type machine struct {
	name string
	log  *slog.Logger
	hv   *vz.VirtualMachine
	conf *vz.VirtualMachineConfiguration
	plan plan
	id   []byte // the machine identity, as the framework holds it
	// lockPath is the host's save/restore lock file.
	lockPath string
	sock     *vz.VirtioSocketDevice
	port     uint32
	feed     *stateFeed
	// keep holds every *os.File whose descriptor the framework uses: were it
	// collected, its finalizer would close the descriptor under the VM.
	keep []*os.File

	mu     sync.Mutex
	forced error // why the machine was stopped forcefully; nil if it was not
}

// watch follows the framework's state notifications until the machine ends.
// It holds the machine, and so every file vz uses, reachable meanwhile.
func (m *machine) watch(ch <-chan vz.VirtualMachineState) {
	defer runtime.KeepAlive(m.keep)
	for {
		select {
		case s := <-ch:
			st, ok := mapState(hvState(s))
			if !ok {
				continue
			}
			var cause error
			switch st {
			case vm.StateError:
				cause = fmt.Errorf("machine %q: Virtualization.framework reported an internal error; see the console log", m.name)
			case vm.StateStopped:
				cause = m.stopCause()
			}
			if m.feed.set(st, cause) {
				m.log.Debug("machine state", "state", st)
			}
			if isFinal(st) {
				m.log.Info("machine ended", "state", st, "forced", cause != nil)
				return
			}
		case <-m.feed.ended():
			return
		}
	}
}

func (m *machine) stopCause() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.forced
}

func (m *machine) DialControl(ctx context.Context) (net.Conn, error) {
	return dialRetry(ctx, m.port, m.feed.ended(), func() (net.Conn, error) {
		// Not m.sock.Connect: vz v3.7.1 closes the framework's descriptor
		// under it (vsock_darwin_arm64.m).
		return vsockConnect(m.sock, m.port)
	})
}

func (m *machine) State() vm.State { return m.feed.current() }

func (m *machine) StateChanges() <-chan vm.State { return m.feed.changes() }

func (m *machine) Wait(ctx context.Context) error { return m.feed.wait(ctx) }

// Stop presses the power button and waits for the guest to power off; when
// ctx ends first, or the guest cannot be asked, it stops the machine
// forcefully. A paused machine is resumed first so its guest can react.
func (m *machine) Stop(ctx context.Context) error {
	if m.hasEnded() {
		return nil
	}
	m.log.Info("stopping machine")
	if m.hv.State() == vz.VirtualMachineStatePaused && m.hv.CanResume() {
		if err := runCtx(ctx, m.hv.Resume); err != nil {
			m.log.Warn("resume before stop failed", "err", err)
		}
	}
	if m.hv.CanRequestStop() {
		ok, err := m.hv.RequestStop()
		switch {
		case err != nil:
			m.log.Warn("power button request failed", "err", err)
		case ok:
			m.feed.set(vm.StateStopping, nil)
			select {
			case <-m.feed.ended():
				return nil
			case <-ctx.Done():
				m.log.Warn("guest did not power off in time; stopping it forcefully")
			}
		}
	}
	return m.forceStop(fmt.Errorf("machine %q did not power off when asked and was stopped forcefully", m.name))
}

// Kill stops the machine at once.
func (m *machine) Kill() error {
	return m.forceStop(fmt.Errorf("machine %q was killed", m.name))
}

// forceStop pulls the plug and records cause as what Wait reports.
func (m *machine) forceStop(cause error) error {
	if m.hasEnded() {
		return nil
	}
	m.mu.Lock()
	if m.forced == nil {
		m.forced = cause
	}
	m.mu.Unlock()
	m.feed.set(vm.StateStopping, nil)
	if err := m.hv.Stop(); err != nil {
		// The guest may have powered off on its own meanwhile.
		if s := m.hv.State(); s != vz.VirtualMachineStateStopped && s != vz.VirtualMachineStateError {
			return fmt.Errorf("stop machine %q: %w", m.name, err)
		}
	}
	m.feed.set(vm.StateStopped, m.stopCause())
	return nil
}

func (m *machine) hasEnded() bool {
	select {
	case <-m.feed.ended():
		return true
	default:
		return false
	}
}

// Pause freezes the vCPUs. Pausing a paused machine is a no-op.
func (m *machine) Pause(ctx context.Context) error {
	if m.hasEnded() {
		return fmt.Errorf("pause machine %q: %w", m.name, vm.ErrNotRunning)
	}
	if m.hv.State() == vz.VirtualMachineStatePaused {
		return nil
	}
	if !m.hv.CanPause() {
		return fmt.Errorf("pause machine %q in state %s: %w", m.name, m.State(), vm.ErrNotRunning)
	}
	if err := runCtx(ctx, m.hv.Pause); err != nil {
		return fmt.Errorf("pause machine %q: %w", m.name, err)
	}
	m.feed.set(vm.StatePaused, nil)
	return nil
}

// Resume thaws a paused machine. Resuming a running machine is a no-op.
func (m *machine) Resume(ctx context.Context) error {
	if m.hasEnded() {
		return fmt.Errorf("resume machine %q: %w", m.name, vm.ErrNotRunning)
	}
	if m.hv.State() == vz.VirtualMachineStateRunning {
		return nil
	}
	if !m.hv.CanResume() {
		return fmt.Errorf("resume machine %q in state %s: %w", m.name, m.State(), vm.ErrNotRunning)
	}
	if err := runCtx(ctx, m.hv.Resume); err != nil {
		return fmt.Errorf("resume machine %q: %w", m.name, err)
	}
	m.feed.set(vm.StateRunning, nil)
	return nil
}

// balloon is the machine's memory balloon (buildDevices attaches one).
func (m *machine) balloon() (*vz.VirtioTraditionalMemoryBalloonDevice, error) {
	if m.hasEnded() {
		return nil, fmt.Errorf("memory balloon of machine %q: %w", m.name, vm.ErrNotRunning)
	}
	for _, d := range m.hv.MemoryBalloonDevices() {
		if b := vz.AsVirtioTraditionalMemoryBalloonDevice(d); b != nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("machine %q has no memory balloon: %w", m.name, vm.ErrNotSupported)
}

// SetMemoryTarget implements vm.Ballooner: the target of the traditional
// balloon, which the guest's virtio_balloon driver follows.
func (m *machine) SetMemoryTarget(ctx context.Context, mib int) error {
	b, err := m.balloon()
	if err != nil {
		return err
	}
	b.SetTargetVirtualMachineMemorySize(m.plan.balloonTarget(mib))
	return nil
}

// MemoryTarget implements vm.Ballooner: the target last set (the framework
// does not tell how far the guest got).
func (m *machine) MemoryTarget(ctx context.Context) (int, error) {
	b, err := m.balloon()
	if err != nil {
		return 0, err
	}
	return int(b.GetTargetVirtualMachineMemorySize() >> 20), nil
}

// MachineID implements vm.Identified.
func (m *machine) MachineID() []byte { return bytes.Clone(m.id) }

// CanSaveState implements vm.SaveStateChecker: macOS 14 or later, a fixed
// network MAC, and a configuration the framework says it can save.
func (m *machine) CanSaveState() error {
	if err := saveRestoreOS(); err != nil {
		return err
	}
	if err := m.plan.saveProblem(); err != nil {
		return err
	}
	return m.validateSaveRestore()
}

// validateSaveRestore asks the framework whether it can save and restore
// this configuration.
func (m *machine) validateSaveRestore() error {
	ok, err := m.conf.ValidateSaveRestoreSupport()
	switch {
	case err != nil:
		return fmt.Errorf("%w: Virtualization.framework cannot save or restore machine %q: %v", vm.ErrNotSupported, m.name, err)
	case !ok:
		return fmt.Errorf("%w: Virtualization.framework cannot save or restore machine %q", vm.ErrNotSupported, m.name)
	}
	return nil
}

// SaveState implements vm.StateSaver: under the host's save/restore lock it
// pauses the machine, saves it to path and stops it. On failure the
// machine is left as it was.
func (m *machine) SaveState(ctx context.Context, path string) error {
	if m.hasEnded() {
		return fmt.Errorf("save machine %q: %w", m.name, vm.ErrNotRunning)
	}
	if err := m.CanSaveState(); err != nil {
		return fmt.Errorf("save machine %q: %w", m.name, err)
	}
	t0 := time.Now()
	if err := saveState(ctx, vzSaveOps{m}, path, hostLock(m.lockPath)); err != nil {
		return fmt.Errorf("save machine %q: %w", m.name, err)
	}
	m.log.Info("machine saved and stopped", "state", path, "took", time.Since(t0))
	return nil
}

// vzSaveOps carries out saveState's steps on the framework.
type vzSaveOps struct{ m *machine }

func (o vzSaveOps) state() hvState { return hvState(o.m.hv.State()) }

func (o vzSaveOps) pause() error {
	if err := o.m.hv.Pause(); err != nil {
		return err
	}
	o.m.feed.set(vm.StatePaused, nil)
	return nil
}

func (o vzSaveOps) resume() error {
	if err := o.m.hv.Resume(); err != nil {
		return err
	}
	o.m.feed.set(vm.StateRunning, nil)
	return nil
}

func (o vzSaveOps) save(path string) error {
	err := o.m.hv.SaveMachineStateToPath(path)
	if errors.Is(err, vz.ErrUnsupportedOSVersion) || errors.Is(err, vz.ErrBuildTargetOSVersion) {
		return fmt.Errorf("%w: %v", vm.ErrNotSupported, err)
	}
	return err
}

// stop ends a machine whose state is saved: a clean end, so Wait returns
// nil.
func (o vzSaveOps) stop() error {
	if !o.m.hv.CanStop() {
		return fmt.Errorf("the framework cannot stop the machine in state %s", hvStateName(hvState(o.m.hv.State())))
	}
	o.m.feed.set(vm.StateStopping, nil)
	if err := o.m.hv.Stop(); err != nil {
		return err
	}
	o.m.feed.set(vm.StateStopped, nil)
	return nil
}
