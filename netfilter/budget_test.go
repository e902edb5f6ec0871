package netfilter

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/vibedom/vibedom/dlp"
)

func withConfig(f func(*mitm.EngineConfig)) envOption { return envOption(f) }

// waitFor polls cond until it holds, failing the test after a generous
// guard time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count open files: %v", err)
	}
	return len(es)
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestStalledBodiesBounded plays a hostile guest that opens many
// connections, each declaring a 4 MiB body, sending 3 MiB of it and then
// stalling. Before the budget every one of them held its buffer (~5.8 MB
// each, no read timeout); now the session's requests stay within the
// budget, the rest get 503, and a request without a body is still served.
func TestStalledBodiesBounded(t *testing.T) {
	const total = 64 << 20
	// The DLP filter reads bodies up to 4 MiB whole: what the budget
	// stands for.
	de, err := dlp.New(dlp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v := newTestEnv(t, mitmtest.Rules, withConfig(func(c *mitm.EngineConfig) {
		c.MemoryBudget = total
		c.Filter = &DLPFilter{Engine: de}
	}))
	v.UpstreamPlain("plain.test", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	fdBase := openFDs(t)
	heapBase := heapInUse()

	const n = 40
	const declared, sent = 4 << 20, 3 << 20
	chunk := []byte(strings.Repeat("a", 64<<10))
	var refused atomic.Int64
	var writers sync.WaitGroup
	conns := make([]net.Conn, n)
	for i := range n {
		c := v.GuestConn("plain.test", 80)
		conns[i] = c
		t.Cleanup(func() { c.Close() })
		writers.Go(func() {
			fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: plain.test\r\nContent-Length: %d\r\n\r\n", declared)
			for w := 0; w < sent; w += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		})
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
				refused.Add(1)
			}
		}()
	}
	// Each admitted request is charged mitm.RequestCharge and twice its
	// declared length; bodies may take three quarters of the budget.
	maxAdmitted := int64(total/4*3) / (2*declared + mitm.RequestCharge)
	waitFor(t, "the requests the budget cannot cover to be refused", func() bool {
		return refused.Load() >= n-maxAdmitted
	})
	st := v.engine.Stats()
	if st.MemoryPeak > total {
		t.Errorf("budget peak %d MiB, over the %d MiB budget", st.MemoryPeak>>20, total>>20)
	}
	// Let the admitted ones' bodies arrive (their writers finish when
	// the filter has read them), then measure.
	writers.Wait()
	if grew := int64(heapInUse()) - int64(heapBase); grew > total+32<<20 {
		t.Errorf("heap grew by %d MiB with %d stalled bodies; the budget is %d MiB", grew>>20, n, total>>20)
	}
	if fds := openFDs(t); fds > fdBase+3*n+64 {
		t.Errorf("%d open files, from %d before %d connections", fds, fdBase, n)
	}

	// Another connection of the same session is still served.
	c := v.GuestConn("plain.test", 80)
	defer c.Close()
	fmt.Fprint(c, "GET /still HTTP/1.1\r\nHost: plain.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a request without a body while bodies hold the budget: status %d, want 200", resp.StatusCode)
	}
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, "the budget to be given back", func() bool { return v.engine.Stats().MemoryInUse == 0 })
}

// TestStalledBodyTimesOut checks that a body that stops sending is
// abandoned and its share of the budget given back: before, it was held
// for as long as the guest kept the connection open.
func TestStalledBodyTimesOut(t *testing.T) {
	t.Parallel()
	v := newTestEnv(t, mitmtest.Rules, withConfig(func(c *mitm.EngineConfig) { c.BodyIdleTimeout = 200 * time.Millisecond }))
	v.UpstreamPlain("plain.test", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	for _, proto := range []string{"http/1.1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			var c net.Conn
			if proto == "h2" {
				v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
				}))
				pr, pw := io.Pipe()
				defer pw.Close()
				req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://api.test/up", pr)
				req.ContentLength = 1 << 20
				done := make(chan struct{})
				go func() {
					defer close(done)
					if resp, err := (&http.Client{Transport: v.GuestTransport(true)}).Do(req); err == nil {
						resp.Body.Close()
					}
				}()
				pw.Write([]byte("some of it"))
				waitFor(t, "the request to be charged", func() bool { return v.engine.Stats().MemoryInUse > 0 })
				waitFor(t, "the stalled body to be abandoned", func() bool { return v.engine.Stats().MemoryInUse == 0 })
				return
			}
			c = v.GuestConn("plain.test", 80)
			defer c.Close()
			fmt.Fprint(c, "POST /up HTTP/1.1\r\nHost: plain.test\r\nContent-Length: 100000\r\n\r\nsome of it")
			waitFor(t, "the request to be charged", func() bool { return v.engine.Stats().MemoryInUse > 0 })
			waitFor(t, "the stalled body to be abandoned", func() bool { return v.engine.Stats().MemoryInUse == 0 })
		})
	}
}

// TestH2FanOutBounded plays a guest that opens hundreds of HTTP/2 streams
// to a host whose upstream speaks only HTTP/1.1: each stream needs its own
// upstream connection. Before the cap, every stream got one (84 guest
// connections became 20,000 open files); now no more than mitm.MaxConnsPerHost
// are open to the host, the rest wait for one, and all are served.
func TestH2FanOutBounded(t *testing.T) {
	v := newTestEnv(t, mitmtest.Rules)
	release := make(chan struct{})
	var active, peak atomic.Int64
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := active.Add(1)
		for p := peak.Load(); a > p && !peak.CompareAndSwap(p, a); p = peak.Load() {
		}
		<-release
		active.Add(-1)
		fmt.Fprint(w, "ok")
	}))
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.TLS = &tls.Config{NextProtos: []string{"http/1.1"}, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return v.UpCA.IssueLeaf("api.test", time.Hour)
	}}
	s.StartTLS()
	t.Cleanup(s.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	v.AddServer("api.test", 443, s.Listener.Addr().String())
	fdBase := openFDs(t)

	const n = 300
	// Count the guest's own connections: the client may open many at
	// first, each two open files in this test (both ends).
	tr := v.GuestTransport(true)
	var guestConns atomic.Int64
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		guestConns.Add(1)
		return dial(ctx, network, addr)
	}
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range n {
		wg.Go(func() {
			resp, err := client.Get("https://api.test/slow")
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && resp.ProtoMajor == 2 {
				ok.Add(1)
			}
		})
	}
	waitFor(t, "the upstream to be busy", func() bool { return active.Load() >= mitm.MaxConnsPerHost })
	if fds, g := openFDs(t), int(guestConns.Load()); fds > fdBase+2*g+2*mitm.MaxConnsPerHost+64 {
		t.Errorf("%d open files with %d streams waiting on %d guest connections, from %d before", fds, n, g, fdBase)
	}
	close(release)
	wg.Wait()
	if ok.Load() != n {
		t.Errorf("%d of %d requests served over h2", ok.Load(), n)
	}
	if p := peak.Load(); p > mitm.MaxConnsPerHost {
		t.Errorf("the upstream served %d requests at once, over the %d connections per host", p, mitm.MaxConnsPerHost)
	}
	if st := v.engine.Stats(); st.UpstreamPeak > mitm.MaxConnsPerHost {
		t.Errorf("%d upstream connections open at once, over %d", st.UpstreamPeak, mitm.MaxConnsPerHost)
	}
}

// TestStalledH2StreamsBounded plays the red team's guest: 4 HTTP/2
// connections × 100 streams, each declaring a 4 MiB body and stalling
// after a few bytes (2.4 GB before the budget). The session's charges stay
// within its budget, the streams it cannot cover get 503, and a fresh
// connection of the same session is still served.
func TestStalledH2StreamsBounded(t *testing.T) {
	t.Parallel()
	const total = 64 << 20
	de, err := dlp.New(dlp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v := newTestEnv(t, mitmtest.Rules, withConfig(func(c *mitm.EngineConfig) {
		c.MemoryBudget = total
		c.Filter = &DLPFilter{Engine: de}
	}))
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	const conns, streams = 4, mitm.MaxStreamsPerConn
	var refused atomic.Int64
	for range conns {
		rawH2Streams(t, v, streams, &refused)
	}
	maxAdmitted := int64(total/4*3) / (2*(4<<20) + mitm.RequestCharge)
	waitFor(t, "the streams the budget cannot cover to be refused", func() bool {
		return refused.Load() >= conns*streams-maxAdmitted
	})
	if st := v.engine.Stats(); st.MemoryPeak > total {
		t.Errorf("budget peak %d MiB, over %d MiB", st.MemoryPeak>>20, total>>20)
	}
	resp, err := (&http.Client{Transport: v.GuestTransport(true)}).Get("https://api.test/still")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a request without a body while bodies hold the budget: status %d, want 200", resp.StatusCode)
	}
}

// rawH2Streams opens an HTTP/2 guest connection to api.test and n streams
// on it, each a POST declaring 4 MiB and sending 512 bytes, never ending;
// it counts the 503 answers in refused.
func rawH2Streams(t *testing.T, v *testEnv, n int, refused *atomic.Int64) {
	t.Helper()
	tc := tls.Client(v.GuestConn("api.test", 443), &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"h2"}})
	t.Cleanup(func() { tc.Close() })
	if err := tc.HandshakeContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if tc.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatal("no h2")
	}
	var mu sync.Mutex // framer writes
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	mu.Lock()
	fr.WriteSettings()
	mu.Unlock()
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					mu.Lock()
					fr.WriteSettingsAck()
					mu.Unlock()
				}
			case *http2.MetaHeadersFrame:
				if f.PseudoValue("status") == "503" {
					refused.Add(1)
				}
			}
		}
	}()
	var hb strings.Builder
	enc := hpack.NewEncoder(&hb)
	body := make([]byte, 512)
	for i := range n {
		hb.Reset()
		for _, h := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "api.test"},
			{":path", "/up"}, {"content-length", "4194304"}} {
			enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
		}
		id := uint32(2*i + 1)
		mu.Lock()
		err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte(hb.String()), EndHeaders: true})
		if err == nil {
			err = fr.WriteData(id, false, body)
		}
		mu.Unlock()
		if err != nil {
			t.Fatalf("stream %d: %v", id, err)
		}
	}
}
