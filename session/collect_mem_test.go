//go:build linux

package session

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/overlay"
)

// BenchmarkCollectMillion collects a change set of overlay.MaxChanges
// entries (added folders: the most that fit the change set frame's bound)
// through the session's path — the stream, the change set's parsing and
// checks, the patch written into a session folder — and reports the
// process's peak RSS and the Go heap's peak. Run it alone, so the peak is
// its own:
//
//	go test ./session -run '^$' -bench CollectMillion -benchtime 1x
func BenchmarkCollectMillion(b *testing.B) {
	const n = overlay.MaxChanges
	for range b.N {
		dir := b.TempDir()
		ws := b.TempDir()
		if _, err := overlay.TakeBaseline(b.Context(), ws, dir+"/"+overlay.BaselineDir, overlay.BaselineOptions{}); err != nil {
			b.Fatal(err)
		}
		peak := watchHeap()
		g := millionGuest{n: n}
		err := collect(b.Context(), g, collectLimits{MaxFile: 1 << 20, MaxTotal: 1 << 30, SpoolDir: dir},
			func(cs *overlay.ChangeSet, src overlay.Source) error {
				_, err := overlay.WriteSessionPatch(b.Context(), dir, cs, src, nil)
				return err
			})
		heap := peak()
		if err != nil {
			b.Fatal(err)
		}
		rss := vmHWM()
		b.ReportMetric(float64(rss)/(1<<20), "peak-rss-MiB")
		b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MiB")
		b.Logf("%d entries: peak RSS %d MiB, peak heap in use %d MiB", n, rss>>20, heap>>20)
	}
}

// millionGuest streams a change set of n added folders, generated as it
// goes (the test holds none of it).
type millionGuest struct{ n int }

func (g millionGuest) Exec(ctx context.Context, cmd string, o guestlink.ExecOptions) (guestlink.ExitStatus, error) {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<20)
		bw.WriteString(`{"version":` + strconv.Itoa(overlay.ChangeSetVersion) + `,"changes":[`)
		for i := range g.n {
			if i > 0 {
				bw.WriteByte(',')
			}
			fmt.Fprintf(bw, `{"path":"d%03d/%07d","op":"add","type":"dir","mode":493}`, i%1000, i)
		}
		bw.WriteString(`]}`)
		bw.Flush()
		pw.Close()
	}()
	// The frame needs its size first: count the JSON once, then send it.
	size := int64(len(`{"version":`+strconv.Itoa(overlay.ChangeSetVersion)+`,"changes":[`) + len(`]}`))
	for i := range g.n {
		size += int64(len(fmt.Sprintf(`{"path":"d%03d/%07d","op":"add","type":"dir","mode":493}`, i%1000, i)))
		if i > 0 {
			size++
		}
	}
	cw, err := proto.NewCollectWriter(o.Stdout)
	if err != nil {
		return guestlink.ExitStatus{}, err
	}
	if err := cw.Frame(proto.FrameChangeSet, "", size, pr); err != nil {
		return guestlink.ExitStatus{}, err
	}
	if err := cw.End(0); err != nil {
		return guestlink.ExitStatus{}, err
	}
	return guestlink.ExitStatus{}, cw.Flush()
}

// watchHeap samples the heap in use until the returned function is
// called, which returns the highest sample.
func watchHeap() func() uint64 {
	stop := make(chan struct{})
	done := make(chan uint64)
	go func() {
		var hi uint64
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			hi = max(hi, ms.HeapInuse)
			select {
			case <-stop:
				done <- hi
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(stop); return <-done }
}

// vmHWM is the process's peak resident set size.
func vmHWM() uint64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
