package netfilter

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
)

// TestResponseScrubEverywhere (issue 18, item 13): a fake provider echoes
// the real key in every place a response can carry text and in every
// encoding the DLP knows; none of it reaches the guest. The oracle is the
// DLP itself, holding the real key as a known value: whatever the guest
// received (1xx, 101 and final headers, header names, trailers, body,
// WebSocket frames) must show no form of it.
func TestResponseScrubEverywhere(t *testing.T) {
	t.Parallel()
	real, ph, eng := swapFixture(t, "Ec4o", "PhZz")
	oracle, err := dlp.New(dlp.Config{Secrets: []dlp.Secret{{Value: real, Source: "host key"}}})
	if err != nil {
		t.Fatal(err)
	}
	pol := oracle.PolicyForClass(dlp.ClassPublic).KnownOnly()
	leaks := func(s string) bool {
		return strings.Contains(s, real[13:40]) || oracle.ContainsKnownFold(s) || string(oracle.ScrubText(&pol, []byte(s), "", nil)) != s
	}
	filter := NewSwapFilter(&DLPFilter{Engine: eng}, []credentials.Swap{{Name: "anthropic", Host: "api.test", Header: "x-api-key", Placeholder: ph, Value: real, Token: ph}})

	liveGot := make(chan struct{}, 4)
	provider := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Api-Key")
		if k != real {
			http.Error(w, "no key", 401)
			return
		}
		fl := w.(http.Flusher)
		switch r.URL.Path {
		case "/early-hints":
			w.Header().Set("Link", "</k="+k+">; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			io.WriteString(w, "ok")
		case "/trailers":
			w.Header().Set("Trailer", "X-T")
			io.WriteString(w, "body ")
			fl.Flush()
			w.Header().Set("X-T", k)
			w.Header().Set(http.TrailerPrefix+"X-U", k)
		case "/header-name":
			w.Header().Set("X-"+k, "1")
			w.Header().Set("X-B64", base64.StdEncoding.EncodeToString([]byte(k)))
			io.WriteString(w, "ok")
		case "/spoof-refused":
			// The mark the mitmproxy addon puts on its own refusals: from
			// upstream it must not turn the scrubbing off.
			w.Header().Set("X-Vibedom", "refused")
			io.WriteString(w, "body "+k)
		case "/base64":
			io.WriteString(w, `{"v":"`+base64.StdEncoding.EncodeToString([]byte("key: "+k))+`"}`)
		case "/base64url":
			io.WriteString(w, base64.RawURLEncoding.EncodeToString([]byte("xx"+k)))
		case "/hex":
			io.WriteString(w, "hex="+hex.EncodeToString([]byte(k)))
		case "/percent":
			io.WriteString(w, "q="+url.QueryEscape("a "+k)+"&all="+percentAllForTest(k))
		case "/unicode":
			w.Header().Set("Content-Type", "application/json")
			var b strings.Builder
			for _, c := range k {
				fmt.Fprintf(&b, `\u%04x`, c)
			}
			io.WriteString(w, `{"e":"`+b.String()+`"}`)
		case "/gzip":
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			io.WriteString(zw, "zipped "+k+" end")
			zw.Close()
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			for _, part := range []string{"hello ", k[:30], k[30:70], k[70:], " bye"} {
				b, _ := jsonMarshalString(part)
				fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":%s}}\n\n", b)
				fl.Flush()
			}
		case "/sse-live":
			// The next event only once the guest has the first: a scrubber
			// that held an event back until more came would stall here.
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"delta\":{\"text\":\"first sk-ant-api03-\"}}\n\n")
			fl.Flush()
			select {
			case <-liveGot:
			case <-time.After(20 * time.Second):
				return
			}
			io.WriteString(w, "data: {\"delta\":{\"text\":\"second\"}}\n\n")
		case "/ws":
			hj, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer hj.Close()
			fmt.Fprintf(hj, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\nX-Echo: %s\r\n\r\n", k)
			hj.Write(wsFrame(true, 1, []byte("text "+k), nil))
			hj.Write(wsFrame(true, 1, []byte("b64 "+base64.StdEncoding.EncodeToString([]byte(k))), nil))
			hj.Write(wsFrame(true, 2, []byte("hex "+hex.EncodeToString([]byte(k))), nil))
			hj.Write(wsFrame(true, 9, []byte(k), nil))
			hj.Write(wsFrame(false, 1, []byte("split "+k[:50]), nil))
			hj.Write(wsFrame(true, 0, []byte(k[50:]), nil))
			hj.Write(wsFrame(true, 8, append([]byte{3, 232}, k...), nil))
			hj.SetReadDeadline(time.Now().Add(2 * time.Second))
			io.Copy(io.Discard, hj)
		}
	})

	forEngines(t, func(t *testing.T, kind string) {
		for _, h2 := range []bool{false, true} {
			name := "http1"
			if h2 {
				name = "http2"
			}
			t.Run(name, func(t *testing.T) {
				v := newEngineEnv(t, kind, mitmtest.Rules, func(c *mitm.EngineConfig) { c.Filter = filter })
				v.UpstreamTLS("api.test", 443, v.UpCA, provider)
				c := &http.Client{Transport: v.GuestTransport(h2), Timeout: time.Minute}
				for _, path := range []string{"/early-hints", "/trailers", "/header-name", "/spoof-refused", "/base64", "/base64url", "/hex", "/percent", "/unicode", "/gzip", "/sse"} {
					t.Run(strings.TrimPrefix(path, "/"), func(t *testing.T) {
						var got strings.Builder
						trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
							fmt.Fprintf(&got, "%d %v\n", code, h)
							return nil
						}}
						ctx := t.Context()
						if path == "/trailers" {
							// The whole response, trailers included, promptly:
							// not at the client's one-minute timeout.
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, 20*time.Second)
							defer cancel()
						}
						req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), "GET", "https://api.test"+path, nil)
						req.Header.Set("x-api-key", ph)
						req.Header.Set("Accept-Encoding", "gzip")
						resp, err := c.Do(req)
						if err != nil && path == "/sse" {
							return // refused before its headers: nothing reached the guest
						}
						if err != nil {
							t.Fatal(err)
						}
						body, rerr := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.Header.Get("Content-Encoding") == "gzip" {
							if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
								body, _ = io.ReadAll(zr)
							}
						}
						fmt.Fprintf(&got, "%d %v\n%s\n%v\n", resp.StatusCode, resp.Header, body, resp.Trailer)
						if path == "/sse" {
							// The text the events add up to, as the agent
							// would join it.
							got.WriteString(sseText(string(body)))
							if rerr == nil {
								t.Errorf("an event stream spelling out the key ended normally: %q", body)
							}
						}
						if path == "/trailers" && (rerr != nil || string(body) != "body " || resp.Trailer.Get("X-T") == "" || resp.Trailer.Get("X-U") == "") {
							t.Errorf("the response did not arrive whole: body %q, trailers %v, error %v", body, resp.Trailer, rerr)
						}
						if leaks(got.String()) {
							t.Errorf("the key reached the guest:\n%s", got.String())
						}
						if resp.StatusCode != 200 {
							t.Errorf("status %d", resp.StatusCode)
						}
					})
				}
				t.Run("sse-live", func(t *testing.T) {
					req, _ := http.NewRequestWithContext(t.Context(), "GET", "https://api.test/sse-live", nil)
					req.Header.Set("x-api-key", ph)
					resp, err := c.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					defer resp.Body.Close()
					br := bufio.NewReader(resp.Body)
					first, err := br.ReadString('\n')
					if blank, _ := br.ReadString('\n'); blank != "\n" {
						t.Errorf("the event's end: %q", blank)
					}
					if err != nil || !strings.Contains(first, "first sk-ant-api03-") {
						t.Fatalf("first event: %q %v", first, err)
					}
					liveGot <- struct{}{}
					rest, _ := io.ReadAll(br)
					if !strings.Contains(string(rest), "second") {
						t.Errorf("second event: %q", rest)
					}
				})
				if h2 {
					return // WebSocket over HTTP/1.1 only
				}
				t.Run("websocket", func(t *testing.T) {
					conn := v.GuestConn("api.test", 443)
					defer conn.Close()
					tc := tls.Client(conn, &tls.Config{ServerName: "api.test", RootCAs: v.CA.Pool(), NextProtos: []string{"http/1.1"}})
					fmt.Fprintf(tc, "GET /ws HTTP/1.1\r\nHost: api.test\r\nx-api-key: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", ph, wsKey)
					br := bufio.NewReader(tc)
					resp, err := http.ReadResponse(br, nil)
					if err != nil || resp.StatusCode != 101 {
						t.Fatalf("upgrade: %v %v", resp, err)
					}
					tc.SetReadDeadline(time.Now().Add(30 * time.Second))
					// Upstream closes 2 s after its close frame.
					frames, _ := io.ReadAll(br)
					all := fmt.Sprintf("%v\n%s", resp.Header, frames)
					if leaks(all) || leaks(string(serverFramePayloads(frames))) {
						t.Errorf("the key reached the guest over the WebSocket: %q", all)
					}
					if !bytes.Contains(frames, []byte("text ")) {
						t.Errorf("frames lost: %q", frames)
					}
				})
			})
		}
	})
}

// percentAllForTest escapes every byte.
func percentAllForTest(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

func jsonMarshalString(s string) (string, error) {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	b.WriteByte('"')
	return b.String(), nil
}

// sseText joins the text deltas of an event stream.
func sseText(body string) string {
	var b strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if _, rest, ok := strings.Cut(line, `"text":"`); ok {
			b.WriteString(strings.SplitN(rest, `"`, 2)[0])
		}
	}
	return b.String()
}

// serverFramePayloads joins the payloads of unmasked frames.
func serverFramePayloads(b []byte) []byte {
	var out []byte
	for len(b) >= 2 {
		l, n := int(b[1]&0x7f), 2
		switch l {
		case 126:
			if len(b) < 4 {
				return out
			}
			l, n = int(b[2])<<8|int(b[3]), 4
		case 127:
			return out
		}
		if len(b) < n+l {
			return append(out, b[n:]...)
		}
		out = append(out, b[n:n+l]...)
		b = b[n+l:]
	}
	return out
}
