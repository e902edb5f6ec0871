package dlp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/dlp/testdata/baseline"
)

// benchSecrets makes n random secrets of 20 to 40 characters.
func benchSecrets(n int) []Secret {
	r := rand.New(rand.NewPCG(1, 2))
	const alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
	out := make([]Secret, n)
	for i := range out {
		b := make([]byte, 20+r.IntN(21))
		for j := range b {
			b[j] = alpha[r.IntN(len(alpha))]
		}
		out[i] = Secret{Value: string(b), Source: fmt.Sprintf("bench:%d", i)}
	}
	return out
}

var benchWords = strings.Fields(`func return if else for range struct type package import const var
	err nil string int byte map slice append len make context ctx request response handler server client
	the a of to and in is that for it as was with be by on not he this are or his from at which
	config options value key name path file line error message user data result status true false
	fmt.Errorf("open %s: %w", path, err) {} [] () := == != <= >= && || // TODO: fix 0 1 2 42 1024 3.14
	http://localhost:8080/api/v1/items https://github.com/org/repo/pull/123 v1.2.3 2024-11-23T10:00:00Z
	6ba7b810-9dad-11d1-80b4-00c04fd430c8 e83c5163316f89bfbde7d9ab23ca2e25604af290 max_tokens input_tokens`)

// benchText makes n bytes of source-code-like text.
func benchText(r *rand.Rand, n int) string {
	var b strings.Builder
	col := 0
	for b.Len() < n {
		w := benchWords[r.IntN(len(benchWords))]
		b.WriteString(w)
		col += len(w) + 1
		if col > 70 {
			b.WriteString("\n\t")
			col = 0
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()[:n]
}

// benchBody is an AI API request of about size bytes whose message
// contents are code-like text holding a few of the secrets.
func benchBody(size int, secrets []Secret) []byte {
	r := rand.New(rand.NewPCG(3, 4))
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	total := 0
	for i := 0; total < size-200; i++ {
		n := min(8<<10+r.IntN(32<<10), size-200-total)
		text := benchText(r, n)
		if i%4 == 1 && len(secrets) > 0 {
			s := secrets[r.IntN(len(secrets))].Value
			at := r.IntN(len(text))
			for at < len(text) && text[at] != ' ' {
				at++ // not inside a word: http://local is a host
			}
			text = text[:at] + " API_KEY=" + s + "\n" + text[at:]
		}
		msgs = append(msgs, msg{Role: []string{"user", "assistant"}[i%2], Content: text})
		raw, _ := json.Marshal(msgs[len(msgs)-1])
		total += len(raw)
	}
	out, _ := json.Marshal(map[string]any{"model": "claude-sonnet", "max_tokens": 4096, "messages": msgs})
	return out
}

// scrubFunc scrubs one body; the engine under test and the previous one
// (the frozen copy in testdata/baseline) are both wrapped as one.
type scrubFunc func(dst *bytes.Buffer, body []byte)

// benchEngines builds this engine and the previous one on the same
// secrets, for a public destination (every category active).
func benchEngines(b *testing.B, secrets []Secret) (ours, prev scrubFunc) {
	e, err := New(Config{Secrets: secrets})
	if err != nil {
		b.Fatal(err)
	}
	pol := e.PolicyForClass(ClassPublic)
	old := make([]baseline.Secret, len(secrets))
	for i, s := range secrets {
		old[i] = baseline.Secret{Value: s.Value, Source: s.Source}
	}
	pe, err := baseline.New(baseline.Config{Secrets: old})
	if err != nil {
		b.Fatal(err)
	}
	ppol := pe.PolicyForClass(baseline.ClassPublic)
	ours = func(dst *bytes.Buffer, body []byte) {
		if err := e.Scrub(dst, bytes.NewReader(body), &pol, StreamOptions{ContentType: "application/json"}, nil); err != nil {
			b.Fatal(err)
		}
	}
	prev = func(dst *bytes.Buffer, body []byte) {
		if err := pe.Scrub(dst, bytes.NewReader(body), &ppol, baseline.StreamOptions{ContentType: "application/json"}, nil); err != nil {
			b.Fatal(err)
		}
	}
	return ours, prev
}

// benchLoad logs the load average, which the figures depend on.
func benchLoad(b *testing.B) {
	if l, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.Logf("load average: %s", bytes.TrimSpace(l))
	}
}

// cost is what a phase of a benchmark took.
type cost struct {
	wall, cpu, caller time.Duration
	alloc             uint64
}

func (c *cost) add(o cost) {
	c.wall, c.cpu, c.caller, c.alloc = c.wall+o.wall, c.cpu+o.cpu, c.caller+o.caller, c.alloc+o.alloc
}

// phase times reps scrubs of body, in wall-clock time and in the CPU time
// of the process (all its threads: the engine searches known values on a
// second core) and of the calling thread alone (the caller locks the
// goroutine to it), and counts the bytes they allocate.
func phase(f scrubFunc, body []byte, reps int, out *bytes.Buffer) cost {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	c0, k0, t0 := processCPU(), threadCPU(), time.Now()
	for range reps {
		out.Reset()
		f(out, body)
	}
	d, c, k := time.Since(t0), processCPU()-c0, threadCPU()-k0
	runtime.ReadMemStats(&m1)
	return cost{d, c, k, m1.TotalAlloc - m0.TotalAlloc}
}

// BenchmarkScrub1MBJSON scrubs a 1 MB JSON request with 1,000 known
// secrets and every recognizer, and the previous engine (testdata/baseline)
// the same body in the same run; it reports both throughputs, their ratio
// and the bytes each allocates per MB. The two take turns, five scrubs at
// a time, so load from other jobs falls on both alike; cpu_MB/s divides by
// the CPU time the process spent, which load moves far less than the
// wall-clock MB/s; caller_cpu_MB/s divides by the CPU time of the
// benchmark's own thread only (the scrubs' critical path: what the
// known-value worker and the collector's background marking do on other
// threads is not in it), which bounds the wall-clock rate an idle machine
// can reach. The outputs must be the same byte for byte.
func BenchmarkScrub1MBJSON(b *testing.B) {
	const reps = 5
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	secrets := benchSecrets(1000)
	body := benchBody(1<<20, secrets)
	ours, prev := benchEngines(b, secrets)
	var out, want bytes.Buffer
	ours(&out, body)
	prev(&want, body)
	if !bytes.Equal(out.Bytes(), want.Bytes()) {
		b.Fatal("this engine and the previous one scrub the benchmark body differently")
	}
	benchLoad(b)
	// The garbage of the set-up (two engines' tables, the body) is
	// collected now, not on other threads during the first phase.
	runtime.GC()
	var co, cp cost
	b.ResetTimer()
	for i := range b.N {
		// Alternate which goes first.
		for k := range 2 {
			if (i+k)%2 == 0 {
				co.add(phase(ours, body, reps, &out))
			} else {
				cp.add(phase(prev, body, reps, &out))
			}
		}
	}
	b.StopTimer()
	benchLoad(b)
	mb := float64(len(body)) * float64(b.N) * reps / 1e6
	b.ReportMetric(mb/co.wall.Seconds(), "vibedom_MB/s")
	b.ReportMetric(mb/cp.wall.Seconds(), "previous_MB/s")
	b.ReportMetric(cp.wall.Seconds()/co.wall.Seconds(), "ratio")
	if co.cpu > 0 && cp.cpu > 0 {
		b.ReportMetric(mb/co.cpu.Seconds(), "vibedom_cpu_MB/s")
		b.ReportMetric(mb/cp.cpu.Seconds(), "previous_cpu_MB/s")
		b.ReportMetric(cp.cpu.Seconds()/co.cpu.Seconds(), "cpu_ratio")
	}
	if co.caller > 0 && cp.caller > 0 {
		b.ReportMetric(mb/co.caller.Seconds(), "vibedom_caller_cpu_MB/s")
		b.ReportMetric(mb/cp.caller.Seconds(), "previous_caller_cpu_MB/s")
	}
	b.ReportMetric(float64(co.alloc)/mb, "B/MB")
	b.ReportMetric(float64(cp.alloc)/mb, "previous_B/MB")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkScrub64KBLatency measures the latency of scrubbing 64 KB JSON
// bodies (1,000 known secrets, every recognizer) with this engine and the
// previous one, body by body in turn, and reports each one's p50 and p99.
func BenchmarkScrub64KBLatency(b *testing.B) {
	secrets := benchSecrets(1000)
	ours, prev := benchEngines(b, secrets)
	bodies := make([][]byte, 16)
	for i := range bodies {
		bodies[i] = benchBody(64<<10, secrets[i*7:])
	}
	benchLoad(b)
	var out bytes.Buffer
	var lat, plat []time.Duration
	b.ResetTimer()
	for i := range max(b.N, 2000) {
		body := bodies[i%len(bodies)]
		for k := range 2 {
			f, l := ours, &lat
			if (i+k)%2 == 1 {
				f, l = prev, &plat
			}
			out.Reset()
			t0 := time.Now()
			f(&out, body)
			*l = append(*l, time.Since(t0))
		}
	}
	b.StopTimer()
	for _, l := range [][]time.Duration{lat, plat} {
		slices.Sort(l)
	}
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_µs")
	b.ReportMetric(float64(plat[len(plat)/2].Microseconds()), "previous_p50_µs")
	b.ReportMetric(float64(plat[len(plat)*99/100].Microseconds()), "previous_p99_µs")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAnchorPass runs the recognizers' anchor pass alone over the
// 1 MB benchmark body and reports its CPU time per pass (cpu_ns/op),
// which load moves little.
func BenchmarkAnchorPass(b *testing.B) {
	body := benchBody(1<<20, benchSecrets(1000))
	e, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	pol := e.PolicyForClass(ClassPublic)
	var pemOpen bool
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	c0 := processCPU()
	for range b.N {
		sc := scanner{e: e, pol: &pol, buf: body, n: len(body), final: true, hold: len(body), pemOpen: &pemOpen}
		sc.anchorPass()
	}
	b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(b.N), "cpu_ns/op")
}
