package mitm

import (
	"github.com/vibedom/vibedom/netfilter/internal/nftest"

	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
)

// realClientHello captures the first handshake message a Go TLS client
// sends (records stripped) with the given SNI and ALPN.
func realClientHello(t testing.TB, sni string, alpn []string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		tls.Client(c, &tls.Config{ServerName: sni, NextProtos: alpn, InsecureSkipVerify: true}).Handshake()
		c.Close()
	}()
	var msg []byte
	for {
		var h [5]byte
		if _, err := io.ReadFull(s, h[:]); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, binary.BigEndian.Uint16(h[3:]))
		if _, err := io.ReadFull(s, body); err != nil {
			t.Fatal(err)
		}
		msg = append(msg, body...)
		if len(msg) >= 4 && len(msg) >= 4+int(msg[1])<<16+int(msg[2])<<8+int(msg[3]) {
			return msg
		}
	}
}

// peekBytes runs peekClientHello over a connection that carries data and
// then ends, and checks that the bytes are still all there to read.
func peekBytes(t *testing.T, data []byte) (clientHello, error) {
	t.Helper()
	c, s := net.Pipe()
	go func() { c.Write(data); c.Close() }()
	pc := &PeekConn{Conn: s}
	ch, err := peekClientHello(pc)
	rest, _ := io.ReadAll(pc)
	if !bytes.Equal(rest, data) {
		t.Errorf("peeking consumed bytes: read back %d of %d", len(rest), len(data))
	}
	return ch, err
}

func TestPeekClientHello(t *testing.T) {
	t.Parallel()
	real := realClientHello(t, "api.example.com", []string{"h2", "http/1.1"})
	tests := []struct {
		name    string
		data    []byte
		sni     string
		hasSNI  bool
		alpn    []string
		wantErr bool
	}{
		{name: "go client", data: nftest.Records(real, 1<<14), sni: "api.example.com", hasSNI: true, alpn: []string{"h2", "http/1.1"}},
		{name: "fragmented into 100-byte records", data: nftest.Records(real, 100), sni: "api.example.com", hasSNI: true, alpn: []string{"h2", "http/1.1"}},
		{name: "one-byte records", data: nftest.Records(nftest.Handshake(nftest.Ext(0, nftest.SNIData("a.test"))), 1), sni: "a.test", hasSNI: true},
		{name: "no extensions", data: nftest.Records(nftest.RawHandshake(nftest.HelloHead(2)), 1<<14)},
		{name: "no sni", data: nftest.Records(nftest.Handshake(nftest.Ext(16, []byte{0, 3, 2, 'h', '2'})), 1<<14), alpn: []string{"h2"}},
		{name: "non-hostname sni type only", data: nftest.Records(nftest.Handshake(nftest.Ext(0, []byte{0, 4, 1, 0, 1, 'x'})), 1<<14)},
		{name: "not a handshake record", data: []byte{0x17, 3, 3, 0, 1, 0}, wantErr: true},
		{name: "sslv2-ish version", data: []byte{0x16, 2, 0, 0, 1, 1}, wantErr: true},
		{name: "empty record", data: []byte{0x16, 3, 1, 0, 0}, wantErr: true},
		{name: "record too long", data: []byte{0x16, 3, 1, 0x40, 0x01}, wantErr: true},
		{name: "server hello", data: nftest.Records(append([]byte{2}, nftest.Handshake()[1:]...), 1<<14), wantErr: true},
		{name: "handshake over 64 KiB", data: nftest.Records([]byte{1, 1, 0, 0}, 1<<14), wantErr: true},
		{name: "truncated record", data: nftest.Records(real, 1<<14)[:100], wantErr: true},
		{name: "truncated header", data: []byte{0x16, 3}, wantErr: true},
		{name: "duplicate sni extension", data: nftest.Records(nftest.Handshake(nftest.Ext(0, nftest.SNIData("a.test")), nftest.Ext(0, nftest.SNIData("b.test"))), 1<<14), wantErr: true},
		{name: "two host names", data: nftest.Records(nftest.Handshake(nftest.Ext(0, nftest.SNIData("a.test", "b.test"))), 1<<14), wantErr: true},
		{name: "empty host name", data: nftest.Records(nftest.Handshake(nftest.Ext(0, nftest.SNIData(""))), 1<<14), wantErr: true},
		{name: "empty sni list", data: nftest.Records(nftest.Handshake(nftest.Ext(0, []byte{0, 0})), 1<<14), wantErr: true},
		{name: "sni list longer than extension", data: nftest.Records(nftest.Handshake(nftest.Ext(0, []byte{0, 9, 0, 0, 1, 'x'})), 1<<14), wantErr: true},
		{name: "extension longer than block", data: nftest.Records(nftest.Handshake([]byte{0, 0, 0xff, 0xff}), 1<<14), wantErr: true},
		{name: "trailing bytes after sni list", data: nftest.Records(nftest.Handshake(nftest.Ext(0, append(nftest.SNIData("a.test"), 0))), 1<<14), wantErr: true},
		{name: "empty alpn protocol", data: nftest.Records(nftest.Handshake(nftest.Ext(16, []byte{0, 1, 0})), 1<<14), wantErr: true},
		{name: "no cipher suites", data: nftest.Records(nftest.RawHandshake(nftest.HelloHead(0)), 1<<14), wantErr: true},
		{name: "odd cipher suites length", data: nftest.Records(nftest.RawHandshake(nftest.HelloHead(3)), 1<<14), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch, err := peekBytes(t, tt.data)
			if (err != nil) != tt.wantErr {
				t.Fatalf("peekClientHello: err %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, errBadHello) {
					t.Errorf("error %v does not wrap errBadHello", err)
				}
				return
			}
			if ch.serverName != tt.sni || ch.hasSNI != tt.hasSNI || !slices.Equal(ch.alpn, tt.alpn) {
				t.Errorf("got %+v, want sni %q (%v) alpn %v", ch, tt.sni, tt.hasSNI, tt.alpn)
			}
		})
	}
}

func TestParseClientHelloNeverPanics(t *testing.T) {
	t.Parallel()
	real := realClientHello(t, "api.example.com", []string{"h2"})[4:]
	// Every truncation and every single-byte corruption of a real hello.
	for i := range real {
		parseClientHello(real[:i])
		for _, b := range []byte{0, 0xff, real[i] + 1} {
			m := bytes.Clone(real)
			m[i] = b
			parseClientHello(m)
		}
	}
}

func FuzzParseClientHello(f *testing.F) {
	f.Add(realClientHello(f, "a.test", []string{"h2"})[4:])
	f.Add(nftest.Handshake(nftest.Ext(0, nftest.SNIData("a.test", "b.test")))[4:])
	f.Fuzz(func(t *testing.T, b []byte) {
		ch, err := parseClientHello(b)
		if err == nil && ch.hasSNI && ch.serverName == "" {
			t.Errorf("accepted an empty server name")
		}
	})
}
