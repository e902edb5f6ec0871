package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// secretScrubber stands in for the DLP: it rewrites the X-Secret header.
type secretScrubber struct{}

func (secretScrubber) FilterRequest(_ context.Context, _ mitm.Destination, r *http.Request) (func() []egress.Finding, error) {
	if r.Header.Get("X-Secret") != "" {
		r.Header.Set("X-Secret", "[REDACTED]")
	}
	return func() []egress.Finding { return nil }, nil
}

// liveView is a mitmproxy engine running mitmweb, an upstream counting
// the requests it gets, and a client of the web UI's REST API.
type liveView struct {
	v    *mitmtest.Env
	m    *Engine
	hits atomic.Int64
	web  *http.Client
	xsrf string
}

func newLiveView(t *testing.T, openUI bool, mopts ...func(*Config)) *liveView {
	mitmwebProbe.Skip(t)
	lv := &liveView{}
	lv.v, lv.m = newEnv(t, mitmtest.Rules, func(c *Config) {
		c.LiveView, c.testOpenUI = true, openUI
		for _, o := range mopts {
			o(c)
		}
	}, func(c *mitm.EngineConfig) {
		c.Filter = secretScrubber{}
		if os.Getenv("DBG") != "" {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
	})
	lv.v.UpstreamTLS("api.test", 443, lv.v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lv.hits.Add(1)
		mitmtest.EchoInfo(w, r)
	}))
	jar, _ := cookiejar.New(nil)
	lv.web = &http.Client{Jar: jar, Timeout: 30 * time.Second}
	// mitmweb's XSRF cookie, as any local program can get it.
	resp, err := lv.web.Get(lv.m.WebURL())
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "_xsrf" {
			lv.xsrf = c.Value
		}
	}
	if lv.xsrf == "" {
		t.Fatal("mitmweb set no _xsrf cookie")
	}
	return lv
}

// guestGet sends one request from the guest, with a secret the filter
// scrubs.
func (lv *liveView) guestGet(t *testing.T, path string) {
	t.Helper()
	c := &http.Client{Transport: lv.v.GuestTransport(false)}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test"+path, nil)
	req.Header.Set("X-Secret", "hunter2")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("guest request %s: %d", path, resp.StatusCode)
	}
}

func (lv *liveView) api(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	if method != "GET" && lv.m.dead.Load() {
		t.Fatalf("%s %s: mitmweb is gone", method, path)
	}
	base, _, _ := strings.Cut(lv.m.WebURL(), "?") // the token is in the cookie jar
	req, _ := http.NewRequestWithContext(t.Context(), method, strings.TrimSuffix(base, "/")+path, strings.NewReader(body))
	req.Header.Set("X-XSRFToken", lv.xsrf)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := lv.web.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Status + " " + string(b)
}

type webFlow struct {
	ID      string `json:"id"`
	Marked  string `json:"marked"`
	Request struct {
		Path    string      `json:"path"`
		Headers [][2]string `json:"headers"`
	} `json:"request"`
	Error *struct {
		Msg string `json:"msg"`
	} `json:"error"`
}

// flows lists the flows the web UI shows.
func (lv *liveView) flows(t *testing.T) []webFlow {
	t.Helper()
	code, body := lv.api(t, "GET", "/flows", "")
	if code != 200 {
		t.Fatalf("GET /flows: %s", body)
	}
	var fs []webFlow
	if err := json.Unmarshal([]byte(body[strings.Index(body, "["):]), &fs); err != nil {
		t.Fatalf("GET /flows: %v", err)
	}
	return fs
}

// waitFlow waits until the web UI lists a flow for path whose request has
// been sent (it then carries vibedom's mark).
func (lv *liveView) waitFlow(t *testing.T, path string) webFlow {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, f := range lv.flows(t) {
			if f.Request.Path == path {
				return f
			}
		}
	}
	t.Fatalf("the web UI never listed %s", path)
	return webFlow{}
}

// TestInspectLiveView: with --inspect, mitmweb shows the request as sent
// upstream (after the filter), and its REST API refuses every write:
// replay, duplicate, edit, resume, kill, delete, clear, upload, options,
// commands. Nothing more reaches the upstream; the session goes on.
func TestInspectLiveView(t *testing.T) {
	t.Parallel()
	lv := newLiveView(t, false)
	if !strings.HasPrefix(lv.m.WebURL(), "http://127.0.0.1:") {
		t.Fatalf("web UI at %q, want loopback", lv.m.WebURL())
	}
	lv.guestGet(t, "/seen?q=1")
	f := lv.waitFlow(t, "/seen?q=1")
	for _, h := range f.Request.Headers {
		if strings.EqualFold(h[0], "X-Secret") && h[1] != "[REDACTED]" {
			t.Errorf("the live view shows X-Secret %q, not what was sent upstream", h[1])
		}
	}
	// A refused request (Host differs from the admitted name) is not
	// listed, and even by its id (a UUID the UI never shows) the UI has
	// nothing of what the guest wrote.
	c := &http.Client{Transport: lv.v.GuestTransport(false)}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://api.test/refused?token=hunter2", strings.NewReader("pw=hunter2"))
	req.Host = "other.test"
	req.Header.Set("X-Secret", "hunter2")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("Host mismatch: %d, want 421", resp.StatusCode)
	}
	refused := lv.m.lastRefused.Load()
	if refused == nil {
		t.Fatal("the engine refused nothing")
	}
	for _, f := range lv.flows(t) {
		if f.ID == *refused {
			t.Error("the live view lists a refused request")
		}
	}
	code, body := lv.api(t, "GET", "/flows/"+*refused+"/request/content.data", "")
	if strings.Contains(body, "hunter2") {
		t.Errorf("the refused request's body is in the live view: %d %s", code, egress.Shorten(body))
	}
	code, body = lv.api(t, "GET", "/flows/dump", "")
	if code != 200 || strings.Contains(body, "hunter2") || strings.Contains(body, "/refused") {
		t.Errorf("GET /flows/dump: %d, or it holds the refused request", code)
	}
	id := f.ID
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/flows/" + id + "/replay", ""},
		{"POST", "/flows/" + id + "/duplicate", ""},
		{"PUT", "/flows/" + id, `{"request": {"path": "/edited"}}`},
		{"POST", "/flows/" + id + "/request/content.data", ""},
		{"POST", "/flows/" + id + "/resume", ""},
		{"POST", "/flows/" + id + "/revert", ""},
		{"POST", "/flows/" + id + "/kill", ""},
		{"DELETE", "/flows/" + id, ""},
		{"POST", "/flows/resume", ""},
		{"POST", "/flows/dump", ""},
		{"POST", "/clear", ""},
		{"PUT", "/options", `{"intercept": "~q"}`},
		{"PUT", "/options", `{"scripts": []}`},
		{"POST", "/options/save", ""},
		{"POST", "/commands/replay.client", `{"arguments": ["@all"]}`},
		{"POST", "/commands/set", `{"arguments": ["intercept", "~q"]}`},
	} {
		code, body := lv.api(t, w.method, w.path, w.body)
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("%s %s: %s, want 403 read-only", w.method, w.path, egress.Shorten(body))
		}
	}
	code, body = lv.api(t, "GET", "/options", "")
	if code != 200 || strings.Contains(body, "vibedom:") || !strings.Contains(body, "(hidden by vibedom)") {
		t.Errorf("GET /options shows the session's secrets: %s", egress.Shorten(body))
	}
	if n := lv.hits.Load(); n != 1 {
		t.Errorf("the upstream got %d requests, want 1", n)
	}
	lv.guestGet(t, "/after")
	if n := lv.hits.Load(); n != 2 {
		t.Errorf("after the UI writes the upstream got %d requests, want 2", n)
	}
}

// TestInspectGuardsBehindUI: with the web UI's write endpoints left open
// (a test hook), what they do still sends nothing upstream: replays and
// replayed duplicates and edits are killed by the addon, option changes
// (intercept) are rolled back; unloading the addon (scripts) stops mitmweb,
// and the session then refuses every connection.
func TestInspectGuardsBehindUI(t *testing.T) {
	t.Parallel()
	lv := newLiveView(t, true)
	lv.guestGet(t, "/seen")
	id := lv.waitFlow(t, "/seen").ID
	for _, w := range []struct {
		method, path, body string
		codes              []int
	}{
		{"PUT", "/options", `{"intercept": "~q"}`, []int{400}},
		{"POST", "/commands/set", `{"arguments": ["intercept", "~q"]}`, []int{200, 400, 500}},
		{"POST", "/flows/" + id + "/replay", "", []int{200}},
		// mitmweb 8.1 cannot copy a flow whose upstream is a proxy (500).
		{"POST", "/flows/" + id + "/duplicate", "", []int{200, 500}},
		{"PUT", "/flows/" + id, `{"request": {"path": "/edited"}}`, []int{200}},
		{"POST", "/flows/" + id + "/replay", "", []int{200, 400}},
		{"POST", "/commands/replay.client", `{"arguments": ["@all"]}`, []int{200, 400}},
	} {
		code, body := lv.api(t, w.method, w.path, w.body)
		ok := false
		for _, c := range w.codes {
			ok = ok || c == code
		}
		if !ok {
			t.Errorf("%s %s: %s, want one of %v", w.method, w.path, egress.Shorten(body), w.codes)
		}
	}
	if code, body := lv.api(t, "GET", "/options", ""); code != 200 || !strings.Contains(body, `"intercept": {`) ||
		strings.Contains(body, `"value": "~q"`) {
		t.Errorf("an option changed from the UI: %s", egress.Shorten(body))
	}
	// The replays ran (each ends killed) before the next guest request
	// goes through; then the count is final.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pending := 0
		for _, f := range lv.flows(t) {
			if f.Error == nil && f.Request.Path != "/seen" {
				pending++
			}
		}
		if pending == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	killed := 0
	for _, f := range lv.flows(t) {
		if f.Error != nil {
			killed++
		}
		t.Logf("flow %s %s error=%v", f.ID, f.Request.Path, f.Error)
	}
	if killed == 0 {
		t.Error("no replay was killed: did the UI replay anything?")
	}
	lv.guestGet(t, "/after")
	lv.waitFlow(t, "/after")
	if n := lv.hits.Load(); n != 2 {
		t.Errorf("the upstream got %d requests, want 2 (the guest's only)", n)
	}
	// Without the addon nothing may pass: mitmweb stops, fail closed.
	lv.api(t, "PUT", "/options", `{"scripts": []}`)
	select {
	case <-lv.m.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("mitmweb kept running without vibedom's addon")
	}
	c := &http.Client{Transport: lv.v.GuestTransport(false)}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/late", nil)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("a request passed after the addon was unloaded: %d", resp.StatusCode)
	}
	if n := lv.hits.Load(); n != 2 {
		t.Errorf("the upstream got %d requests, want 2", n)
	}
}

// TestInspectViewLimit: the live view keeps the newest ViewLimit finished
// requests, so mitmweb's memory stays bounded in a long session.
func TestInspectViewLimit(t *testing.T) {
	t.Parallel()
	lv := newLiveView(t, false, func(c *Config) { c.ViewLimit = 2 })
	for i := range 5 {
		lv.guestGet(t, fmt.Sprintf("/r%d", i))
	}
	lv.waitFlow(t, "/r4")
	var paths []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		paths = paths[:0]
		for _, f := range lv.flows(t) {
			paths = append(paths, f.Request.Path)
		}
		if len(paths) <= 2 {
			break
		}
	}
	if len(paths) != 2 || paths[0] != "/r3" || paths[1] != "/r4" {
		t.Errorf("the live view lists %v, want [/r3 /r4]", paths)
	}
}

// TestMitmproxyRefusesReplays: the engine answers each request of an
// admitted connection once; a second question about the same flow, or one
// the addon reports as a replay, is refused.
func TestMitmproxyRefusesReplays(t *testing.T) {
	t.Parallel()
	sink := &mitmtest.Sink{}
	c := &mitmConn{t: netstack.Target{Name: "api.test", Port: 80, Decision: egress.Decision{Allow: true}},
		flows: map[string]struct{}{}, seen: map[string]struct{}{}}
	e := &Engine{cfg: Config{BodyLimit: 1 << 20}, events: sink, filter: mitm.IdentityFilter{},
		conns: map[string]*mitmConn{"127.0.0.1:5000": c}, flows: map[string]*mitmFlow{}}
	q := func(id string, replay bool) string {
		return e.answer(&ctlMsg{Op: "request", Peer: "127.0.0.1:5000", ID: id, Scheme: "http", Method: "GET",
			Host: "api.test", DHost: "api.test", DPort: 80, Path: "/", Proto: "HTTP/1.1", Replay: replay}).Action
	}
	for _, tt := range []struct {
		name, id string
		replay   bool
		want     string
	}{
		{"first", "f1", false, "allow"},
		{"same flow again", "f1", false, "deny"},
		{"replayed duplicate", "f2", true, "deny"},
		{"no flow id", "", false, "deny"},
		{"another request", "f3", false, "allow"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := q(tt.id, tt.replay); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestInspectMitmwebMissing: --inspect without mitmweb is a one-line error
// that says what to do.
func TestInspectMitmwebMissing(t *testing.T) {
	t.Parallel()
	cfg := mitmTestConfig(t)
	cfg.Mitmdump = fakeMitmdump(t, "8.1.1")
	cfg.LiveView = true
	_, err := NewEngine(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), "mitmweb not found") || !strings.Contains(err.Error(), "--inspect") ||
		strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v", err)
	}
}

// TestInspectBrowser: a real browser (headless Chromium) opens the live
// view of a session that made one request and sees that request listed.
func TestInspectBrowser(t *testing.T) {
	t.Parallel()
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		t.Skip("live view not tested in a browser: no chromium on PATH (apt-get install chromium)")
	}
	lv := newLiveView(t, false)
	path := fmt.Sprintf("/inspect-me-%d", time.Now().UnixNano())
	lv.guestGet(t, path)
	lv.waitFlow(t, path)
	home := t.TempDir()
	var dom string
	for try := 0; try < 2; try++ {
		ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
		cmd := exec.CommandContext(ctx, browser, "--headless=new", "--no-sandbox", "--disable-gpu",
			"--disable-dev-shm-usage", "--no-first-run", "--user-data-dir="+home+"/profile",
			"--virtual-time-budget=5000", "--dump-dom", lv.m.WebURL())
		cmd.Env = append(os.Environ(), "HOME="+home)
		out, err := cmd.Output()
		cancel()
		dom = string(out)
		if strings.Contains(dom, path) {
			return
		}
		if err != nil {
			t.Logf("chromium: %v", err)
		}
	}
	if len(dom) > 2000 {
		dom = dom[:2000]
	}
	t.Errorf("the page does not list %s; DOM: %s", path, dom)
}
