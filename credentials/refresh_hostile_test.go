package credentials

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// hostileEndpoint serves h as k's token endpoint on loopback TLS and
// returns a client that reaches it.
func hostileEndpoint(t *testing.T, k LoginKind, h http.HandlerFunc) *http.Client {
	cfg, pool := loopbackTLS(t, k.TokenHost)
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = cfg
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}}
}

// TestRefreshHostileEndpoint (issue 21, adversarial): a token endpoint
// (or whatever answers as one) that sends garbage gets an error, never a
// login the host would store: an expiry in the past or centuries away
// (the host would refresh on every request, or never), a token with
// control characters, HTML, an endless body, a body that never ends; and
// no error quotes what the endpoint sent.
func TestRefreshHostileEndpoint(t *testing.T) {
	t.Parallel()
	claude, _ := LookupLogin("claude")
	codex, _ := LookupLogin("codex")
	access := randTok("sk-ant-oat01-", 95)
	echo := "ECHO" + randTok("", 40)
	ok := func(extra string) string {
		return `{"access_token":"` + access + `","refresh_token":"` + randTok("sk-ant-ort01-", 95) + `"` + extra + `}`
	}
	for _, c := range []struct {
		name string
		kind LoginKind
		body func(w http.ResponseWriter, r *http.Request)
	}{
		{"huge expires_in", claude, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, ok(`,"expires_in":10000000000`)) }},
		{"negative expires_in", claude, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, ok(`,"expires_in":-5`)) }},
		{"huge refresh_token_expires_in", claude, func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, ok(`,"expires_in":3600,"refresh_token_expires_in":10000000000`))
		}},
		{"a JWT access token expiring in year 10^300", codex, func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `{"access_token":%q,"refresh_token":%q}`, fakeJWT(t, map[string]any{"exp": 1e300}), randTok("rt_", 60))
		}},
		{"control characters", claude, func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, `{"access_token":"`+access+`\u001b[2J`+echo+`","expires_in":3600}`)
		}},
		{"HTML", claude, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "<html>"+echo+"</html>") }},
		{"endless body", claude, func(w http.ResponseWriter, r *http.Request) {
			b := []byte(strings.Repeat(" ", 64<<10))
			io.WriteString(w, `{"access_token":"`+access+`","pad":"`)
			for r.Context().Err() == nil {
				if _, err := w.Write(b); err != nil {
					return
				}
			}
		}},
		{"a body that never ends", claude, func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"access_token":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}},
		{"server error echoing", claude, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(500)
			io.WriteString(w, echo)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			refresh := randTok("sk-ant-ort01-", 95)
			var l *Login
			if c.kind.Name == "codex" {
				l, _ = ParseLogin(codex, codexDoc(t, fakeJWT(t, codexClaims(time.Now())), randTok("rt_", 60)), "test")
			} else {
				l, _ = ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), refresh, time.Now()), "test")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			n, err := (&RefreshClient{HTTP: hostileEndpoint(t, c.kind, c.body)}).Refresh(ctx, l)
			if err == nil {
				t.Fatalf("refreshed to a login expiring %v (refresh token %v)", n.Expires, n.RefreshExpires)
			}
			if strings.Contains(err.Error(), echo) || strings.ContainsAny(err.Error(), "\x1b\n") {
				t.Errorf("the error quotes the endpoint: %q", err)
			}
		})
	}
}

// TestLoginSessionRefreshBackoff (issue 21, adversarial): when the host's
// refresh fails, the guest's next requests do not each send another one
// (a guest looping on API calls would make the host hammer the vendor,
// each attempt up to 30 s with the login locked): they get the failure
// at once until refreshRetry has passed.
func TestLoginSessionRefreshBackoff(t *testing.T) {
	t.Parallel()
	claude, _ := LookupLogin("claude")
	var mu sync.Mutex
	calls := 0
	hc := hostileEndpoint(t, claude, func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
	})
	now := time.Now()
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	l, _ := ParseLogin(claude, claudeDoc(randTok("sk-ant-oat01-", 95), randTok("sk-ant-ort01-", 95), now.Add(time.Minute)), "test")
	s, err := NewLoginSession(t.TempDir(), l, &RefreshClient{HTTP: hc, Now: clock}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := s.AccessToken(t.Context()); !errors.Is(err, ErrLoginUnusable) {
			t.Fatalf("a failed refresh: %v", err)
		}
	}
	mu.Lock()
	got := calls
	now = now.Add(refreshRetry + time.Second)
	mu.Unlock()
	if got != 1 {
		t.Errorf("20 requests after a failed refresh sent %d refreshes, want 1", got)
	}
	s.AccessToken(t.Context())
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("after the back-off, %d refreshes in all, want 2", calls)
	}
}
