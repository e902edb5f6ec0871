package qemu_test

import (
	"os"
	"testing"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
	"github.com/vibedom/vibedom/vm/vmtest"
)

func harness(arch vm.Arch) vmtest.Harness {
	return vmtest.Harness{
		Driver:    qemu.New(qemu.Options{CacheDir: os.TempDir()}),
		Arch:      arch,
		Transport: proto.TransportVirtioSerial,
		ShareFS:   proto.FS9P,
	}
}

func TestConformanceVM(t *testing.T) {
	vmtest.Run(t, harness(vm.ArchAMD64))
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
