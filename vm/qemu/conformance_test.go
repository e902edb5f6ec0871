package qemu_test

import (
	"os"
	"testing"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// harness runs the suite on the share the driver picks for this host
// (virtiofs where virtiofsd can run, 9p elsewhere).
func harness(arch vm.Arch) vmtest.Harness {
	return vmtest.Harness{
		Driver: qemu.New(qemu.Options{CacheDir: os.TempDir()}),
		Arch:   arch,
	}
}

func TestConformanceVM(t *testing.T) {
	h := harness(vm.ArchAMD64)
	t.Logf("workspace share: %s", h.Driver.Info().ShareFS)
	vmtest.Run(t, h)
}

// TestConformance9PVM runs the suite on the 9p fallback, the share of hosts
// where virtiofsd cannot run. Where 9p is already the default the run
// above covered it.
func TestConformance9PVM(t *testing.T) {
	h := harness(vm.ArchAMD64)
	if h.Driver.Info().ShareFS == vm.Share9P {
		t.Skip("9p is this host's default share: TestConformanceVM ran on it")
	}
	h.Driver = qemu.New(qemu.Options{CacheDir: os.TempDir(), ShareFS: string(vm.Share9P)})
	h.ShareFS = proto.FS9P
	vmtest.Run(t, h)
}

func TestStopVM(t *testing.T) {
	vmtest.RunStop(t, harness(vm.ArchAMD64))
}

func TestConformanceArm64VM(t *testing.T) {
	if os.Getenv("VIBEDOM_E2E_ARM64") == "" {
		t.Skip("arm64 guests under emulation are slow: set VIBEDOM_E2E_ARM64=1 (make e2e-arm64)")
	}
	vmtest.Run(t, harness(vm.ArchARM64))
}
