package mitm_test

import (
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
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
