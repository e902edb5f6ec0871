package dlp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
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
			text = text[:at] + " API_KEY=" + s + "\n" + text[at:]
		}
		msgs = append(msgs, msg{Role: []string{"user", "assistant"}[i%2], Content: text})
		raw, _ := json.Marshal(msgs[len(msgs)-1])
		total += len(raw)
	}
	out, _ := json.Marshal(map[string]any{"model": "claude-sonnet", "max_tokens": 4096, "messages": msgs})
	return out
}

// regexBaseline is the naive scrubber: one regular expression per
// secret, run over the whole body in turn.
func regexBaseline(secrets []Secret) func([]byte) []byte {
	res := make([]*regexp.Regexp, len(secrets))
	for i, s := range secrets {
		res[i] = regexp.MustCompile(regexp.QuoteMeta(s.Value))
	}
	return func(b []byte) []byte {
		for _, re := range res {
			b = re.ReplaceAllLiteral(b, []byte("[REDACTED:SECRET]"))
		}
		return b
	}
}

// BenchmarkScrub1MBJSON scrubs a 1 MB JSON request with 1,000 known
// secrets and every recognizer, against one regular expression per
// secret in the same run, and reports both throughputs and their ratio.
// Each iteration scrubs the body 20 times, then runs the baseline once
// (it is about a hundred times slower); the two phases are timed apart so
// neither pays for the caches the other evicted.
func BenchmarkScrub1MBJSON(b *testing.B) {
	const reps = 20
	secrets := benchSecrets(1000)
	body := benchBody(1<<20, secrets)
	e, err := New(Config{Secrets: secrets})
	if err != nil {
		b.Fatal(err)
	}
	pol := e.PolicyForClass(ClassPublic)
	baseline := regexBaseline(secrets)
	var out bytes.Buffer
	var ours, theirs time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		for range reps {
			out.Reset()
			if err := e.Scrub(&out, bytes.NewReader(body), &pol, StreamOptions{ContentType: "application/json"}, nil); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		baseline(body)
		ours += t1.Sub(t0)
		theirs += time.Since(t1)
	}
	b.StopTimer()
	mb := float64(len(body)) * float64(b.N) / 1e6
	ourRate, theirRate := mb*reps/ours.Seconds(), mb/theirs.Seconds()
	b.ReportMetric(ourRate, "vibedom_MB/s")
	b.ReportMetric(theirRate, "regex-per-secret_MB/s")
	b.ReportMetric(ourRate/theirRate, "speedup")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkScrub64KBLatency measures the latency of scrubbing 64 KB JSON
// bodies (1,000 known secrets, every recognizer) and reports p50 and p99.
func BenchmarkScrub64KBLatency(b *testing.B) {
	secrets := benchSecrets(1000)
	e, err := New(Config{Secrets: secrets})
	if err != nil {
		b.Fatal(err)
	}
	pol := e.PolicyForClass(ClassPublic)
	bodies := make([][]byte, 16)
	for i := range bodies {
		bodies[i] = benchBody(64<<10, secrets[i*7:])
	}
	var out bytes.Buffer
	var lat []time.Duration
	b.ResetTimer()
	for i := range max(b.N, 2000) {
		out.Reset()
		t0 := time.Now()
		if err := e.Scrub(&out, bytes.NewReader(bodies[i%len(bodies)]), &pol, StreamOptions{ContentType: "application/json"}, nil); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50_µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99_µs")
	b.ReportMetric(0, "ns/op")
}
