package preflight

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestScanUsesEveryCore: by default one worker per core (GOMAXPROCS)
// decides files, and that many are busy at the same time. Each worker
// entering the hook waits (boundedly) for the others; a scan that
// serialised its files would never have more than one inside.
func TestScanUsesEveryCore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		workers int
		want    int
	}{
		{"default: GOMAXPROCS", 0, runtime.GOMAXPROCS(0)},
		{"explicit", 3, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			files := map[string]string{}
			for i := range 4 * tt.want {
				files[fmt.Sprintf("f%02d.go", i)] = "package x\n"
			}
			writeTree(t, e.ws, files)

			var mu sync.Mutex
			inside, most := 0, 0
			all := make(chan struct{}) // closed once want workers were inside together
			var once sync.Once
			opts := e.opts()
			opts.CacheDir = ""
			opts.Workers = tt.workers
			opts.onScanFile = func(string) {
				mu.Lock()
				inside++
				most = max(most, inside)
				if inside >= tt.want {
					once.Do(func() { close(all) })
				}
				mu.Unlock()
				select {
				case <-all:
				case <-time.After(5 * time.Second): // serialised: give up, fail below
					once.Do(func() { close(all) })
				}
				mu.Lock()
				inside--
				mu.Unlock()
			}
			var logs bytes.Buffer
			opts.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			if _, err := Scan(t.Context(), opts); err != nil {
				t.Fatal(err)
			}
			if most != tt.want {
				t.Errorf("at most %d files decided at once, want %d", most, tt.want)
			}
			var done struct{ Workers int }
			for line := range bytes.SplitSeq(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
				if bytes.Contains(line, []byte(`"preflight scan done"`)) {
					must(t, json.Unmarshal(line, &done))
				}
			}
			if done.Workers != tt.want {
				t.Errorf("logged workers: %d, want %d", done.Workers, tt.want)
			}
		})
	}
}
