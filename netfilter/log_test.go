package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"

	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// readJSONL reads a JSON-lines file into generic maps (so the test sees the
// schema as written, not as Event would parse it).
func readJSONL(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q of %s is not JSON: %v", sc.Text(), path, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLogWriter(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	np, ap := filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile)
	w, err := NewLogWriter(np, ap)
	if err != nil {
		t.Fatal(err)
	}
	events := []egress.Event{
		{Kind: "dns", Name: "api.anthropic.com", Decision: "allow", Rule: "api.anthropic.com:443"},
		{Kind: "dns", Name: "evil.example", Decision: "deny", Reason: "no rule allows evil.example"},
		{Kind: "request", Name: "api.anthropic.com", Port: 443, Method: "POST", URL: "https://api.anthropic.com/v1/messages", Decision: "scrub",
			Findings: []egress.Finding{{Category: "aws-key", Prefix: "AKIA", Length: 20, Where: "body"}}},
		{Kind: "request", Name: "x.example", Port: 443, Decision: "allow", Status: 200, BytesUp: 10, BytesDn: 20,
			Findings: []egress.Finding{{Category: "email", Prefix: "bob@", Length: 15, Where: "url"}}},
		{Kind: "request", Name: "x.example", Port: 443, Decision: "error", Status: 502},
	}
	for _, e := range events {
		w.Record(e)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	w.Record(egress.Event{Kind: "dns", Decision: "deny"}) // after Close: dropped, no panic

	network, alerts := readJSONL(t, np), readJSONL(t, ap)
	if got, want := len(network), len(events); got != want {
		t.Fatalf("network.jsonl lines: got %d, want %d", got, want)
	}
	if got, want := len(alerts), 3; got != want {
		t.Fatalf("alerts.jsonl lines: got %d, want %d (deny, scrub, findings)", got, want)
	}
	for i, want := range []string{"deny", "scrub", "allow"} {
		if got := alerts[i]["decision"]; got != want {
			t.Errorf("alert %d decision: got %v, want %s", i, got, want)
		}
	}
	first := network[0]
	for _, k := range []string{"time", "kind", "name", "decision", "rule"} {
		if _, ok := first[k]; !ok {
			t.Errorf("network line lacks %q: %v", k, first)
		}
	}
	for _, k := range []string{"port", "bytes_up", "findings", "status"} {
		if _, ok := first[k]; ok {
			t.Errorf("network line has empty field %q: %v", k, first)
		}
	}
	if ts, _ := first["time"].(string); ts == "" || ts[len(ts)-1] != 'Z' {
		t.Errorf("time %q: want RFC 3339 in UTC", ts)
	}
	for _, p := range []string{np, ap} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o600 {
			t.Errorf("mode of %s: got %04o, want 0600", p, got)
		}
	}

	t.Run("appends", func(t *testing.T) {
		w, err := NewLogWriter(np, ap)
		if err != nil {
			t.Fatal(err)
		}
		w.Record(egress.Event{Kind: "dns", Decision: "allow"})
		w.Close()
		if got, want := len(readJSONL(t, np)), len(events)+1; got != want {
			t.Errorf("network.jsonl lines after reopening: got %d, want %d", got, want)
		}
	})
}

// gateWriter blocks every Write until open is closed. entered, when not
// nil, is closed when the first Write starts.
type gateWriter struct {
	open    chan struct{}
	entered chan struct{}
	once    sync.Once
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	if g.entered != nil {
		g.once.Do(func() { close(g.entered) })
	}
	<-g.open
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.buf.Write(p)
}

func (g *gateWriter) Close() error { return nil }

func TestLogWriterNeverBlocksAndCountsDrops(t *testing.T) {
	t.Parallel()
	nw := &gateWriter{open: make(chan struct{}), entered: make(chan struct{})}
	aw := &gateWriter{open: nw.open}
	w := newLogWriter(nw, aw, 4)
	// Once the writer is stuck on its first flush, the queue of 4 fills and
	// the rest are dropped, without blocking this goroutine.
	w.Record(egress.Event{Kind: "dns", Decision: "allow"})
	<-nw.entered
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 99 {
			w.Record(egress.Event{Kind: "dns", Decision: "allow"})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Record blocked on a stuck writer")
	}
	dropped := w.Dropped()
	if dropped != 99-4 {
		t.Errorf("Dropped: got %d, want %d", dropped, 99-4)
	}
	close(nw.open)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(nw.buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	var reported float64
	written := int64(0)
	for _, l := range lines {
		if l["kind"] == "dropped" {
			reported += l["dropped"].(float64)
		} else {
			written++
		}
	}
	if int64(reported) != dropped {
		t.Errorf("dropped lines report %v events, want %d", reported, dropped)
	}
	if written+dropped != 100 {
		t.Errorf("written %d + dropped %d: want 100", written, dropped)
	}
	if !bytes.Contains(aw.buf.Bytes(), []byte(`"kind":"dropped"`)) {
		t.Errorf("alerts lack the dropped line: %s", aw.buf.String())
	}
}

func TestLogWriterConcurrentClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w, err := NewLogWriter(filepath.Join(dir, "n"), filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				w.Record(egress.Event{Kind: "request", Decision: "deny"})
			}
		})
	}
	wg.Go(func() { w.Close() })
	wg.Wait()
	w.Close()
	n := int64(len(readJSONL(t, filepath.Join(dir, "n"))))
	for _, l := range readJSONL(t, filepath.Join(dir, "n")) {
		if l["kind"] == "dropped" {
			n--
		}
	}
	if got := n + w.Dropped(); got != 8000 {
		t.Errorf("written %d + dropped %d = %d, want 8000", n, w.Dropped(), got)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }
func (failWriter) Close() error              { return nil }

func TestLogWriterReportsWriteErrors(t *testing.T) {
	t.Parallel()
	w := newLogWriter(failWriter{}, failWriter{}, 16)
	for range 1000 {
		w.Record(egress.Event{Kind: "dns", Decision: "deny"})
	}
	err := w.Close()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Close: got %v, want the write error", err)
	}
	if n := strings.Count(err.Error(), "disk full"); n > 2 {
		t.Errorf("Close error repeats the failure %d times: %v", n, err)
	}
}

// floodLines reads a JSON-lines file and sums, per cause, what its
// "dropped" lines report; plain counts the other lines.
func floodLines(t *testing.T, path string) (plain int64, dropped map[string]int64, starts int) {
	t.Helper()
	dropped = map[string]int64{}
	for _, l := range readJSONL(t, path) {
		if l["kind"] != "dropped" {
			plain++
			continue
		}
		n := int64(l["dropped"].(float64))
		if n == 0 {
			starts++
		}
		dropped[l["cause"].(string)] += n
	}
	return plain, dropped, starts
}

// TestLogWriterRateLimitFlood: a guest's request flood costs one bucket's
// worth of lines, a line saying limiting starts, and one exact count when
// it ends.
func TestLogWriterRateLimitFlood(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	np, ap := filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile)
	nf, _ := os.Create(np)
	af, _ := os.Create(ap)
	var mu sync.Mutex
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	w := newLogWriterLimits(nf, af, 1024, logLimits{burst: 100, rate: 10}, now)
	const flood = 50_000
	for i := range flood {
		w.Record(egress.Event{Kind: "request", Decision: "deny", Name: "x.example", URL: "https://x.example/" + strings.Repeat("a", i%100)})
	}
	w.Record(egress.Event{Kind: "dns", Decision: "allow", Name: "other.example"}) // another kind is not limited
	mu.Lock()
	clock = clock.Add(time.Second) // ten tokens back
	mu.Unlock()
	w.Record(egress.Event{Kind: "request", Decision: "deny", Name: "after.example"})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{np, ap} {
		plain, dropped, starts := floodLines(t, path)
		want := int64(101 + 1)
		if path == ap {
			want = 101 // the dns allow is no alert
		}
		if plain != want || dropped[DropRate] != flood-100 || starts != 1 || len(dropped) != 1 {
			t.Errorf("%s: %d lines, dropped %v, %d start lines; want %d lines, exactly %d dropped by the rate limit, 1 start",
				filepath.Base(path), plain, dropped, starts, want, flood-100)
		}
	}
	if got := w.Dropped(); got != flood-100 {
		t.Errorf("Dropped: got %d, want %d", got, flood-100)
	}
}

// TestLogWriterCap: past its cap a file grows no more, and the count of
// what it dropped is exact.
func TestLogWriterCap(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	np, ap := filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile)
	nf, _ := os.Create(np)
	af, _ := os.Create(ap)
	const netCap, alertsCap, flood = 256 << 10, 128 << 10, 20_000
	w := newLogWriterLimits(nf, af, flood+16, logLimits{netCap: netCap, alertsCap: alertsCap}, time.Now)
	for i := range flood {
		d := "allow"
		if i%2 == 0 {
			d = "deny"
		}
		w.Record(egress.Event{Kind: "request", Decision: d, Name: "x.example", URL: "https://x.example/" + strings.Repeat("b", 200)})
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path      string
		limit     int64
		recorded  int64
		wantStart int
	}{{np, netCap, flood, 1}, {ap, alertsCap, flood / 2, 1}} {
		fi, err := os.Stat(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > tt.limit || fi.Size() < tt.limit-2*logCapReserve {
			t.Errorf("%s: %d bytes, want at most the cap of %d (and close to it)", filepath.Base(tt.path), fi.Size(), tt.limit)
		}
		plain, dropped, starts := floodLines(t, tt.path)
		if plain+dropped[DropCap] != tt.recorded || starts != tt.wantStart || dropped[DropCap] == 0 {
			t.Errorf("%s: %d lines + %d counted as dropped (%d start lines), want %d in all",
				filepath.Base(tt.path), plain, dropped[DropCap], starts, tt.recorded)
		}
	}
}

// TestRequestFloodLogBounded: a guest floods the explicit proxy with refused
// requests. The log keeps a bounded number of lines and accounts exactly
// for every request it did not keep.
func TestRequestFloodLogBounded(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules)
	proxy := v.ProxyListener()
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	const flood = 5000
	for i := range flood {
		resp, err := c.Get(fmt.Sprintf("http://evil.test/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request %d: status %d, want 403", i, resp.StatusCode)
		}
	}
	// A refusal may be recorded just after its answer: wait until the sink
	// saw them all, then flush.
	deadline := time.Now().Add(time.Minute)
	for len(v.Events.All()) < flood {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d refusals recorded", len(v.Events.All()), flood)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v.log.Close()
	var kept, dropped int64
	for _, l := range readJSONL(t, filepath.Join(v.logDir, NetworkLogFile)) {
		switch {
		case l["kind"] == "dropped" && l["of"] == "request/deny":
			dropped += int64(l["dropped"].(float64))
		case l["kind"] == "request" && l["decision"] == "deny":
			kept++
		}
	}
	if kept+dropped != flood || dropped == 0 {
		t.Errorf("network.jsonl keeps %d refusals and counts %d as dropped: want %d in all, most of them dropped", kept, dropped, flood)
	}
}
