package netfilter

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestExplicitProxyRequestTracked: a plain http:// request through the
// explicit proxy (a long response, a WebSocket) is an existing connection
// to its name too: a live deny must be able to close it, as it closes
// CONNECT tunnels.
func TestExplicitProxyRequestTracked(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	tracked := map[string][]net.Conn{}
	v := newTestEnv(t, "stream.example\n", func(c *EngineConfig) {
		c.Track = func(tg Target, conn net.Conn) func() {
			mu.Lock()
			defer mu.Unlock()
			tracked[tg.Name] = append(tracked[tg.Name], conn)
			return func() {}
		}
	})
	release := make(chan struct{})
	defer close(release)
	v.upstreamPlain("stream.example", 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select { // a stream that goes on until the deny ends it
		case <-release:
		case <-r.Context().Done():
		}
	}))
	proxy := v.proxyListener()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://stream.example/events HTTP/1.1\r\nHost: stream.example\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.Contains(line, "first") {
		t.Fatalf("stream: %q", line)
	}
	mu.Lock()
	conns := tracked["stream.example"]
	mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("the explicit proxy's request to stream.example is not tracked: a live deny cannot close it")
	}
	for _, tc := range conns {
		tc.Close() // what a live deny does
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the stream goes on after its tracked connection was closed")
		}
	}
}
