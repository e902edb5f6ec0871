// Package qemu runs vibedom VMs on QEMU: the backend of Linux hosts and of
// the test suite. It boots a kernel and initramfs directly, shares the
// workspace read-only over virtiofs (virtiofsd confined to a read-only bind
// mount in its own mount namespace) or, where virtiofsd cannot run, over 9p
// (read-only enforced by QEMU); either way the guard is on the host side,
// attaches disks as virtio-blk, carries the control channel on a
// virtio-serial port backed by a unix socket, wires the NIC to a datagram
// socket the caller owns, and drives the machine over QMP.
//
// KVM is used only when a probe boot shows it really runs guests; otherwise
// (and always for a foreign architecture) QEMU emulates with TCG.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/vibedom/vibedom/vm"
)

// Name is the driver's name.
const Name = "qemu"

// Options configure the driver.
type Options struct {
	// CacheDir keeps the acceleration probe's verdict; "" means the user's
	// cache directory (os.UserCacheDir()/vibedom).
	CacheDir string
	// Accel forces "kvm" or "tcg"; "" or "auto" probes. The environment
	// variable VIBEDOM_ACCEL overrides it.
	Accel string
	// ShareFS forces vm.ShareVirtiofs or vm.Share9P; "" or "auto" picks
	// virtiofs where it can run (Linux, root, virtiofsd installed) and 9p
	// elsewhere. The environment variable VIBEDOM_SHARE_FS overrides it.
	ShareFS string
	// Log receives diagnostics; nil is silent.
	Log *slog.Logger
}

// Driver starts QEMU machines.
type Driver struct {
	opts    Options
	log     *slog.Logger
	share   vm.ShareFS
	noShare error       // why a forced virtiofs cannot run, reported by Start
	noKVM   atomic.Bool // FallBack was called: emulate
}

var _ vm.Driver = (*Driver)(nil)

// New returns a QEMU driver.
func New(o Options) *Driver {
	if v := os.Getenv("VIBEDOM_ACCEL"); v != "" {
		o.Accel = v
	}
	if o.CacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			o.CacheDir = d + "/vibedom"
		}
	}
	l := o.Log
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	if v := os.Getenv("VIBEDOM_SHARE_FS"); v != "" {
		o.ShareFS = v
	}
	d := &Driver{opts: o, log: l, share: vm.Share9P}
	switch o.ShareFS {
	case "", "auto":
		if err := virtiofsUsable(); err == nil {
			d.share = vm.ShareVirtiofs
		} else {
			l.Debug("sharing over 9p", "reason", err)
		}
	case string(vm.ShareVirtiofs):
		d.share = vm.ShareVirtiofs
		d.noShare = virtiofsUsable()
	case string(vm.Share9P):
	default:
		d.noShare = fmt.Errorf("share filesystem %q: want virtiofs, 9p or auto", o.ShareFS)
	}
	return d
}

// Name implements vm.Driver.
func (d *Driver) Name() string { return Name }

// Info implements vm.Driver: a virtio-serial control port, and virtiofs
// shares where virtiofsd can run read-only, 9p elsewhere.
func (d *Driver) Info() vm.Info {
	return vm.Info{Transport: vm.TransportVirtioSerial, ShareFS: d.share, FreePageReporting: true}
}

// binary returns the QEMU system emulator for arch.
func binary(arch vm.Arch) (string, error) {
	var name, env, pkg string
	switch arch {
	case vm.ArchAMD64:
		name, env, pkg = "qemu-system-x86_64", "VIBEDOM_QEMU_X86_64", "qemu-system-x86"
	case vm.ArchARM64:
		name, env, pkg = "qemu-system-aarch64", "VIBEDOM_QEMU_AARCH64", "qemu-system-arm"
	default:
		return "", fmt.Errorf("%w: QEMU backend has no %q guests", vm.ErrUnavailable, arch)
	}
	if p := os.Getenv(env); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", vm.ErrUnavailable, env, p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s not found: install it (Debian/Ubuntu: sudo apt-get install %s; or run make setup)", vm.ErrUnavailable, name, pkg)
	}
	return p, nil
}

// Available implements vm.Driver.
func (d *Driver) Available(_ context.Context, arch vm.Arch) error {
	_, err := binary(arch)
	return err
}

// escape quotes a value for a QEMU option list (commas are doubled).
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// plan is a QEMU command line and what it refers to.
type plan struct {
	bin        string
	args       []string
	qmpSock    string
	controlSoc string
	extra      []*os.File // passed as fds 3, 4 …
	accel      string
	probed     bool       // accel "kvm" was the probe's choice
	virtiofs   []vm.Share // served by virtiofsd on virtiofsSock(i)
}

// virtiofsSock is the vhost-user socket of the i-th virtiofs share.
func (p *plan) virtiofsSock(i int) string {
	return p.qmpSock[:len(p.qmpSock)-len("qmp.sock")] + "fs" + strconv.Itoa(i) + ".sock"
}

// buildPlan turns cfg into a QEMU command line. accel is "kvm" or "tcg";
// share is how directories are shared.
func buildPlan(cfg *vm.Config, bin, accel string, share vm.ShareFS) (*plan, error) {
	p := &plan{bin: bin, accel: accel,
		qmpSock:    cfg.StateDir + "/qmp.sock",
		controlSoc: cfg.StateDir + "/control.sock",
	}
	console := "ttyS0"
	kernelArgs := ""
	a := []string{"-name", "vibedom-" + sanitizeName(cfg.Name)}
	// vhost-user devices need the guest's RAM in shared memory.
	machineOpts := ""
	if share == vm.ShareVirtiofs && len(cfg.Shares) > 0 {
		machineOpts = ",memory-backend=mem"
		a = append(a, "-object", "memory-backend-memfd,id=mem,size="+strconv.Itoa(cfg.MemoryMiB)+"M,share=on")
	}
	switch cfg.Arch {
	case vm.ArchAMD64:
		// No SATA controller, SMBus, PS/2 controller or VMware port: the
		// guest uses none of them, and each is one more device its kernel
		// probes at boot.
		a = append(a, "-M", "q35,sata=off,smbus=off,i8042=off,vmport=off"+machineOpts)
		// Under emulation on a loaded host the kernel's check that the
		// IO-APIC timer ticks can miss its window and panic ("IO-APIC +
		// timer doesn't work!"); the emulated timer does work.
		kernelArgs = "no_timer_check "
		if accel != "kvm" {
			// TCG's TSC follows QEMU's clock on every vCPU: reliable. The
			// guest otherwise marks it unstable and keeps time with the
			// HPET, each read of which is an emulated device access (the
			// kernel boots about twice as fast with the TSC).
			//
			// An emulated CPU does not execute the guest speculatively, so
			// the guest kernel's defences against speculative-execution
			// attacks (retpolines, return thunks, buffer clearing) guard
			// against nothing here, and each costs emulated work on every
			// indirect call, return and kernel exit. The host's own
			// defences are not affected. Under KVM they stay on.
			kernelArgs += "tsc=reliable clocksource=tsc mitigations=off "
			// A kernel that boots with one CPU (maxcpus=1 below, or a
			// one-CPU VM) otherwise rewrites every lock prefix of its
			// code, and of each module it loads, to a no-op, one text
			// patch each (a page-table switch and TLB flush apiece under
			// emulation), and back again when a second CPU comes online.
			// With noreplace-smp the lock prefixes stay: they cost nothing
			// here. About 0.1 s of CPU time per boot.
			//
			// (nolapic_timer would skip the APIC timer's 100 ms
			// calibration, but leaves the guest a periodic tick through
			// the HPET: no high-resolution timers, no tickless idle.)
			kernelArgs += "noreplace-smp "
		}
		// qboot is a minimal firmware that hands straight over to the
		// kernel: about half a second faster than SeaBIOS under TCG.
		if fw := firmware("qboot.rom"); fw != "" {
			a = append(a, "-bios", fw)
		}
	case vm.ArchARM64:
		a = append(a, "-M", "virt"+machineOpts)
		console = "ttyAMA0"
	}
	switch {
	case accel == "kvm":
		a = append(a, "-accel", "kvm", "-cpu", "host")
	case cfg.Arch == vm.ArchAMD64:
		// Without 5-level paging: under emulation every TLB miss walks
		// the page tables in software, and the early boot maps all of
		// the guest's memory (about a second less per boot for 2 GiB).
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max,la57=off")
	default:
		// Pointer authentication with QEMU's cheap implementation-defined
		// algorithm instead of QARMA, which costs a great deal under
		// emulation; the guest still signs and checks its pointers.
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max,pauth-impdef=on")
	}
	if accel != "kvm" && cfg.CPUs > 1 {
		// The kernel boots on one CPU and the guest agent brings the
		// others online once it serves. Under emulation, starting them at
		// boot and keeping them in step while the kernel and its modules
		// load (every cross-CPU TLB flush and code patch waits for each
		// emulated CPU, whose host thread competes for the host's cores)
		// made a boot about a fifth slower. The VM still has every CPU.
		kernelArgs += "maxcpus=1 "
	}
	a = append(a,
		"-smp", strconv.Itoa(cfg.CPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB)+"M",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", cfg.Kernel,
		"-initrd", cfg.Initrd,
		"-append", strings.TrimSpace("console="+console+" panic=-1 "+kernelArgs+cfg.Cmdline),
		"-qmp", "unix:"+escape(p.qmpSock)+",server=on,wait=off",
	)
	consolePath := os.DevNull
	if cfg.ConsoleLog != "" {
		consolePath = cfg.ConsoleLog
	}
	a = append(a, "-chardev", "file,id=con0,path="+escape(consolePath)+",append=on", "-serial", "chardev:con0")
	a = append(a,
		"-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=ctl0,path="+escape(p.controlSoc)+",server=on,wait=off",
		"-device", "virtserialport,bus=vser0.0,chardev=ctl0,name="+vm.ControlPortName,
		// Free page reporting: the guest's balloon driver reports pages it
		// freed and QEMU gives them back to the host, so an idle session
		// does not keep the peak of what it once used.
		"-device", "virtio-balloon-pci,free-page-reporting=on",
	)
	for i, s := range cfg.Shares {
		if strings.ContainsAny(s.Tag, ",=") {
			return nil, fmt.Errorf("%w: share tag %q", vm.ErrInvalidConfig, s.Tag)
		}
		if share == vm.ShareVirtiofs {
			p.virtiofs = append(p.virtiofs, s)
			id := "vfs" + strconv.Itoa(i)
			a = append(a, "-chardev", "socket,id="+id+",path="+escape(p.virtiofsSock(len(p.virtiofs)-1)),
				"-device", "vhost-user-fs-pci,chardev="+id+",tag="+s.Tag)
			continue
		}
		fs := "local,id=fs" + strconv.Itoa(i) + ",path=" + escape(s.HostPath) + ",security_model=none"
		if s.ReadOnly {
			fs += ",readonly=on"
		}
		a = append(a, "-fsdev", fs, "-device", "virtio-9p-pci,fsdev=fs"+strconv.Itoa(i)+",mount_tag="+s.Tag)
	}
	for i, d := range cfg.Disks {
		drv := "file=" + escape(d.Path) + ",format=raw,if=none,id=disk" + strconv.Itoa(i) + ",cache=writeback,discard=unmap"
		if d.ReadOnly {
			drv += ",readonly=on"
		}
		a = append(a, "-drive", drv, "-device", "virtio-blk-pci,drive=disk"+strconv.Itoa(i))
	}
	if cfg.Network != nil {
		fd := 3 + len(p.extra)
		p.extra = append(p.extra, cfg.Network.Conn)
		nic := "virtio-net-pci,netdev=net0"
		if cfg.Network.MAC != "" {
			nic += ",mac=" + cfg.Network.MAC
		}
		a = append(a, "-netdev", "dgram,id=net0,local.type=fd,local.str="+strconv.Itoa(fd), "-device", nic)
	}
	// QEMU's own seccomp filter: no spawning, no privilege changes.
	a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	p.args = a
	return p, nil
}

func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '-'
	}, s)
}

// Start implements vm.Driver.
func (d *Driver) Start(ctx context.Context, cfg vm.Config) (vm.Machine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin, err := binary(cfg.Arch)
	if err != nil {
		return nil, err
	}
	if len(cfg.StateDir)+len("/control.sock") > 100 {
		return nil, fmt.Errorf("%w: state directory path %q is too long for unix sockets", vm.ErrInvalidConfig, cfg.StateDir)
	}
	if d.noShare != nil && len(cfg.Shares) > 0 {
		return nil, fmt.Errorf("%w: %v", vm.ErrUnavailable, d.noShare)
	}
	accel, probed := d.accel(ctx, cfg, bin)
	p, err := buildPlan(&cfg, bin, accel, d.share)
	if err != nil {
		return nil, err
	}
	p.probed = probed
	d.log.Debug("starting qemu", "accel", accel, "args", p.args)
	return start(ctx, p, &cfg, d.log)
}

var errExited = errors.New("qemu exited")

// firmwareDirs are where distributions install QEMU's firmware.
var firmwareDirs = []string{"/usr/share/qemu", "/usr/local/share/qemu", "/opt/homebrew/share/qemu"}

// firmware returns the path of a QEMU firmware file, or "" if absent.
func firmware(name string) string {
	for _, d := range firmwareDirs {
		p := d + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

var _ vm.Doctor = (*Driver)(nil)

// Doctor implements vm.Doctor: the QEMU binary, KVM (TCG is the slow
// fallback), and how the workspace is shared.
func (d *Driver) Doctor(_ context.Context, arch vm.Arch) []vm.Check {
	var checks []vm.Check
	if bin, err := binary(arch); err != nil {
		checks = append(checks, vm.Check{Name: "QEMU", Status: vm.CheckFail, Detail: err.Error(),
			Fix: "install QEMU (Debian/Ubuntu: make setup, or sudo apt-get install qemu-system-x86 qemu-system-arm)"})
	} else {
		checks = append(checks, vm.Check{Name: "QEMU", Status: vm.CheckOK, Detail: bin})
	}
	checks = append(checks, kvmCheck(arch, d.opts.Accel, d.opts.CacheDir))
	share := vm.Check{Name: "workspace share", Status: vm.CheckOK, Detail: string(d.share) + ", read-only on the host side"}
	switch {
	case d.noShare != nil:
		share.Status, share.Detail = vm.CheckFail, d.noShare.Error()
		share.Fix = "unset VIBEDOM_SHARE_FS, or install virtiofsd and run as root"
	case d.share == vm.Share9P:
		share.Status = vm.CheckWarn
		share.Detail = "9p (QEMU enforces read-only); virtiofs is ~10-50x faster for file metadata: " + virtiofsWhyNot()
		share.Fix = "run as root with virtiofsd installed (Debian/Ubuntu: qemu-system-common)"
	}
	return append(checks, share)
}

// virtiofsWhyNot says why virtiofs is not used, or "forced by configuration".
func virtiofsWhyNot() string {
	if err := virtiofsUsable(); err != nil {
		return err.Error()
	}
	return "9p was chosen by VIBEDOM_SHARE_FS or the driver's options"
}

// kvmCheck reports whether guests of arch can run under KVM here.
func kvmCheck(arch vm.Arch, forced, cacheDir string) vm.Check {
	c := vm.Check{Name: "KVM acceleration"}
	switch {
	case forced == "tcg":
		c.Status, c.Detail = vm.CheckWarn, "TCG forced by VIBEDOM_ACCEL=tcg: guests are emulated, several times slower"
	case !nativeArch(arch):
		c.Status, c.Detail = vm.CheckOK, string(arch)+" guests are emulated (TCG) on this "+runtime.GOARCH+" host, as expected"
	default:
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		if err != nil {
			c.Status, c.Detail = vm.CheckWarn, "/dev/kvm is not usable ("+err.Error()+"): guests are emulated (TCG), several times slower"
			c.Fix = "enable virtualization in the firmware or the VM host, load kvm_intel/kvm_amd, and add yourself to the kvm group"
		} else {
			f.Close()
			c.Status, c.Detail = vm.CheckOK, "/dev/kvm is usable; the first boot probes that guests really run under it and falls back to TCG if not"
			if probedHang(cacheDir) {
				c.Status = vm.CheckWarn
				c.Detail = "/dev/kvm opens, but a probe boot showed guests do not run under it here (nested virtualization?): guests are emulated (TCG), several times slower"
				c.Fix = "enable nested virtualization on the VM host, or ignore: TCG works"
			}
		}
	}
	return c
}

// probedHang reports whether a cached acceleration probe found that guests
// do not run under KVM.
func probedHang(cacheDir string) bool {
	if cacheDir == "" {
		return false
	}
	files, _ := filepath.Glob(filepath.Join(cacheDir, "qemu-accel-*.json"))
	for _, f := range files {
		var v struct{ KVM bool }
		if data, err := os.ReadFile(f); err == nil && json.Unmarshal(data, &v) == nil && !v.KVM {
			return true
		}
	}
	return false
}
