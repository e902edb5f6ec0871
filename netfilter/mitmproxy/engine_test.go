package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/keys"
)

func mitmTestConfig(t *testing.T) Config {
	dir := t.TempDir()
	ca, err := keys.EnsureCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	return Config{EngineConfig: mitm.EngineConfig{CA: ca, NoSystemRoots: true, ExtraRoots: []*x509.Certificate{ca.Certificate()}},
		CAKeyFile: filepath.Join(dir, "ca", keys.CAKeyFile), RuntimeDir: dir}
}

func TestMitmdumpMissing(t *testing.T) {
	t.Parallel()
	cfg := mitmTestConfig(t)
	cfg.Mitmdump = filepath.Join(t.TempDir(), "mitmdump")
	_, err := NewEngine(t.Context(), cfg)
	if !errors.Is(err, ErrMitmdump) || !strings.Contains(err.Error(), "not found") || !strings.Contains(err.Error(), "8.1 or later") {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("not one line: %q", err)
	}
}

func fakeMitmdump(t *testing.T, version string) string {
	p := filepath.Join(t.TempDir(), "mitmdump")
	script := fmt.Sprintf("#!/bin/sh\necho 'Mitmproxy: %s'\necho 'Python:    3.9.2'\n", version)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMitmdumpTooOld(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		version string
		ok      bool
	}{{"7.0.4", false}, {"8.0.0", false}, {"8.1.1", true}, {"10.2.0", true}} {
		v, err := MitmdumpVersion(t.Context(), fakeMitmdump(t, tt.version))
		if v != tt.version {
			t.Errorf("%s: version read as %q", tt.version, v)
		}
		if tt.ok != (err == nil) {
			t.Fatalf("%s: got %v", tt.version, err)
		}
		if err != nil && !strings.Contains(err.Error(), "is version "+tt.version+"; vibedom needs 8.1 or later") {
			t.Errorf("%s: error does not name the versions: %v", tt.version, err)
		}
	}
	cfg := mitmTestConfig(t)
	cfg.Mitmdump = fakeMitmdump(t, "7.0.4")
	if _, err := NewEngine(t.Context(), cfg); !errors.Is(err, ErrMitmdump) || !strings.Contains(err.Error(), "7.0.4") {
		t.Fatalf("engine started with mitmdump 7.0.4: %v", err)
	}
}

func TestMitmdumpPortTaken(t *testing.T) {
	t.Parallel()
	mitmdumpProbe.Skip(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := mitmTestConfig(t)
	cfg.Port = ln.Addr().(*net.TCPAddr).Port
	_, err = NewEngine(t.Context(), cfg)
	if !errors.Is(err, ErrMitmdump) || !strings.Contains(err.Error(), "the port is taken") {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("not one line: %q", err)
	}
	if ents, _ := filepath.Glob(filepath.Join(cfg.RuntimeDir, "vibedom-mitm-*")); len(ents) != 0 {
		t.Errorf("runtime folder left behind: %v", ents)
	}
}

// TestMitmdumpPrivate: the runtime folder, the CA key, the control socket
// and the config (which holds the secrets) are the user's alone; mitmdump's
// port and vibedom's upstream listener refuse anyone without the session's
// secret; the secrets are not on mitmdump's command line.
func TestMitmdumpPrivate(t *testing.T) {
	t.Parallel()
	v, m := newEnv(t, mitmtest.Rules, nil)
	for path, want := range map[string]os.FileMode{
		m.dir: 0o700, filepath.Join(m.dir, "conf"): 0o700, filepath.Join(m.dir, "conf", "mitmproxy-ca.pem"): 0o600,
		filepath.Join(m.dir, "conf", "config.yaml"): 0o600, filepath.Join(m.dir, "ctl.sock"): 0o600,
		filepath.Join(m.dir, "vibedom_addon.py"): 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", path, fi.Mode().Perm(), want)
		}
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", m.cmd.Process.Pid))
	if err == nil && (strings.Contains(string(cmdline), "proxyauth") || strings.Contains(string(cmdline), "vibedom:")) {
		t.Errorf("a secret is on mitmdump's command line: %q", cmdline)
	}
	var hits atomic.Int64
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	n407 := 0
	for _, addr := range []string{fmt.Sprintf("127.0.0.1:%d", m.port), m.upLn.Addr().String()} {
		for _, auth := range []string{"", "Proxy-Authorization: Basic dmliZWRvbTp3cm9uZw==\r\n"} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n%s\r\n", auth)
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "CONNECT"})
			c.Close()
			if err != nil {
				continue // closed without an answer: refused too
			}
			if resp.StatusCode == http.StatusProxyAuthRequired {
				n407++
			} else {
				t.Errorf("%s with %q: status %d, want 407", addr, auth, resp.StatusCode)
			}
		}
	}
	if n407 != 4 {
		t.Errorf("%d of 4 unauthenticated CONNECTs got 407", n407)
	}
	if hits.Load() != 0 {
		t.Errorf("the upstream was reached %d times without the session's secret", hits.Load())
	}
}

// headerFilter sets a header the way a filter could, with a value that is
// not Latin-1 (the addon cannot put it on the wire).
type headerFilter struct{ value string }

func (f headerFilter) FilterRequest(_ context.Context, _ mitm.Destination, r *http.Request) (func() []egress.Finding, error) {
	r.Header.Set("X-Filtered", f.value)
	return func() []egress.Finding { return nil }, nil
}

// TestMitmproxyAddonFailsClosed: when the addon cannot apply vibedom's
// answer, the request is refused, never sent on as the guest wrote it.
func TestMitmproxyAddonFailsClosed(t *testing.T) {
	t.Parallel()
	v, _ := newEnv(t, mitmtest.Rules, nil, func(c *mitm.EngineConfig) { c.Filter = headerFilter{"snow \u2603"} })
	var hits atomic.Int64
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	c := &http.Client{Transport: v.GuestTransport(false)}
	resp, body := mitmtest.GetBody(t, c, "https://api.test/x")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "nothing was sent") {
		t.Errorf("got %d %q, want 502 from the addon", resp.StatusCode, body)
	}
	if hits.Load() != 0 {
		t.Error("the request reached the upstream")
	}
}

// TestMitmproxyControlSocketGone: when the addon cannot reach vibedom any
// more, every request is refused and nothing reaches the upstream.
func TestMitmproxyControlSocketGone(t *testing.T) {
	t.Parallel()
	v, m := newEnv(t, mitmtest.Rules, nil)
	var hits atomic.Int64
	v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	c := &http.Client{Transport: v.GuestTransport(false)}
	if resp, _ := mitmtest.GetBody(t, c, "https://api.test/before"); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	m.ctlLn.Close()
	m.mu.Lock()
	for cc := range m.ctls {
		cc.Close()
	}
	m.mu.Unlock()
	for _, h2 := range []bool{false, true} {
		c := &http.Client{Transport: v.GuestTransport(h2)}
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/after", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Errorf("h2=%v: a request passed without vibedom's answer", h2)
			}
		}
	}
	if hits.Load() != 1 {
		t.Errorf("upstream hits %d, want 1 (before only)", hits.Load())
	}
}

// TestMitmdumpEndsWithVibedom: when vibedom's end of the control socket
// goes away (as when vibedom is killed), mitmdump stops by itself.
func TestMitmdumpEndsWithVibedom(t *testing.T) {
	t.Parallel()
	_, m := newEnv(t, mitmtest.Rules, nil)
	m.ctlLn.Close()
	m.mu.Lock()
	for cc := range m.ctls {
		cc.Close()
	}
	m.mu.Unlock()
	select {
	case <-m.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("mitmdump kept running 60s without vibedom")
	}
}
