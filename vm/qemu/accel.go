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
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/childenv"
	"github.com/vibedom/vibedom/vm"
)

// accel decides between KVM and TCG for cfg. KVM needs a same-architecture
// guest, a usable /dev/kvm and a probe boot that shows guests really run
// (on some nested hosts KVM_CREATE_VM succeeds but guests hang).
func (d *Driver) accel(ctx context.Context, cfg vm.Config, bin string) string {
	switch d.opts.Accel {
	case "kvm", "tcg":
		return d.opts.Accel
	}
	if !nativeArch(cfg.Arch) {
		return "tcg"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	key := probeKey(bin, cfg.Kernel)
	cache := filepath.Join(d.opts.CacheDir, "qemu-accel-"+key+".json")
	var v struct{ KVM bool }
	if data, err := os.ReadFile(cache); err == nil && json.Unmarshal(data, &v) == nil {
		return pick(v.KVM)
	}
	v.KVM = probeKVM(ctx, cfg, bin)
	d.log.Info("KVM probe", "works", v.KVM)
	if d.opts.CacheDir != "" {
		_ = os.MkdirAll(d.opts.CacheDir, 0o700)
		data, _ := json.Marshal(v)
		_ = os.WriteFile(cache, data, 0o600)
	}
	return pick(v.KVM)
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

// probeKVM boots cfg's kernel under KVM with no root filesystem: a working
// KVM reaches the kernel's "unable to mount root" panic within seconds and
// QEMU exits (panic=-1, -no-reboot); a broken one hangs.
func probeKVM(ctx context.Context, cfg vm.Config, bin string) bool {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	console := "ttyS0"
	machine := "q35"
	if cfg.Arch == vm.ArchARM64 {
		console, machine = "ttyAMA0", "virt"
	}
	cmd := exec.CommandContext(ctx, bin, "-M", machine, "-accel", "kvm", "-cpu", "host", "-m", "256M",
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
