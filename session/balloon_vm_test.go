//go:build linux

package session

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// TestBalloonPolicyVM runs the balloon policy on a real 1.5 GiB guest under
// QEMU (whose machines implement vm.Ballooner through QMP, though sessions
// leave it off there: free page reporting does the job): the idle guest is
// shrunk, QMP query-balloon shows it reached the lowered size, then the
// guest fills 1 GiB of tmpfs, more than the size it was shrunk to, and the
// policy grows it back in time: no OOM kill, the agent still answers.
func TestBalloonPolicyVM(t *testing.T) {
	const memMiB = 1536
	g := vmtest.Boot(t, vmtest.Harness{
		Driver: qemu.New(qemu.Options{CacheDir: os.TempDir(), ShareFS: string(vm.Share9P)}), Arch: vm.Arch(runtime.GOARCH),
		Transport: proto.TransportVirtioSerial, ShareFS: proto.FS9P, BootTimeout: 5 * time.Minute,
		CPUs: 1, MemoryMiB: memMiB,
	}, nil)
	bm, ok := g.Machine.(vm.Ballooner)
	if !ok {
		t.Fatal("a QEMU machine is not a vm.Ballooner")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	p := newBalloonPolicy(memMiB)
	p.shrinkAfter = 2 // calm enough for a test
	r := &balloonRun{policy: p, balloon: bm, state: g.Machine.State, read: g.Client.MemInfo,
		log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.run(rctx, tick.C) }()
	defer func() { stop(); <-done }()

	// waitSize polls query-balloon until ok says the guest's size is right.
	waitSize := func(what string, ok func(int) bool) int {
		t.Helper()
		for {
			mib, err := bm.MemoryTarget(ctx)
			if err == nil && ok(mib) {
				return mib
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: query-balloon says %d MiB (%v)", what, mib, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	exec := func(script string) string {
		t.Helper()
		var out, errb bytes.Buffer
		st, err := g.Client.Exec(ctx, script, guestlink.ExecOptions{Stdout: &out, Stderr: &errb})
		if err != nil || !st.Success() {
			t.Fatalf("%q: %v %v\n%s%s", script, st, err, out.String(), errb.String())
		}
		return out.String()
	}

	// Idle: the policy shrinks the guest to what it uses plus the headroom.
	shrunk := waitSize("shrink the idle guest", func(mib int) bool { return mib <= memMiB/2 })
	t.Logf("idle guest shrunk to %d MiB of %d", shrunk, memMiB)
	if shrunk < p.floor {
		t.Fatalf("shrunk to %d MiB, below the floor %d", shrunk, p.floor)
	}

	// Work: 1 GiB of tmpfs, more than the guest has now. The guest must
	// get its memory back to hold it.
	exec(`set -e; mkdir -p /run/fill; mount -t tmpfs -o size=1100m fill /run/fill
dd if=/dev/zero of=/run/fill/a bs=1M count=1024 2>&1 | tail -n 1`)
	grown := waitSize("grow back", func(mib int) bool { return mib >= shrunk+512 })
	t.Logf("grew back to %d MiB", grown)
	if out := exec(`du -m /run/fill/a | cut -f1; dmesg | grep -c -i -e "out of memory" -e oom-kill || true`); strings.Fields(out)[0] != "1024" ||
		strings.Fields(out)[1] != "0" {
		t.Fatalf("the fill (MiB) and the kernel's OOM messages: %q", out)
	}
}
