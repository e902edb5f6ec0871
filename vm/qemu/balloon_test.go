package qemu

import (
	"slices"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// TestPlanHasBalloon: every guest gets a balloon with free page reporting,
// whatever the arch or share, so an idle guest hands freed memory back
// (TestBalloonReturnsMemoryVM in e2e/lifecycle measures it).
func TestPlanHasBalloon(t *testing.T) {
	for _, arch := range []vm.Arch{vm.ArchAMD64, vm.ArchARM64} {
		for _, share := range []vm.ShareFS{vm.Share9P, vm.ShareVirtiofs} {
			cfg := &vm.Config{Name: "b", Arch: arch, CPUs: 1, MemoryMiB: 1024, Kernel: "k", Initrd: "i", StateDir: t.TempDir(),
				Shares: []vm.Share{{Tag: "workspace", HostPath: t.TempDir(), ReadOnly: true}}}
			p, err := buildPlan(cfg, "qemu", "tcg", share)
			if err != nil {
				t.Fatal(err)
			}
			if i := slices.Index(p.args, "virtio-balloon-pci,free-page-reporting=on"); i < 1 || p.args[i-1] != "-device" {
				t.Errorf("%s/%s: no balloon device with free page reporting in %q", arch, share, p.args)
			}
		}
	}
}

// TestInfoFreePageReporting: the driver says its machines give freed memory
// back by themselves, so sessions leave the balloon's target alone.
func TestInfoFreePageReporting(t *testing.T) {
	if !New(Options{}).Info().FreePageReporting {
		t.Error("Info().FreePageReporting is false on QEMU")
	}
}
