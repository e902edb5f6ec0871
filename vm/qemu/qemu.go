// Package qemu runs vibedom VMs on QEMU: the backend of Linux hosts and of
// the test suite. It boots a kernel and initramfs directly, shares the
// workspace read-only over 9p (read-only enforced by QEMU on the host side),
// attaches disks as virtio-blk, carries the control channel on a
// virtio-serial port backed by a unix socket, wires the NIC to a datagram
// socket the caller owns, and drives the machine over QMP.
//
// KVM is used only when a probe boot shows it really runs guests; otherwise
// (and always for a foreign architecture) QEMU emulates with TCG.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"

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
	// Log receives diagnostics; nil is silent.
	Log *slog.Logger
}

// Driver starts QEMU machines.
type Driver struct {
	opts Options
	log  *slog.Logger
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
	return &Driver{opts: o, log: l}
}

// Name implements vm.Driver.
func (d *Driver) Name() string { return Name }

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
}

// buildPlan turns cfg into a QEMU command line. accel is "kvm" or "tcg".
func buildPlan(cfg *vm.Config, bin, accel string) (*plan, error) {
	p := &plan{bin: bin, accel: accel,
		qmpSock:    cfg.StateDir + "/qmp.sock",
		controlSoc: cfg.StateDir + "/control.sock",
	}
	console := "ttyS0"
	a := []string{"-name", "vibedom-" + sanitizeName(cfg.Name)}
	switch cfg.Arch {
	case vm.ArchAMD64:
		a = append(a, "-M", "q35")
		// qboot is a minimal firmware that hands straight over to the
		// kernel: about half a second faster than SeaBIOS under TCG.
		if fw := firmware("qboot.rom"); fw != "" {
			a = append(a, "-bios", fw)
		}
	case vm.ArchARM64:
		a = append(a, "-M", "virt")
		console = "ttyAMA0"
	}
	if accel == "kvm" {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	a = append(a,
		"-smp", strconv.Itoa(cfg.CPUs),
		"-m", strconv.Itoa(cfg.MemoryMiB)+"M",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", cfg.Kernel,
		"-initrd", cfg.Initrd,
		"-append", strings.TrimSpace("console="+console+" panic=-1 "+cfg.Cmdline),
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
		"-device", "virtio-rng-pci",
	)
	for i, s := range cfg.Shares {
		if strings.ContainsAny(s.Tag, ",=") {
			return nil, fmt.Errorf("%w: share tag %q", vm.ErrInvalidConfig, s.Tag)
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
	accel := d.accel(ctx, cfg, bin)
	p, err := buildPlan(&cfg, bin, accel)
	if err != nil {
		return nil, err
	}
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
