package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/vm"
)

// accel decides between KVM and TCG for cfg, and reports whether the
// choice of KVM came from the probe (not from Options.Accel). KVM needs a
// same-architecture guest, a usable /dev/kvm and a probe boot that shows
// guests really run (on some nested hosts KVM_CREATE_VM succeeds but
// guests hang); a guest that hangs all the same makes boot.Start call
// FallBack, after which this driver emulates.
func (d *Driver) accel(ctx context.Context, cfg vm.Config, bin string) (accel string, probed bool) {
	switch d.opts.Accel {
	case "kvm", "tcg":
		return d.opts.Accel, false
	}
	if !nativeArch(cfg.Arch) || d.noKVM.Load() {
		return "tcg", false
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", false
	}
	f.Close()
	cache := d.verdictFile(bin, cfg.Kernel)
	var v struct{ KVM bool }
	if data, err := os.ReadFile(cache); err == nil && json.Unmarshal(data, &v) == nil {
		return pick(v.KVM), v.KVM
	}
	v.KVM = probeKVM(ctx, cfg, bin)
	d.log.Info("KVM probe", "works", v.KVM)
	d.saveVerdict(cache, v.KVM)
	return pick(v.KVM), v.KVM
}

// verdictFile is where the probe's verdict for bin and kernel is kept, or
// "" without a cache directory.
func (d *Driver) verdictFile(bin, kernel string) string {
	if d.opts.CacheDir == "" {
		return ""
	}
	return filepath.Join(d.opts.CacheDir, "qemu-accel-"+probeKey(bin, kernel)+".json")
}

func (d *Driver) saveVerdict(file string, kvm bool) {
	if file == "" {
		return
	}
	_ = os.MkdirAll(filepath.Dir(file), 0o700)
	data, _ := json.Marshal(struct{ KVM bool }{kvm})
	_ = os.WriteFile(file, data, 0o600)
}

var _ vm.AccelFallback = (*Driver)(nil)

// Probed implements vm.AccelFallback: m runs under KVM that the probe
// chose.
func (d *Driver) Probed(m vm.Machine) bool {
	qm, ok := m.(*machine)
	return ok && qm.plan.accel == "kvm" && qm.plan.probed
}

// FallBack implements vm.AccelFallback: this driver emulates from now on,
// and the verdict kept for cfg's QEMU and kernel says KVM does not work,
// so that later processes emulate too (and `vibedom doctor` says why).
func (d *Driver) FallBack(cfg vm.Config) {
	d.noKVM.Store(true)
	d.log.Warn("a guest did not answer under KVM: emulating (TCG) from now on")
	if bin, err := binary(cfg.Arch); err == nil {
		d.saveVerdict(d.verdictFile(bin, cfg.Kernel), false)
	}
}

func pick(kvm bool) string {
	if kvm {
		return "kvm"
	}
	return "tcg"
}

func nativeArch(a vm.Arch) bool {
	return string(a) == runtime.GOARCH
}

// probeKey identifies the host, QEMU and kernel the verdict holds for.
func probeKey(bin, kernel string) string {
	h := sha256.New()
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	h.Write(uts.Release[:])
	for _, p := range []string{bin, kernel} {
		h.Write([]byte(p))
		if fi, err := os.Stat(p); err == nil {
			h.Write([]byte(fi.ModTime().String()))
			h.Write([]byte{byte(fi.Size()), byte(fi.Size() >> 8), byte(fi.Size() >> 16)})
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// probeKVM boots cfg's kernel under KVM with no root filesystem and as
// many vCPUs as cfg: a working KVM reaches the kernel's "unable to mount
// root" panic within seconds and QEMU exits (panic=-1, -no-reboot); a
// broken one hangs (on some nested hosts only once a second vCPU is
// brought up).
func probeKVM(ctx context.Context, cfg vm.Config, bin string) bool {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	console := "ttyS0"
	machine := "q35"
	if cfg.Arch == vm.ArchARM64 {
		console, machine = "ttyAMA0", "virt"
	}
	cmd := exec.CommandContext(ctx, bin, "-M", machine, "-accel", "kvm", "-cpu", "host", "-m", "256M", "-smp", strconv.Itoa(max(cfg.CPUs, 1)),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", cfg.Kernel, "-append", "console="+console+" panic=-1 quiet loglevel=3", "-serial", "stdio")
	cmd.Env = childenv.Environ()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return false
	}
	s := out.String()
	return err == nil && (strings.Contains(s, "Kernel panic") || strings.Contains(s, "VFS"))
}
