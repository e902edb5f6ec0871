package netfilter

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
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
	dir := t.TempDir()
	np, ap := filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile)
	w, err := NewLogWriter(np, ap)
	if err != nil {
		t.Fatal(err)
	}
	events := []Event{
		{Kind: "dns", Name: "api.anthropic.com", Decision: "allow", Rule: "api.anthropic.com:443"},
		{Kind: "dns", Name: "evil.example", Decision: "deny", Reason: "no rule allows evil.example"},
		{Kind: "request", Name: "api.anthropic.com", Port: 443, Method: "POST", URL: "https://api.anthropic.com/v1/messages", Decision: "scrub",
			Findings: []Finding{{Category: "aws-key", Prefix: "AKIA", Length: 20, Where: "body"}}},
		{Kind: "request", Name: "x.example", Port: 443, Decision: "allow", Status: 200, BytesUp: 10, BytesDn: 20,
			Findings: []Finding{{Category: "email", Prefix: "bob@", Length: 15, Where: "url"}}},
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
	w.Record(Event{Kind: "dns", Decision: "deny"}) // after Close: dropped, no panic

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
		w.Record(Event{Kind: "dns", Decision: "allow"})
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
	nw := &gateWriter{open: make(chan struct{}), entered: make(chan struct{})}
	aw := &gateWriter{open: nw.open}
	w := newLogWriter(nw, aw, 4)
	// Once the writer is stuck on its first flush, the queue of 4 fills and
	// the rest are dropped, without blocking this goroutine.
	w.Record(Event{Kind: "dns", Decision: "allow"})
	<-nw.entered
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 99 {
			w.Record(Event{Kind: "dns", Decision: "allow"})
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
	dir := t.TempDir()
	w, err := NewLogWriter(filepath.Join(dir, "n"), filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				w.Record(Event{Kind: "request", Decision: "deny"})
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
	w := newLogWriter(failWriter{}, failWriter{}, 16)
	for range 1000 {
		w.Record(Event{Kind: "dns", Decision: "deny"})
	}
	err := w.Close()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Close: got %v, want the write error", err)
	}
	if n := strings.Count(err.Error(), "disk full"); n > 2 {
		t.Errorf("Close error repeats the failure %d times: %v", n, err)
	}
}
