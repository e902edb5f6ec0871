package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/klauspost/compress/gzip"

	"github.com/vibedom/vibedom/dlp"
)

// Fixtures built at run time (the project's own secrets scan stays quiet).
var (
	dlpSecret = strings.Join([]string{"hQ7v", "Zp2LxK9wR4tYq"}, "")
	dlpAWS    = strings.Join([]string{"AKIA", "Z7QX3M4P2KD9WLNB"}, "")
)

const dlpRules = "api.anthropic.com\nregistry.example.net\ngit.corp.internal\n"

// seen records what an upstream received.
type seen struct {
	mu   sync.Mutex
	reqs []seenReq
}

type seenReq struct {
	url, body string
	header    http.Header
	trailer   http.Header // as received once the body has ended
	proto     string
	length    int64
}

func (s *seen) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.reqs = append(s.reqs, seenReq{url: r.URL.RequestURI(), body: string(b), header: r.Header.Clone(), trailer: r.Trailer.Clone(),
			proto: r.Proto, length: r.ContentLength})
		s.mu.Unlock()
		io.WriteString(w, "ok")
	})
}

func (s *seen) last(t *testing.T) seenReq {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		t.Fatal("nothing reached the upstream")
	}
	return s.reqs[len(s.reqs)-1]
}

type dlpEnv struct {
	*testEnv
	up    map[string]*seen
	id    *age.X25519Identity
	audit string
}

func newDLPEnv(t *testing.T, limit int64) *dlpEnv {
	return newDLPEnvEngine(t, "go", limit)
}

func newDLPEnvEngine(t *testing.T, kind string, limit int64) *dlpEnv {
	if kind == "mitmproxy" {
		mitmdumpProbe.Skip(t)
	}
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	auditPath := filepath.Join(t.TempDir(), dlp.AuditFile)
	audit, err := dlp.CreateAuditLog(auditPath, id.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { audit.Close() })
	e, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: dlpSecret, Source: ".env:1 API_KEY"}}})
	if err != nil {
		t.Fatal(err)
	}
	f := &DLPFilter{Engine: e, Audit: audit, BufferLimit: limit}
	v := &dlpEnv{testEnv: newEngineEnv(t, kind, dlpRules, func(c *mitm.EngineConfig) { c.Filter = f }), up: map[string]*seen{}, id: id, audit: auditPath}
	for _, name := range []string{"api.anthropic.com", "registry.example.net", "git.corp.internal"} {
		v.up[name] = &seen{}
		v.UpstreamTLS(name, 443, v.UpCA, v.up[name].handler())
	}
	return v
}

func (v *dlpEnv) auditValues(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(v.audit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vals []string
	if err := dlp.ReadAuditLog(f, func(r dlp.AuditRecord) error { vals = append(vals, r.Category+"="+r.Value); return nil }, v.id); err != nil {
		t.Fatal(err)
	}
	return vals
}

func TestDLPFilterJSONBody(t *testing.T) {
	t.Parallel()
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1", true: "h2"}[h2], func(t *testing.T) {
			v := newDLPEnv(t, 0)
			c := &http.Client{Transport: v.GuestTransport(h2)}
			body := `{"messages":[{"role":"user","content":"key ` + dlpSecret + ` aws ` + dlpAWS + ` mail bob@corp.io"}]}`
			resp, err := c.Post("https://api.anthropic.com/v1/messages", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := v.up["api.anthropic.com"].last(t)
			want := `{"messages":[{"role":"user","content":"key [REDACTED:SECRET] aws [REDACTED:CLOUD_KEY] mail [REDACTED:EMAIL]"}]}`
			if got.body != want || !json.Valid([]byte(got.body)) {
				t.Errorf("upstream got\n%s\nwant\n%s", got.body, want)
			}
			if got.length != int64(len(want)) {
				t.Errorf("Content-Length %d, want %d", got.length, len(want))
			}
			ev := v.Events.Wait(t, "scrub", mitmtest.IsKind("request", "scrub"))
			if len(ev.Findings) != 3 || ev.Findings[0].Category != "SECRET" || ev.Findings[0].Source != ".env:1 API_KEY" || ev.Findings[0].Prefix != dlpSecret[:4] {
				t.Errorf("findings: %+v", ev.Findings)
			}
			logs, _ := os.ReadFile(filepath.Join(v.logDir, NetworkLogFile))
			v.log.Close()
			logs, _ = os.ReadFile(filepath.Join(v.logDir, NetworkLogFile))
			alerts, _ := os.ReadFile(filepath.Join(v.logDir, AlertsLogFile))
			for _, b := range [][]byte{logs, alerts} {
				if bytes.Contains(b, []byte(dlpSecret)) || bytes.Contains(b, []byte(dlpAWS)) || bytes.Contains(b, []byte("bob@corp.io")) {
					t.Errorf("a value reached a log:\n%s", b)
				}
			}
			if !bytes.Contains(alerts, []byte(`"decision":"scrub"`)) {
				t.Errorf("alerts lack the scrub: %s", alerts)
			}
			vals := v.auditValues(t)
			if strings.Join(vals, " ") != "SECRET="+dlpSecret+" CLOUD_KEY="+dlpAWS+" EMAIL=bob@corp.io" {
				t.Errorf("audit: %v", vals)
			}
		})
	}
}

func TestDLPFilterCompressedAndStreamed(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 1024)
	c := &http.Client{Transport: v.GuestTransport(false)}

	// gzip, small: scrubbed whole, still gzip, Content-Length exact.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, `{"k":"`+dlpSecret+`"}`)
	zw.Close()
	req, _ := http.NewRequest("POST", "https://api.anthropic.com/v1/x", bytes.NewReader(gz.Bytes()))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := v.up["api.anthropic.com"].last(t)
	zr, err := gzip.NewReader(strings.NewReader(got.body))
	if err != nil {
		t.Fatalf("upstream body is not gzip: %v", err)
	}
	plain, _ := io.ReadAll(zr)
	if string(plain) != `{"k":"[REDACTED:SECRET]"}` || got.header.Get("Content-Encoding") != "gzip" || got.length != int64(len(got.body)) {
		t.Errorf("gzip body: %q, encoding %q, length %d", plain, got.header.Get("Content-Encoding"), got.length)
	}

	// Larger than the buffer limit, written in pieces that split the
	// secret: streamed (chunked) and still scrubbed.
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(strings.Repeat("padding line\n", 200) + "key " + dlpSecret[:5]))
		pw.Write([]byte(dlpSecret[5:] + " end\n" + strings.Repeat("tail line\n", 200)))
		pw.Close()
	}()
	req, _ = http.NewRequest("PUT", "https://api.anthropic.com/upload", pr)
	req.Header.Set("Content-Type", "text/plain")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got = v.up["api.anthropic.com"].last(t)
	// Streamed: upstream is told no length (chunked on HTTP/1.1, none on h2).
	if strings.Contains(got.body, dlpSecret) || !strings.Contains(got.body, "key [REDACTED:SECRET] end") || got.length != -1 {
		t.Errorf("streamed body: length %d, has placeholder %v", got.length, strings.Contains(got.body, "[REDACTED:SECRET]"))
	}
}

func TestDLPFilterURLAndHeaders(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 0)
	c := &http.Client{Transport: v.GuestTransport(false)}
	do := func(host string) seenReq {
		req, _ := http.NewRequest("GET", "https://"+host+"/pkg/bob%40corp.io?q=1&aws="+dlpAWS, nil)
		req.Header.Set("X-Note", "from bob@corp.io")
		req.Header.Set("Authorization", "Bearer "+dlpSecret)
		req.Header.Set("X-Api-Key", dlpAWS)
		req.Header.Set("X-"+dlpSecret, "1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return v.up[host].last(t)
	}
	// Public: everything redacted; in credential headers known values and
	// secrets found by their shape (TestConformanceDLPCredentialHeaders).
	got := do("registry.example.net")
	if got.url != "/pkg/%5BREDACTED%3AEMAIL%5D?q=1&aws=%5BREDACTED%3ACLOUD_KEY%5D" {
		t.Errorf("url: %s", got.url)
	}
	if got.header.Get("X-Note") != "from [REDACTED:EMAIL]" || got.header.Get("Authorization") != "Bearer [REDACTED:SECRET]" || got.header.Get("X-Api-Key") != "[REDACTED:CLOUD_KEY]" {
		t.Errorf("headers: %v", got.header)
	}
	for name := range got.header {
		if strings.Contains(strings.ToLower(name), strings.ToLower(dlpSecret)) {
			t.Errorf("a header name carried the secret: %q", name)
		}
	}
	// External: the agent's credential headers reach its API (logged).
	got = do("api.anthropic.com")
	if got.header.Get("Authorization") != "Bearer "+dlpSecret || got.header.Get("X-Note") != "from [REDACTED:EMAIL]" {
		t.Errorf("external headers: %v", got.header)
	}
	// Internal: nothing changes, known values are logged.
	got = do("git.corp.internal")
	if !strings.Contains(got.url, dlpAWS) || got.header.Get("Authorization") != "Bearer "+dlpSecret {
		t.Errorf("internal: %s %v", got.url, got.header)
	}
	ev := v.Events.Wait(t, "internal request", func(e egress.Event) bool { return e.Kind == "request" && e.Name == "git.corp.internal" })
	if ev.Decision != "allow" || len(ev.Findings) != 1 || ev.Findings[0].Action != "log" || ev.Findings[0].Where != "header:Authorization" {
		t.Errorf("internal event: %s %+v", ev.Decision, ev.Findings)
	}
}

func TestDLPFilterRefusesUndecodableBody(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 0)
	c := &http.Client{Transport: v.GuestTransport(false)}
	req, _ := http.NewRequest("POST", "https://api.anthropic.com/v1/x", strings.NewReader("not gzip at all "+dlpSecret))
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "cannot be decoded") {
		t.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if n := len(v.up["api.anthropic.com"].reqs); n != 0 {
		t.Errorf("%d requests reached the upstream", n)
	}
	v.Events.Wait(t, "refused", func(e egress.Event) bool { return e.Kind == "request" && e.Decision == "deny" })
}

// wsKey is RFC 6455's sample handshake nonce.
var wsKey = base64.StdEncoding.EncodeToString([]byte("the sample nonce"))

// wsFrame builds a client frame (masked unless mask is nil).
func wsFrame(fin bool, op byte, payload []byte, mask []byte) []byte {
	b := []byte{op, 0}
	if fin {
		b[0] |= 0x80
	}
	switch l := len(payload); {
	case l <= 125:
		b[1] = byte(l)
	case l <= 0xffff:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(l))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(l))
	}
	if mask != nil {
		b[1] |= 0x80
		b = append(b, mask...)
	}
	for i, c := range payload {
		if mask != nil {
			c ^= mask[i&3]
		}
		b = append(b, c)
	}
	return b
}

type wsMsg struct {
	op      byte
	payload string
}

// wsUpstream is a WebSocket server that records the messages (and control
// frames) it receives, reassembled, and whether every frame was masked.
type wsUpstream struct {
	mu       sync.Mutex
	msgs     []wsMsg
	unmasked bool
	ext      string
	done     chan struct{}
}

func (u *wsUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.ext = r.Header.Get("Sec-WebSocket-Extensions")
	u.mu.Unlock()
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	defer close(u.done)
	io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	var cur []byte
	var curOp byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(brw, h[:]); err != nil {
			return
		}
		l := uint64(h[1] & 0x7f)
		switch l {
		case 126:
			var x [2]byte
			io.ReadFull(brw, x[:])
			l = uint64(binary.BigEndian.Uint16(x[:]))
		case 127:
			var x [8]byte
			io.ReadFull(brw, x[:])
			l = binary.BigEndian.Uint64(x[:])
		}
		var mask [4]byte
		masked := h[1]&0x80 != 0
		if masked {
			io.ReadFull(brw, mask[:])
		}
		p := make([]byte, l)
		if _, err := io.ReadFull(brw, p); err != nil {
			return
		}
		for i := range p {
			p[i] ^= mask[i&3]
		}
		u.mu.Lock()
		if !masked {
			u.unmasked = true
		}
		op, fin := h[0]&0x0f, h[0]&0x80 != 0
		switch {
		case op >= 8:
			u.msgs = append(u.msgs, wsMsg{op, string(p)})
		case op != 0:
			cur, curOp = p, op
		default:
			cur = append(cur, p...)
		}
		if fin && op < 8 {
			u.msgs = append(u.msgs, wsMsg{curOp, string(cur)})
		}
		closing := op == 8
		u.mu.Unlock()
		if closing {
			return
		}
	}
}

// wsDial upgrades a guest connection to registry.example.net (a
// recording wsUpstream) to WebSocket, with extra request header lines.
func wsDial(t *testing.T, v *dlpEnv, extra string) (*wsUpstream, net.Conn, *tls.Conn) {
	t.Helper()
	up := &wsUpstream{done: make(chan struct{})}
	v.UpstreamTLS("registry.example.net", 443, v.UpCA, up)
	conn := v.GuestConn("registry.example.net", 443)
	t.Cleanup(func() { conn.Close() })
	tc := tls.Client(conn, &tls.Config{ServerName: "registry.example.net", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
	io.WriteString(tc, "GET /ws HTTP/1.1\r\nHost: registry.example.net\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: "+wsKey+"\r\nSec-WebSocket-Version: 13\r\n"+extra+"\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(tc), nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return up, conn, tc
}

func TestDLPFilterWebSocket(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 0)
	up, conn, tc := wsDial(t, v, "Sec-WebSocket-Extensions: permessage-deflate\r\n")
	mask := []byte{1, 2, 3, 4}
	s := dlpSecret
	var frames []byte
	// A text message in three fragments, the secret split across them,
	// with a ping in between.
	frames = append(frames, wsFrame(false, 1, []byte("key "+s[:5]), mask)...)
	frames = append(frames, wsFrame(true, 9, []byte("ping "+s), mask)...)
	frames = append(frames, wsFrame(false, 0, []byte(s[5:11]), mask)...)
	frames = append(frames, wsFrame(true, 0, []byte(s[11:]+" and bob@corp.io"), mask)...)
	// A binary message: the known value goes, the address stays.
	frames = append(frames, wsFrame(true, 2, []byte("\x00"+s+" bob@corp.io"), mask)...)
	// A long text message, in one frame.
	long := strings.Repeat("x", 70000) + s + strings.Repeat("y", 70000)
	frames = append(frames, wsFrame(true, 1, []byte(long), mask)...)
	frames = append(frames, wsFrame(true, 8, append([]byte{3, 232}, "bye "+s...), mask)...)
	// Written in small pieces, cutting through headers and payloads.
	for i := 0; i < len(frames); i += 7 {
		if _, err := tc.Write(frames[i:min(i+7, len(frames))]); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-up.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream did not get the close frame")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	want := []wsMsg{
		{9, "ping [REDACTED:SECRET]"},
		{1, "key [REDACTED:SECRET] and [REDACTED:EMAIL]"},
		{2, "\x00[REDACTED:SECRET] bob@corp.io"},
		{1, strings.Repeat("x", 70000) + "[REDACTED:SECRET]" + strings.Repeat("y", 70000)},
		{8, "\x03\xe8bye [REDACTED:SECRET]"},
	}
	if len(up.msgs) != len(want) {
		t.Fatalf("upstream got %d messages: %q", len(up.msgs), up.msgs)
	}
	for i := range want {
		if up.msgs[i] != want[i] {
			t.Errorf("message %d: got %d %.80q, want %d %.80q", i, up.msgs[i].op, up.msgs[i].payload, want[i].op, want[i].payload)
		}
	}
	if up.unmasked || up.ext != "" {
		t.Errorf("unmasked frames %v, extension offer passed %q", up.unmasked, up.ext)
	}
	conn.Close()
	ev := v.Events.Wait(t, "websocket request", func(e egress.Event) bool { return e.Kind == "request" && e.Status == 101 })
	if ev.Decision != "scrub" || len(ev.Findings) < 5 {
		t.Errorf("event: %s %+v", ev.Decision, ev.Findings)
	}
}

func TestDLPFilterWebSocketRefusesCompressedFrames(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 0)
	up, _, tc := wsDial(t, v, "")
	f := wsFrame(true, 1, []byte("compressed? "+dlpSecret), []byte{9, 9, 9, 9})
	f[0] |= 0x40 // RSV1: permessage-deflate
	tc.Write(f)
	select {
	case <-up.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the connection to the upstream stayed open")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.msgs) != 0 {
		t.Errorf("the upstream got %q", up.msgs)
	}
}

func TestDLPFilterTrailersAndMethod(t *testing.T) {
	t.Parallel()
	v := newDLPEnv(t, 16)
	c := &http.Client{Transport: v.GuestTransport(false)}
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "https://registry.example.net/t", pr)
	req.Trailer = http.Header{"X-Late": nil}
	go func() {
		pw.Write([]byte("body"))
		req.Trailer.Set("X-Late", dlpSecret)
		pw.Close()
	}()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := v.up["registry.example.net"].last(t)
	if strings.Contains(fmt.Sprint(got.header, got.trailer), dlpSecret) || got.body != "body" || got.trailer.Get("X-Late") != "[REDACTED:SECRET]" {
		t.Errorf("the trailer reached upstream unscrubbed: %v %v %q", got.header, got.trailer, got.body)
	}
	req, _ = http.NewRequest(dlpAWS, "https://registry.example.net/m", nil)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a method holding a key: status %d", resp.StatusCode)
	}
}

// TestDLPFilterFramingHeadersBenign: the random values clients put in
// framing headers (a WebSocket nonce; Go's, curl's, Python's, Node's and
// a browser's multipart boundaries) are not findings, many draws each: scanning those
// headers must not refuse ordinary requests.
func TestDLPFilterFramingHeadersBenign(t *testing.T) {
	t.Parallel()
	e, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: dlpSecret, Source: ".env:1 API_KEY"}}})
	if err != nil {
		t.Fatal(err)
	}
	f := &DLPFilter{Engine: e}
	dest := mitm.Destination{Name: "registry.example.net", Port: 443, Scheme: "https", Verified: true}
	for i := range 300 {
		b := make([]byte, 16)
		rand.Read(b)
		nonce := base64.StdEncoding.EncodeToString(b)
		for _, ct := range []string{
			multipart.NewWriter(io.Discard).FormDataContentType(),
			"multipart/form-data; boundary=------------------------" + hex.EncodeToString(b[:8]),
			"multipart/form-data; boundary=" + hex.EncodeToString(b),                                                      // Python's urllib3
			fmt.Sprintf("multipart/form-data; boundary=--------------------------%024d", binary.BigEndian.Uint64(b)%1e18), // Node's form-data
			"multipart/form-data; boundary=----WebKitFormBoundary" + base64.RawURLEncoding.EncodeToString(b[:12])[:16],
		} {
			r, _ := http.NewRequest("GET", "https://registry.example.net/", nil)
			r.Header.Set("Content-Type", ct)
			r.Header.Set("Sec-Websocket-Key", nonce)
			r.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
			done, err := f.FilterRequest(t.Context(), dest, r)
			if err != nil {
				t.Fatalf("draw %d: %v (Content-Type %q, key %q)", i, err, ct, nonce)
			}
			if fs := done(); len(fs) > 0 {
				t.Fatalf("draw %d: findings %+v (Content-Type %q, key %q)", i, fs, ct, nonce)
			}
		}
	}
}
