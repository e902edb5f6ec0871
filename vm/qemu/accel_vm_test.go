package qemu_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// hangingKVM is a qemu-system-x86_64 for a host whose KVM passes the probe
// but freezes real guests: it answers the probe boot (-accel kvm, no QMP)
// with the kernel's panic, starts any other -accel kvm machine with its
// CPUs stopped (-S, emulated, so it runs anywhere), and runs emulated
// machines as they are. It logs each call's kind to $CALLS.
const hangingKVM = `#!/bin/sh
case " $* " in
*" -qmp "*) ;;
*" -accel kvm "*)
	echo probe >>"$CALLS"
	echo "Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(0,0)"
	exit 0 ;;
esac
case " $* " in
*" -accel kvm "*)
	echo kvm >>"$CALLS"
	for a do
		shift
		case $a in kvm) a=tcg ;; host) a=max ;; esac
		set -- "$@" "$a"
	done
	exec "$REAL_QEMU" -S "$@" ;;
*)
	echo tcg >>"$CALLS"
	exec "$REAL_QEMU" "$@" ;;
esac
`

// TestKVMFallbackVM: where the KVM probe passes but guests hang, the boot
// gives the silent guest the grace, boots it again emulated and keeps
// that verdict for later sessions.
func TestKVMFallbackVM(t *testing.T) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("the driver probes KVM only where /dev/kvm opens: %v", err)
	}
	f.Close()
	real, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skipf("no QEMU: %v", err)
	}
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(wrapper, []byte(hangingKVM), 0o755); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(dir, "calls")
	t.Setenv("VIBEDOM_QEMU_X86_64", wrapper)
	t.Setenv("REAL_QEMU", real)
	t.Setenv("CALLS", calls)
	t.Setenv("VIBEDOM_ACCEL", "")
	cache := filepath.Join(dir, "cache")
	d := qemu.New(qemu.Options{CacheDir: cache})

	g := vmtest.Boot(t, vmtest.Harness{Driver: d, Arch: vm.ArchAMD64, AccelGrace: 5 * time.Second}, map[string]string{"a.txt": "a"})
	out, err := g.Client.Output(t.Context(), "cat /work/a.txt")
	if err != nil || string(out) != "a" {
		t.Fatalf("the emulated guest does not serve the workspace: %q, %v", out, err)
	}
	data, _ := os.ReadFile(calls)
	if got := strings.Fields(string(data)); strings.Join(got, " ") != "probe kvm tcg" {
		t.Errorf("QEMU was started as %q, want the probe, the frozen KVM guest, then the emulated one", got)
	}

	// A later process emulates at once, and doctor says why.
	later := qemu.New(qemu.Options{CacheDir: cache})
	var kvm *vm.Check
	for _, c := range later.Doctor(t.Context(), vm.ArchAMD64) {
		if c.Name == "KVM acceleration" {
			kvm = &c
		}
	}
	if kvm == nil || kvm.Status != vm.CheckWarn || !strings.Contains(kvm.Detail, "guests do not run under it") {
		t.Errorf("doctor's KVM check after the fallback: %+v, want a warning that guests do not run under KVM", kvm)
	}
}
