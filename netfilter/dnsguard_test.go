package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestProxyWildcardExfiltrationBounded: the explicit proxy resolves a
// CONNECT target through the host's resolver too, so the same guard bounds
// new names under a wildcard there.
func TestProxyWildcardExfiltrationBounded(t *testing.T) {
	rs, err := egress.ParseRules(strings.NewReader(mitmtest.Rules), "test")
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	limited := egress.LimitWildcardsClock(egress.NewPolicy(rs), func() time.Time { return clock })
	var mu sync.Mutex
	dialled := map[string]bool{}
	v := newTestEnv(t, mitmtest.Rules, func(c *mitm.EngineConfig) {
		c.Policy = limited
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialled[addr] = true
			mu.Unlock()
			return nil, errors.New("no upstream in this test")
		}
	})
	proxy := v.ProxyListener()
	connect := func(name string) int {
		t.Helper()
		conn, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "CONNECT %s:443 HTTP/1.1\r\nHost: %[1]s:443\r\n\r\n", name)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("CONNECT %s: %v", name, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const flood = 200
	refused := 0
	for i := range flood {
		if connect(fmt.Sprintf("x%04d.wild.test", i)) == http.StatusForbidden {
			refused++
		}
	}
	if refused != flood-egress.WildcardBurst {
		t.Errorf("refused %d of %d new names, want %d", refused, flood, flood-egress.WildcardBurst)
	}
	if connect("x0001.wild.test") == http.StatusForbidden {
		t.Error("a name admitted before the flood was refused after it")
	}
	if connect("api.test") == http.StatusForbidden {
		t.Error("an exact rule was limited")
	}
	// Dials happen after the CONNECT's 200, once the guest speaks: none
	// of the refused names may ever be dialled.
	mu.Lock()
	defer mu.Unlock()
	for addr := range dialled {
		var n int
		if _, err := fmt.Sscanf(addr, "x%04d.wild.test:443", &n); err == nil && n >= egress.WildcardBurst {
			t.Errorf("refused name dialled: %s", addr)
		}
	}
}
