package mitm_test

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/internal/nftest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/keys"
	"golang.org/x/net/websocket"
)

// A streamed response reaches the guest event by event: the proxy holds
// nothing back while upstream is silent (the upstream sends the next event
// only once the guest has the previous one).
func TestStreamedEventsAreNotHeld(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	// One channel per subtest (by path), so a failed subtest's handler
	// cannot take the next one's signals.
	var mu sync.Mutex
	nexts := map[string]chan struct{}{}
	nextFor := func(path string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if nexts[path] == nil {
			nexts[path] = make(chan struct{})
		}
		return nexts[path]
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next := nextFor(r.URL.Path)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			// Events of assorted sizes, up to several TLS records.
			fmt.Fprintf(w, "data: %d %s\n\n", i, strings.Repeat("x", i*20000))
			w.(http.Flusher).Flush()
			if i == 4 {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	})
	v.UpstreamTLS("api.test", 443, v.UpCA, h)
	v.UpstreamPlain("plain.test", 80, h)
	tests := []struct {
		name string
		h2   bool
		url  string
	}{
		{"https http/1.1", false, "https://api.test/events/1"},
		{"https h2", true, "https://api.test/events/2"},
		{"http", false, "http://plain.test/events/3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &http.Client{Transport: v.GuestTransport(tt.h2)}
			u, _ := url.Parse(tt.url)
			next := nextFor(u.Path)
			// The guest reads on its own goroutine, so a held event fails
			// the test at the guard instead of hanging it.
			lines := make(chan string)
			go func() {
				defer close(lines)
				resp, err := c.Get(tt.url)
				if err != nil {
					lines <- err.Error()
					return
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				for {
					l, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if l != "\n" {
						select {
						case lines <- l:
						case <-t.Context().Done():
							return
						}
					}
				}
			}()
			for i := range 5 {
				select {
				case l := <-lines:
					if want := fmt.Sprintf("data: %d ", i); !strings.HasPrefix(l, want) || len(l) != len(want)+i*20000+1 {
						t.Fatalf("event %d: got %d bytes %.20q", i, len(l), l)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("event %d did not arrive while upstream waited for the guest to have it", i)
				}
				if i < 4 {
					next <- struct{}{}
				}
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ raw, want string }{
		{"/p", "https://h/p"},
		{"/p?a=1&b=two", "https://h/p?a=REDACTED&b=REDACTED"},
		{"/p?sk-abcdef", "https://h/p?REDACTED"},
		{"/p?a=&b", "https://h/p?a=&REDACTED"},
		{"/p?a=1&&b=2", "https://h/p?a=REDACTED&&b=REDACTED"},
		{"/p?" + strings.Repeat("k", 100) + "=v", "https://h/p?" + strings.Repeat("k", 64) + "…=REDACTED"},
		{"/a%20b?x=y%26z", "https://h/a%20b?x=REDACTED"},
		{"", "https://h/"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u := &url.URL{}
			if tt.raw != "" {
				var err error
				if u, err = url.ParseRequestURI(tt.raw); err != nil {
					t.Fatal(err)
				}
			}
			if got := mitm.RedactURL("https", "h", u); got != tt.want {
				t.Errorf("RedactURL(%q): got %q, want %q", tt.raw, got, tt.want)
			}
		})
	}
}

func TestPlainHTTP(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	v.UpstreamPlain("plain.test", 80, http.HandlerFunc(mitmtest.EchoInfo))
	c := &http.Client{Transport: v.GuestTransport(false)}
	resp, err := c.Get("http://plain.test/p?q=v")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello from plain.test /p?q=v" {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
	ev := v.Events.Wait(t, "plain request", mitmtest.IsKind("request", "allow"))
	if ev.URL != "http://plain.test/p?q=REDACTED" {
		t.Errorf("logged URL: got %q", ev.URL)
	}
}

func TestUpstreamCertificateErrors(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	rogue, err := keys.EnsureCA(filepath.Join(t.TempDir(), "rogue"))
	if err != nil {
		t.Fatal(err)
	}
	v.UpstreamTLS("api.test", 443, rogue, http.HandlerFunc(mitmtest.EchoInfo))
	// An upstream with a trusted CA but a certificate for another name.
	s := v.UpstreamTLS("x.wild.test", 443, v.UpCA, http.HandlerFunc(mitmtest.EchoInfo))
	s.TLS.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return v.UpCA.IssueLeaf("other.test", time.Hour) }
	v.AddServer("plain-on-tls.wild.test", 443, v.UpstreamPlain("plain-on-tls.wild.test", 1, http.HandlerFunc(mitmtest.EchoInfo)).Listener.Addr().String())

	tests := []struct {
		name, url, wantBody string
	}{
		{"unknown authority", "https://api.test/", "not trusted: signed by an unknown authority"},
		{"wrong name", "https://x.wild.test/", "not valid for x.wild.test"},
		{"not tls", "https://plain-on-tls.wild.test/", "did not answer with TLS"},
		{"unreachable", "https://nowhere.wild.test/", "nowhere.wild.test"},
	}
	c := &http.Client{Transport: v.GuestTransport(true)}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := c.Get(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				t.Errorf("status: got %d, want 502", resp.StatusCode)
			}
			if !strings.Contains(string(body), tt.wantBody) || !strings.HasPrefix(string(body), "vibedom: bad gateway: ") {
				t.Errorf("body %q: want it to say %q", body, tt.wantBody)
			}
			if got := resp.Header.Get("Content-Type"); !strings.HasPrefix(got, "text/plain") {
				t.Errorf("Content-Type: got %q, want text/plain", got)
			}
		})
	}
	ev := v.Events.Wait(t, "error event", mitmtest.IsKind("request", "error"))
	if ev.Status != 502 || ev.Reason == "" {
		t.Errorf("error event: %+v", ev)
	}
}

func TestIPLiteralTargetWithoutSNI(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	var hits atomic.Int32
	v.UpstreamPlain("192.0.2.10", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	conn := v.GuestConn("192.0.2.10", 443)
	defer conn.Close()
	pool := v.CA.Pool()
	tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: "192.0.2.10"}) // Go sends no SNI for an IP
	if err := tc.HandshakeContext(t.Context()); err != nil {
		t.Fatalf("handshake to an IP target without SNI: %v", err)
	}
	if got := tc.ConnectionState().PeerCertificates[0].IPAddresses; len(got) != 1 || !got[0].Equal(net.ParseIP("192.0.2.10")) {
		t.Errorf("leaf IP SANs: got %v", got)
	}
}

func TestWebSocketEcho(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	v.UpstreamTLS("api.test", 443, v.UpCA, websocket.Handler(func(ws *websocket.Conn) {
		for {
			var msg string
			if websocket.Message.Receive(ws, &msg) != nil {
				return
			}
			if msg == "big" { // the one answer far larger than its question
				msg = strings.Repeat("y", 300000)
			}
			websocket.Message.Send(ws, msg)
		}
	}))
	conn := v.GuestConn("api.test", 443)
	defer conn.Close()
	tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
	cfg, err := websocket.NewConfig("wss://api.test/ws?key=v", "https://api.test/")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, tc)
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"hello", strings.Repeat("x", 100000), "bye"} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			t.Fatal(err)
		}
		if got != msg {
			t.Errorf("echo: got %d bytes, want %d", len(got), len(msg))
		}
	}
	var big string
	if err := websocket.Message.Send(ws, "big"); err != nil {
		t.Fatal(err)
	}
	if err := websocket.Message.Receive(ws, &big); err != nil || len(big) != 300000 {
		t.Fatalf("the big answer: %d bytes, %v", len(big), err)
	}
	ws.Close()
	ev := v.Events.Wait(t, "websocket request", func(e egress.Event) bool { return e.Kind == "request" && e.Status == 101 })
	// Up: the guest's 100 kB; down: those echoed plus the 300 kB answer.
	if ev.BytesUp < 100000 || ev.BytesUp > 200000 || ev.BytesDn < 400000 {
		t.Errorf("websocket bytes: up %d down %d, want up 100-200 kB and down > 400 kB", ev.BytesUp, ev.BytesDn)
	}
	if ev.URL != "https://api.test/ws?key=REDACTED" {
		t.Errorf("websocket URL: got %q", ev.URL)
	}
}

// heapWatch samples the live heap until stopped and reports the peak above
// the starting point.
func heapWatch() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
					peak.Store(m.HeapAlloc - base)
				}
			}
		}
	}()
	return func() uint64 { close(done); <-finished; return peak.Load() }
}

func TestStreaming100MB(t *testing.T) {
	size := int64(100 << 20)
	if testing.Short() {
		size = 10 << 20
	}
	const heapLimit = 40 << 20
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/download":
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			io.Copy(w, &mitmtest.PatternReader{N: size})
		case "/upload":
			n, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprint(w, n)
		}
	}))
	for _, h2 := range []bool{false, true} {
		c := &http.Client{Transport: v.GuestTransport(h2)}
		proto := map[bool]string{false: "http1", true: "h2"}[h2]
		t.Run("download "+proto, func(t *testing.T) {
			stop := heapWatch()
			resp, err := c.Get("https://api.test/download")
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			peak := stop()
			if err != nil || n != size {
				t.Fatalf("downloaded %d bytes (err %v), want %d", n, err, size)
			}
			if peak > heapLimit {
				t.Errorf("heap grew by %d MB during a %d MB download, want < %d MB", peak>>20, size>>20, heapLimit>>20)
			}
			t.Logf("heap peak +%d kB", peak>>10)
		})
		t.Run("upload "+proto, func(t *testing.T) {
			stop := heapWatch()
			req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://api.test/upload", &mitmtest.PatternReader{N: size})
			req.ContentLength = -1 // chunked: the proxy cannot know the size either
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			peak := stop()
			if string(body) != strconv.FormatInt(size, 10) {
				t.Fatalf("upstream received %q bytes, want %d", body, size)
			}
			if peak > heapLimit {
				t.Errorf("heap grew by %d MB during a %d MB upload, want < %d MB", peak>>20, size>>20, heapLimit>>20)
			}
			t.Logf("heap peak +%d kB", peak>>10)
		})
	}
	ev := v.Events.Wait(t, "upload event", func(e egress.Event) bool { return e.Kind == "request" && e.Method == "POST" })
	if ev.BytesUp != size {
		t.Errorf("upload event bytes_up: got %d, want %d", ev.BytesUp, size)
	}
}

func TestSplice(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules, func(c *mitm.EngineConfig) { c.ServerFirstWait = 50 * time.Millisecond })
	addr := mitmtest.ServerFirstEcho(t)
	v.AddServer("ssh.test", 22, addr)
	v.AddServer("opaque.test", 7000, addr)

	t.Run("server speaks first", func(t *testing.T) {
		conn := v.GuestConn("ssh.test", 22)
		defer conn.Close()
		mitmtest.TalkServerFirst(t, conn)
		ev := v.Events.Wait(t, "splice connect", func(e egress.Event) bool { return e.Kind == "connect" && e.Name == "ssh.test" })
		if ev.Decision != "allow" || !strings.Contains(ev.Reason, "spliced") || ev.BytesUp != 5 || ev.BytesDn != 14+5 {
			t.Errorf("splice event: %+v", ev)
		}
	})
	t.Run("client speaks first, not TLS or HTTP", func(t *testing.T) {
		conn := v.GuestConn("opaque.test", 7000)
		defer conn.Close()
		conn.Write([]byte{0, 1, 2, 3})
		buf := make([]byte, 14+4)
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(buf, []byte{0, 1, 2, 3}) {
			t.Errorf("got %q", buf)
		}
	})
	t.Run("opaque bytes on 443 refused", func(t *testing.T) {
		conn := v.GuestConn("api.test", 443)
		defer conn.Close()
		conn.Write([]byte("SSH-2.0-sneaky\r\n"))
		if n, _ := io.Copy(io.Discard, conn); n != 0 {
			t.Errorf("got %d bytes back, want none", n)
		}
		v.Events.Wait(t, "refused opaque", func(e egress.Event) bool {
			return e.Kind == "connect" && e.Decision == "deny" && strings.Contains(e.Reason, "neither TLS nor HTTP")
		})
	})
}

func TestUnadmittedTargetRefused(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	tests := []struct {
		name string
		t    netstack.Target
	}{
		{"denied decision", netstack.Target{Name: "evil.test", Port: 443, Decision: egress.Decision{Reason: "no rule"}}},
		{"no name", netstack.Target{Port: 443, Decision: egress.Decision{Allow: true}}},
		{"no port", netstack.Target{Name: "api.test", Decision: egress.Decision{Allow: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, s := nftest.TCPPair(t)
			defer c.Close()
			go v.Eng.HandleConn(t.Context(), s, tt.t)
			if n, _ := io.Copy(io.Discard, c); n != 0 {
				t.Errorf("got %d bytes, want the connection closed", n)
			}
		})
	}
}

func TestEngineNeedsCA(t *testing.T) {
	t.Parallel()
	if _, err := mitm.NewGoEngine(mitm.EngineConfig{}); err == nil {
		t.Error("NewGoEngine without a CA: got nil error")
	}
}

func TestContextCancelClosesConnection(t *testing.T) {
	t.Parallel()
	v, _ := mitmtest.NewGo(t, mitmtest.Rules)
	c, s := nftest.TCPPair(t)
	defer c.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		v.Eng.HandleConn(ctx, s, netstack.Target{Name: "api.test", Port: 443, Decision: v.Policy.Decide("api.test", 443)})
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("HandleConn did not return after its context was cancelled")
	}
}
