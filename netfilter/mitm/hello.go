package mitm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// maxHelloBytes bounds how much of a connection is read ahead to find a
// complete TLS ClientHello (records and handshake message together).
const maxHelloBytes = 64 << 10

// errBadHello is wrapped by errors about a ClientHello that cannot be
// parsed; such a connection is refused.
var errBadHello = errors.New("malformed TLS ClientHello")

// PeekConn reads ahead of its consumer: bytes read by Fill stay buffered
// (Peeked) and are returned by Read before anything more is read from
// Conn.
type PeekConn struct {
	net.Conn
	buf []byte
}

// Fill reads until at least n bytes are buffered (n ≤ maxHelloBytes).
func (c *PeekConn) Fill(n int) error {
	if n > maxHelloBytes {
		return fmt.Errorf("%w: more than %d bytes", errBadHello, maxHelloBytes)
	}
	for len(c.buf) < n {
		if cap(c.buf) < n {
			nb := make([]byte, len(c.buf), max(n, 2*cap(c.buf), 512))
			copy(nb, c.buf)
			c.buf = nb
		}
		m, err := c.Conn.Read(c.buf[len(c.buf):cap(c.buf)])
		c.buf = c.buf[:len(c.buf)+m]
		if err != nil {
			if len(c.buf) >= n {
				return nil
			}
			return err
		}
	}
	return nil
}

// NewPeekConn returns a PeekConn on c that first returns what br (which
// read from c) has buffered: the bytes a client sent right after a
// CONNECT or a proxy's answer.
func NewPeekConn(c net.Conn, br *bufio.Reader) *PeekConn {
	pc := &PeekConn{Conn: c}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pc.buf = append([]byte(nil), b...)
	}
	return pc
}

// Peeked returns the bytes buffered and not yet read; the caller must not
// change them.
func (c *PeekConn) Peeked() []byte { return c.buf }

func (c *PeekConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		if len(c.buf) == 0 {
			c.buf = nil
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the underlying connection when it can.
func (c *PeekConn) CloseWrite() error {
	return closeWrite(c.Conn)
}

// clientHello is what the proxy needs from a ClientHello.
type clientHello struct {
	serverName string // "" when the extension is absent
	hasSNI     bool
	alpn       []string
	// ech: the hello carries an encrypted ClientHello (ECH, or the
	// draft ESNI), whose inner SNI names the real destination.
	ech bool
}

// peekClientHello reads (without consuming) the TLS records that carry the
// first handshake message and parses it as a ClientHello. It is strict:
// anything unexpected is errBadHello, and the caller refuses the connection.
func peekClientHello(c *PeekConn) (clientHello, error) {
	// Reassemble the handshake message from as many records as it takes.
	var msg []byte
	off := 0
	for {
		if err := c.Fill(off + 5); err != nil {
			return clientHello{}, readErr(err)
		}
		h := c.buf[off : off+5]
		if h[0] != 0x16 || h[1] != 3 {
			return clientHello{}, fmt.Errorf("%w: record type %#x version %#x%02x", errBadHello, h[0], h[1], h[2])
		}
		n := int(binary.BigEndian.Uint16(h[3:5]))
		if n == 0 || n > 1<<14 {
			return clientHello{}, fmt.Errorf("%w: record length %d", errBadHello, n)
		}
		if err := c.Fill(off + 5 + n); err != nil {
			return clientHello{}, readErr(err)
		}
		msg = append(msg, c.buf[off+5:off+5+n]...)
		off += 5 + n
		if len(msg) >= 4 {
			if msg[0] != 1 {
				return clientHello{}, fmt.Errorf("%w: handshake type %d is not ClientHello", errBadHello, msg[0])
			}
			want := 4 + (int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]))
			if want > maxHelloBytes {
				return clientHello{}, fmt.Errorf("%w: %d bytes long", errBadHello, want)
			}
			if len(msg) >= want {
				return parseClientHello(msg[4:want])
			}
		}
	}
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: connection closed inside it", errBadHello)
	}
	return err
}

// reader is a bounds-checked cursor over a byte slice.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() int {
	b := r.bytes(1)
	if b == nil {
		return 0
	}
	return int(b[0])
}

func (r *reader) u16() int {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(b))
}

// vec reads a vector with a length prefix of 1 or 2 bytes.
func (r *reader) vec(lenBytes int) *reader {
	n := r.u8()
	if lenBytes == 2 {
		n = n<<8 | r.u8()
	}
	return &reader{b: r.bytes(n), bad: r.bad}
}

func parseClientHello(body []byte) (clientHello, error) {
	var ch clientHello
	r := &reader{b: body}
	r.bytes(2 + 32)  // legacy_version, random
	r.vec(1)         // legacy_session_id
	cs := r.vec(2)   // cipher_suites
	comp := r.vec(1) // legacy_compression_methods
	if r.bad || cs.bad || len(cs.b) == 0 || len(cs.b)%2 != 0 || comp.bad || len(comp.b) == 0 {
		return ch, fmt.Errorf("%w: truncated header", errBadHello)
	}
	if len(r.b) == 0 {
		return ch, nil // no extensions at all
	}
	exts := r.vec(2)
	if r.bad || exts.bad || len(r.b) != 0 {
		return ch, fmt.Errorf("%w: bad extensions block", errBadHello)
	}
	seen := map[int]bool{}
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.vec(2)
		if exts.bad || data.bad {
			return ch, fmt.Errorf("%w: truncated extension", errBadHello)
		}
		if seen[typ] {
			return ch, fmt.Errorf("%w: duplicate extension %d", errBadHello, typ)
		}
		seen[typ] = true
		switch typ {
		case 0: // server_name
			list := data.vec(2)
			if data.bad || list.bad || len(data.b) != 0 || len(list.b) == 0 {
				return ch, fmt.Errorf("%w: bad server_name extension", errBadHello)
			}
			for len(list.b) > 0 {
				nameType := list.u8()
				name := list.vec(2)
				if list.bad || name.bad {
					return ch, fmt.Errorf("%w: truncated server_name", errBadHello)
				}
				if nameType != 0 {
					continue
				}
				if ch.hasSNI {
					return ch, fmt.Errorf("%w: more than one host name in server_name", errBadHello)
				}
				if len(name.b) == 0 {
					return ch, fmt.Errorf("%w: empty server_name", errBadHello)
				}
				ch.serverName, ch.hasSNI = string(name.b), true
			}
		case 0xfe0d, 0xffce: // encrypted_client_hello, draft encrypted_server_name
			ch.ech = true
		case 16: // application_layer_protocol_negotiation
			list := data.vec(2)
			if data.bad || list.bad || len(data.b) != 0 {
				return ch, fmt.Errorf("%w: bad ALPN extension", errBadHello)
			}
			for len(list.b) > 0 {
				p := list.vec(1)
				if list.bad || p.bad || len(p.b) == 0 {
					return ch, fmt.Errorf("%w: bad ALPN protocol", errBadHello)
				}
				ch.alpn = append(ch.alpn, string(p.b))
			}
		}
	}
	return ch, nil
}

// tlsAlert writes a fatal TLS alert record (e.g. 49 access_denied) so the
// client reports why the handshake failed rather than a bare EOF.
func tlsAlert(w io.Writer, desc byte) {
	w.Write([]byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x02, desc})
}

const alertAccessDenied = 49
