package qemu

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/vm"
)

// TestPlanBootsOneCPUUnderTCG: under emulation a VM with several CPUs
// boots its kernel on one (the guest brings the rest online), yet QEMU
// gives it every CPU; under KVM, and with one CPU, the command line has no
// maxcpus.
func TestPlanBootsOneCPUUnderTCG(t *testing.T) {
	for _, tt := range []struct {
		arch  vm.Arch
		accel string
		cpus  int
		want  bool
	}{
		{vm.ArchAMD64, "tcg", 2, true},
		{vm.ArchARM64, "tcg", 4, true},
		{vm.ArchAMD64, "tcg", 1, false},
		{vm.ArchAMD64, "kvm", 2, false},
		{vm.ArchARM64, "kvm", 2, false},
	} {
		cfg := &vm.Config{Name: "c", Arch: tt.arch, CPUs: tt.cpus, MemoryMiB: 1024, Kernel: "k", Initrd: "i", StateDir: t.TempDir(), Cmdline: "quiet"}
		p, err := buildPlan(cfg, "qemu", tt.accel, vm.Share9P)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(p.args, "-append")
		j := slices.Index(p.args, "-smp")
		if i < 0 || j < 0 {
			t.Fatalf("no -append or -smp in %q", p.args)
		}
		got := slices.Contains(strings.Fields(p.args[i+1]), "maxcpus=1")
		if got != tt.want {
			t.Errorf("%s %s %d CPUs: maxcpus=1 in %q is %v, want %v", tt.arch, tt.accel, tt.cpus, p.args[i+1], got, tt.want)
		}
		if p.args[j+1] != strconv.Itoa(tt.cpus) {
			t.Errorf("%s %s: -smp %s, want %d", tt.arch, tt.accel, p.args[j+1], tt.cpus)
		}
	}
}

// TestPlanTCGBootArgs: an emulated x86 guest keeps its lock prefixes when
// it boots on one CPU (noreplace-smp) and keeps its APIC timer (no
// nolapic_timer: that would cost it high-resolution timers); a KVM guest
// boots as the hardware would, and an arm64 guest is never given x86
// options (an unknown option reaches PID 1 as an argument).
func TestPlanTCGBootArgs(t *testing.T) {
	for _, tt := range []struct {
		arch  vm.Arch
		accel string
		cpus  int
		want  bool
	}{
		{vm.ArchAMD64, "tcg", 2, true},
		{vm.ArchAMD64, "tcg", 1, true},
		{vm.ArchAMD64, "kvm", 2, false},
		{vm.ArchARM64, "tcg", 2, false},
	} {
		cfg := &vm.Config{Name: "c", Arch: tt.arch, CPUs: tt.cpus, MemoryMiB: 1024, Kernel: "k", Initrd: "i", StateDir: t.TempDir(), Cmdline: "quiet"}
		p, err := buildPlan(cfg, "qemu", tt.accel, vm.Share9P)
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Fields(p.args[slices.Index(p.args, "-append")+1])
		if got := slices.Contains(args, "noreplace-smp"); got != tt.want {
			t.Errorf("%s %s %d CPUs: noreplace-smp in %q is %v, want %v", tt.arch, tt.accel, tt.cpus, args, got, tt.want)
		}
		if slices.Contains(args, "nolapic_timer") {
			t.Errorf("%s %s %d CPUs: nolapic_timer in %q", tt.arch, tt.accel, tt.cpus, args)
		}
	}
}
