package qemu_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// BenchmarkWorkspaceMetadata walks a 5,000-file workspace in the guest
// (find, then ls -lR: a stat of every file) over virtiofs and over 9p, in one run,
// cold (guest caches dropped) and warm, and prints the ratios.
//
//	go test ./vm/qemu -run '^$' -bench WorkspaceMetadata -benchtime 1x
func BenchmarkWorkspaceMetadata(b *testing.B) {
	if qemu.New(qemu.Options{}).Info().ShareFS != vm.ShareVirtiofs {
		b.Skip("virtiofs cannot run on this host (needs Linux, root and virtiofsd)")
	}
	files := map[string]string{}
	for i := range 5000 {
		files[fmt.Sprintf("src/d%02d/s%02d/file%04d.txt", i/250, i/50%5, i)] = "x"
	}
	type result struct{ cold, warm time.Duration }
	measure := func(share string) result {
		h := vmtest.Harness{Driver: qemu.New(qemu.Options{CacheDir: os.TempDir(), ShareFS: share}), Arch: vm.ArchAMD64}
		h.ShareFS = proto.FS9P
		if share == string(vm.ShareVirtiofs) {
			h.ShareFS = proto.FSVirtiofs
		}
		g := vmtest.Boot(b, h, files)
		walk := "find /mnt/workspace -type f | wc -l; ls -lR /mnt/workspace | grep -c '^-'"
		timeIt := func(cmd string) time.Duration {
			// A cold 9p walk can take minutes under TCG on a busy machine.
			ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
			defer cancel()
			var out bytes.Buffer
			start := time.Now()
			st, err := g.Client.Exec(ctx, cmd, guestlink.ExecOptions{Stdout: &out})
			d := time.Since(start)
			if err != nil || st.Code != 0 || !strings.Contains(out.String(), "5000\n5000") {
				b.Fatalf("%s over %s: %q (%v, %v)", cmd, share, out.String(), st, err)
			}
			return d
		}
		var r result
		for range b.N {
			g.Sh(b, "sync; echo 3 > /proc/sys/vm/drop_caches")
			r.cold += timeIt(walk)
			r.warm += timeIt(walk)
		}
		return r
	}
	v := measure(string(vm.ShareVirtiofs))
	p := measure(string(vm.Share9P))
	n := time.Duration(b.N)
	b.ReportMetric(float64(p.cold)/float64(v.cold), "cold-x-faster")
	b.ReportMetric(float64(p.warm)/float64(v.warm), "warm-x-faster")
	fmt.Printf("5,000-file walk (find + ls -lR): virtiofs cold %v warm %v; 9p cold %v warm %v; virtiofs is %.1fx (cold) and %.1fx (warm) faster\n",
		(v.cold / n).Round(time.Millisecond), (v.warm / n).Round(time.Millisecond),
		(p.cold / n).Round(time.Millisecond), (p.warm / n).Round(time.Millisecond),
		float64(p.cold)/float64(v.cold), float64(p.warm)/float64(v.warm))
}
