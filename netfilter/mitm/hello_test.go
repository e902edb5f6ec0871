package netfilter

import (
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

// records wraps a handshake message in TLS records of at most size bytes.
func records(msg []byte, size int) []byte {
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// helloHead is a ClientHello body up to (not including) the extensions,
// with cipher suite bytes of the given length.
func helloHead(suiteBytes int) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = binary.BigEndian.AppendUint16(body, uint16(suiteBytes))
	body = append(body, bytes.Repeat([]byte{0x13}, suiteBytes)...)
	return append(body, 1, 0) // null compression
}

// rawHandshake frames a ClientHello body as a handshake message.
func rawHandshake(body []byte) []byte {
	return append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
}

// handshake builds a ClientHello handshake message from its extensions.
func handshake(exts ...[]byte) []byte {
	body := helloHead(2)
	all := bytes.Join(exts, nil)
	body = binary.BigEndian.AppendUint16(body, uint16(len(all)))
	return rawHandshake(append(body, all...))
}

func ext(typ uint16, data []byte) []byte {
	out := binary.BigEndian.AppendUint16(nil, typ)
	out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
	return append(out, data...)
}

func sniData(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(list))), list...)
}

// peekBytes runs peekClientHello over a connection that carries data and
// then ends, and checks that the bytes are still all there to read.
func peekBytes(t *testing.T, data []byte) (clientHello, error) {
	t.Helper()
	c, s := net.Pipe()
	go func() { c.Write(data); c.Close() }()
	pc := &peekConn{Conn: s}
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
		{name: "go client", data: records(real, 1<<14), sni: "api.example.com", hasSNI: true, alpn: []string{"h2", "http/1.1"}},
		{name: "fragmented into 100-byte records", data: records(real, 100), sni: "api.example.com", hasSNI: true, alpn: []string{"h2", "http/1.1"}},
		{name: "one-byte records", data: records(handshake(ext(0, sniData("a.test"))), 1), sni: "a.test", hasSNI: true},
		{name: "no extensions", data: records(rawHandshake(helloHead(2)), 1<<14)},
		{name: "no sni", data: records(handshake(ext(16, []byte{0, 3, 2, 'h', '2'})), 1<<14), alpn: []string{"h2"}},
		{name: "non-hostname sni type only", data: records(handshake(ext(0, []byte{0, 4, 1, 0, 1, 'x'})), 1<<14)},
		{name: "not a handshake record", data: []byte{0x17, 3, 3, 0, 1, 0}, wantErr: true},
		{name: "sslv2-ish version", data: []byte{0x16, 2, 0, 0, 1, 1}, wantErr: true},
		{name: "empty record", data: []byte{0x16, 3, 1, 0, 0}, wantErr: true},
		{name: "record too long", data: []byte{0x16, 3, 1, 0x40, 0x01}, wantErr: true},
		{name: "server hello", data: records(append([]byte{2}, handshake()[1:]...), 1<<14), wantErr: true},
		{name: "handshake over 64 KiB", data: records([]byte{1, 1, 0, 0}, 1<<14), wantErr: true},
		{name: "truncated record", data: records(real, 1<<14)[:100], wantErr: true},
		{name: "truncated header", data: []byte{0x16, 3}, wantErr: true},
		{name: "duplicate sni extension", data: records(handshake(ext(0, sniData("a.test")), ext(0, sniData("b.test"))), 1<<14), wantErr: true},
		{name: "two host names", data: records(handshake(ext(0, sniData("a.test", "b.test"))), 1<<14), wantErr: true},
		{name: "empty host name", data: records(handshake(ext(0, sniData(""))), 1<<14), wantErr: true},
		{name: "empty sni list", data: records(handshake(ext(0, []byte{0, 0})), 1<<14), wantErr: true},
		{name: "sni list longer than extension", data: records(handshake(ext(0, []byte{0, 9, 0, 0, 1, 'x'})), 1<<14), wantErr: true},
		{name: "extension longer than block", data: records(handshake([]byte{0, 0, 0xff, 0xff}), 1<<14), wantErr: true},
		{name: "trailing bytes after sni list", data: records(handshake(ext(0, append(sniData("a.test"), 0))), 1<<14), wantErr: true},
		{name: "empty alpn protocol", data: records(handshake(ext(16, []byte{0, 1, 0})), 1<<14), wantErr: true},
		{name: "no cipher suites", data: records(rawHandshake(helloHead(0)), 1<<14), wantErr: true},
		{name: "odd cipher suites length", data: records(rawHandshake(helloHead(3)), 1<<14), wantErr: true},
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
	f.Add(handshake(ext(0, sniData("a.test", "b.test")))[4:])
	f.Fuzz(func(t *testing.T, b []byte) {
		ch, err := parseClientHello(b)
		if err == nil && ch.hasSNI && ch.serverName == "" {
			t.Errorf("accepted an empty server name")
		}
	})
}
