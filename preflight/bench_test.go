package preflight

import (
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkScan50k scans a generated 50,000-file tree (~107 MB of
// source-like text, no secrets) twice with a fresh cache: the first scan
// reads and runs the rules over every file, the repeat finds every file
// unchanged. It reports both durations and their ratio (target ≥ 20×).
func BenchmarkScan50k(b *testing.B) {
	dir := b.TempDir()
	genTree(b, dir, 50_000, 1)
	time.Sleep(racyWindow + 100*time.Millisecond) // files this fresh are never memoised
	key := filepath.Join(b.TempDir(), "k")
	var first, repeat time.Duration
	var bytes int64
	b.ResetTimer()
	for i := range b.N {
		opts := Options{Workspace: dir, ApprovalKeyPath: key, CacheDir: filepath.Join(b.TempDir(), "cache", string(rune('a'+i%26)))}
		t0 := time.Now()
		r1, err := Scan(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		r2, err := Scan(b.Context(), opts)
		if err != nil {
			b.Fatal(err)
		}
		first += t1.Sub(t0)
		repeat += time.Since(t1)
		bytes = r1.Stats.BytesScanned
		if r1.Stats.Scanned != 50_000 || r2.Stats.CacheHits != 50_000 {
			b.Fatalf("first %+v, repeat %+v: want 50000 scanned then 50000 hits", r1.Stats, r2.Stats)
		}
	}
	n := time.Duration(b.N)
	b.ReportMetric((first / n).Seconds(), "first-s")
	b.ReportMetric(float64((repeat/n).Microseconds())/1000, "repeat-ms")
	b.ReportMetric(float64(first)/float64(repeat), "speedup-x")
	b.ReportMetric(float64(bytes)/(first/n).Seconds()/1e6, "first-MB/s")
	b.Logf("50,000 files, %.1f MB: first scan %v, repeat %v, %.0f× faster",
		float64(bytes)/1e6, (first / n).Round(time.Millisecond), (repeat / n).Round(time.Millisecond), float64(first)/float64(repeat))
}
