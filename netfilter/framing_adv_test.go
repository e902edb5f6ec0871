package netfilter

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestFramingHeadersRawAdv (adversarial): a known secret hidden in what
// frames a request, written by hand as no well-behaved client writes it
// (a second Host, a folded header, odd Transfer-Encoding and
// Content-Length values, HTTP/2 pseudo-headers and the headers HTTP/2
// forbids), never reaches the upstream on either engine: the request is
// refused or the value dropped. The oracle is every byte the upstream read.
func TestFramingHeadersRawAdv(t *testing.T) {
	t.Parallel()
	forEngines(t, func(t *testing.T, kind string) {
		v := newDLPEnvEngine(t, kind, 1024)
		const host = "registry.example.net"
		up := newHTTPRecorder(t, v, host)
		leaked := func(t *testing.T, code int) {
			t.Helper()
			t.Logf("status %d", code)
			if raw := up.bytes(); strings.Contains(strings.ToLower(raw), strings.ToLower(dlpSecret)) {
				t.Fatalf("status %d; the secret reached the upstream:\n%s", code, raw)
			}
		}
		req := func(hdr string) string {
			return "POST /f HTTP/1.1\r\nHost: " + host + "\r\n" + hdr + "Content-Length: 5\r\n\r\nhello"
		}
		for _, c := range []struct{ name, req string }{
			{"second-host", req("Host: " + dlpSecret + "." + host + "\r\n")},
			{"second-host-same-name", "POST /f HTTP/1.1\r\nHost: " + host + "\r\nHost: " + host + ":" + dlpSecret + "\r\nContent-Length: 5\r\n\r\nhello"},
			{"folded-content-type", req("Content-Type: text/plain;\r\n x=" + dlpSecret + "\r\n")},
			{"folded-plain", req("X-Note: fine\r\n\t" + dlpSecret + "\r\n")},
			{"te-list", "POST /f HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: " + dlpSecret + ", chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
			{"te-gzip-chunked", "POST /f HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: gzip, chunked\r\nX-Te: " + dlpSecret + "\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
			{"content-length-junk", "POST /f HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5 " + dlpSecret + "\r\n\r\nhello"},
			{"content-length-twice", "POST /f HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\nContent-Length: " + dlpSecret + "\r\n\r\nhello"},
			{"trailer-decl-only", req("Trailer: X-" + dlpSecret + "\r\n")},
			{"upgrade", "GET /f HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: " + dlpSecret + "\r\n\r\n"},
			{"proxy-connection", req("Proxy-Connection: " + dlpSecret + "\r\n")},
		} {
			t.Run("http1/"+c.name, func(t *testing.T) { leaked(t, rawGuestRequest(t, v, host, c.req)) })
		}
		for _, c := range []struct {
			name string
			hdrs [][2]string
		}{
			{"content-length", [][2]string{{"content-length", dlpSecret}}},
			{"host-mismatch", [][2]string{{"host", dlpSecret + "." + host}}},
			{"host-twice", [][2]string{{"host", host}, {"host", dlpSecret}}},
			{"transfer-encoding", [][2]string{{"transfer-encoding", dlpSecret}}},
			{"te", [][2]string{{"te", "trailers, " + dlpSecret}}},
			{"connection", [][2]string{{"connection", dlpSecret}}},
			{"trailer-decl", [][2]string{{"trailer", "x-" + dlpSecret}}},
			{"keep-alive", [][2]string{{"keep-alive", dlpSecret}}},
			{"upgrade", [][2]string{{"upgrade", dlpSecret}}},
		} {
			t.Run("h2/"+c.name, func(t *testing.T) {
				pseudo := [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", host}, {":path", "/f"}}
				leaked(t, rawH2Request(t, v, host, append(pseudo, c.hdrs...), "hello"))
			})
		}
		for _, c := range []struct {
			name   string
			pseudo [][2]string
		}{
			{"scheme", [][2]string{{":method", "POST"}, {":scheme", dlpSecret}, {":authority", host}, {":path", "/f"}}},
			{"authority-userinfo", [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", dlpSecret + "@" + host}, {":path", "/f"}}},
			{"protocol", [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", host}, {":path", "/f"}, {":protocol", dlpSecret}}},
			{"unknown-pseudo", [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", host}, {":path", "/f"}, {":x", dlpSecret}}},
			{"path-absolute", [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", host}, {":path", "https://" + host + "/f?k=" + dlpSecret}}},
		} {
			t.Run("h2-pseudo/"+c.name, func(t *testing.T) { leaked(t, rawH2Request(t, v, host, c.pseudo, "hello")) })
		}
		if !strings.Contains(up.bytes(), "POST /f HTTP/1.1") {
			t.Errorf("no request reached the recording upstream: the oracle saw nothing")
		}
	})
}

// rawH2Request sends one HTTP/2 request with the header fields given, as
// written (no validation), and body, on a guest TLS connection to
// name:443, and returns the response status (0 when there was none).
func rawH2Request(t *testing.T, v *dlpEnv, name string, fields [][2]string, body string) int {
	t.Helper()
	tc := tls.Client(v.GuestConn(name, 443), &tls.Config{ServerName: name, RootCAs: v.CA.Pool(), NextProtos: []string{"h2"}})
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.HandshakeContext(t.Context()); err != nil || tc.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("h2 handshake: %v %q", err, tc.ConnectionState().NegotiatedProtocol)
	}
	io.WriteString(tc, http2.ClientPreface)
	fr := http2.NewFramer(tc, tc)
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range fields {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: body == ""})
	if body != "" {
		fr.WriteData(1, true, []byte(body))
	}
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return 0
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			hs, err := dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				return 0
			}
			for _, h := range hs {
				if h.Name == ":status" {
					var code int
					fmt.Sscan(h.Value, &code)
					return code
				}
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return 0
		}
	}
}
