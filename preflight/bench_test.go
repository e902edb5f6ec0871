package preflight

import (
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user plus system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScan50k scans a generated 50,000-file tree (~107 MB of
// source-like text, no secrets) three times with a fresh cache: the first
// scan reads and runs the rules over every file, the repeat finds every
// file unchanged by its stat, and a third repeat trusts no stat (every
// file read and hashed; the verdicts still come from the content-addressed
// cache), which is what the stat memo saves. It reports the durations,
// the speed-ups (target ≥ 20×) and, for the first scan, CPU time over wall
// time: about the number of cores kept busy.
func BenchmarkScan50k(b *testing.B) {
	dir := b.TempDir()
	genTree(b, dir, 50_000, 1)
	time.Sleep(racyWindow + 100*time.Millisecond) // files this fresh are never memoised
	key := filepath.Join(b.TempDir(), "k")
	var first, repeat, rehash, firstCPU time.Duration
	var bytes int64
	b.ResetTimer()
	for i := range b.N {
		opts := Options{Workspace: dir, ApprovalKeyPath: key, CacheDir: filepath.Join(b.TempDir(), "cache", string(rune('a'+i%26)))}
		c0, t0 := cpuTime(b), time.Now()
		r1, err := Scan(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		t1, c1 := time.Now(), cpuTime(b)
		r2, err := Scan(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		opts.noStatMemo = true
		r3, err := Scan(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		first += t1.Sub(t0)
		firstCPU += c1 - c0
		repeat += t2.Sub(t1)
		rehash += time.Since(t2)
		bytes = r1.Stats.BytesScanned
		if r1.Stats.Scanned != 50_000 || r2.Stats.CacheHits != 50_000 || r3.Stats.CacheHits != 50_000 {
			b.Fatalf("first %+v, repeat %+v, rehash %+v: want 50000 scanned then 50000 hits twice", r1.Stats, r2.Stats, r3.Stats)
		}
	}
	n := time.Duration(b.N)
	b.ReportMetric((first / n).Seconds(), "first-s")
	b.ReportMetric(float64(firstCPU)/float64(first), "first-cpu/wall")
	b.ReportMetric(float64((repeat/n).Microseconds())/1000, "repeat-ms")
	b.ReportMetric(float64(first)/float64(repeat), "speedup-x")
	b.ReportMetric(float64((rehash/n).Microseconds())/1000, "rehash-ms")
	b.ReportMetric(float64(first)/float64(rehash), "rehash-speedup-x")
	b.ReportMetric(float64(bytes)/(first/n).Seconds()/1e6, "first-MB/s")
	b.Logf("50,000 files, %.1f MB, GOMAXPROCS %d: first scan %v (CPU %.2f× wall), repeat %v (%.0f× faster), repeat reading every file %v (%.0f× faster)",
		float64(bytes)/1e6, runtime.GOMAXPROCS(0), (first / n).Round(time.Millisecond), float64(firstCPU)/float64(first),
		(repeat / n).Round(time.Millisecond), float64(first)/float64(repeat),
		(rehash / n).Round(time.Millisecond), float64(first)/float64(rehash))
}
