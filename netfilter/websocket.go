package netfilter

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/vibedom/vibedom/dlp"
)

// WebSocket opcodes (RFC 6455 §5.2).
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
)

// errWSCompressed: a frame with RSV bits set carries an extension's
// encoding (permessage-deflate) the scrubber cannot read, so it is not
// forwarded. The filter removes extension offers, so a client that sends
// one anyway is misbehaving.
var errWSCompressed = errors.New("websocket frame uses an extension (RSV bits set): it cannot be scanned, the connection is closed")

// wsScrubber rewrites the guest-to-upstream half of a WebSocket
// connection: each data message is scrubbed as one text (binary messages
// for known values and private keys only), control frames' payloads too,
// and the result is sent as new frames, masked with a fresh key. Message
// boundaries and control frames are kept; fragmentation may differ (a
// scrubber holds some text back until the message's last frame).
type wsScrubber struct {
	dst         io.Writer
	e           *dlp.Engine
	pol, binPol *dlp.Policy
	rep         *dlp.Report
	buf         []byte // input not yet consumed
	inFrame     bool
	opcode      byte
	fin         bool
	masked      bool
	mask        [4]byte
	maskPos     int
	left        uint64
	ctrl        []byte // a control frame's payload
	msg         io.WriteCloser
	msgOpcode   byte
	msgEmitted  bool
	msgOut      []byte
	err         error
	// server: the frames come from upstream and go to the guest, unmasked
	// (a server's frames are never masked), into own.
	server bool
	own    []byte
}

func newWSScrubber(dst io.Writer, e *dlp.Engine, pol *dlp.Policy, rep *dlp.Report) *wsScrubber {
	bin := pol.KnownOnly()
	return &wsScrubber{dst: dst, e: e, pol: pol, binPol: &bin, rep: rep}
}

// newWSScrubberTo scrubs upstream's frames to the guest: the result, as
// unmasked frames, is collected for take.
func newWSScrubberTo(e *dlp.Engine, pol *dlp.Policy) *wsScrubber {
	w := newWSScrubber(nil, e, pol, nil)
	w.server = true
	w.dst = appendBuf{&w.own}
	return w
}

// take returns the frames written so far (newWSScrubberTo).
func (w *wsScrubber) take() []byte {
	b := w.own
	w.own = nil
	return b
}

func (w *wsScrubber) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	w.buf = append(w.buf, p...)
	if err := w.step(); err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// Close flushes a message still in progress (the guest went away mid
// message) so nothing held back is lost or leaks unscrubbed: it is sent
// scrubbed and final.
func (w *wsScrubber) Close() error {
	if w.msg != nil && w.err == nil {
		w.msg.Close()
		w.msg = nil
		return w.emit(true)
	}
	return w.err
}

// step consumes as much of w.buf as forms frame headers and payload.
func (w *wsScrubber) step() error {
	for {
		if !w.inFrame {
			n, err := w.header()
			if err != nil || n == 0 {
				return err
			}
			w.buf = w.buf[n:]
			if w.left == 0 {
				if err := w.endFrame(); err != nil {
					return err
				}
			}
			continue
		}
		if len(w.buf) == 0 {
			return nil
		}
		k := min(uint64(len(w.buf)), w.left)
		chunk := w.buf[:k]
		if w.masked {
			for i := range chunk {
				chunk[i] ^= w.mask[w.maskPos&3]
				w.maskPos++
			}
		}
		if w.opcode >= 0x8 {
			w.ctrl = append(w.ctrl, chunk...)
		} else if _, err := w.msg.Write(chunk); err != nil {
			return err
		}
		w.buf = w.buf[k:]
		w.left -= k
		if w.left == 0 {
			if err := w.endFrame(); err != nil {
				return err
			}
		}
	}
}

// header parses a frame header at the start of w.buf; 0 means more bytes
// are needed.
func (w *wsScrubber) header() (int, error) {
	b := w.buf
	if len(b) < 2 {
		return 0, nil
	}
	if b[0]&0x70 != 0 {
		return 0, errWSCompressed
	}
	n := 2
	l := uint64(b[1] & 0x7f)
	switch l {
	case 126:
		if len(b) < 4 {
			return 0, nil
		}
		l, n = uint64(binary.BigEndian.Uint16(b[2:4])), 4
	case 127:
		if len(b) < 10 {
			return 0, nil
		}
		l, n = binary.BigEndian.Uint64(b[2:10]), 10
	}
	masked := b[1]&0x80 != 0
	if masked {
		if len(b) < n+4 {
			return 0, nil
		}
		copy(w.mask[:], b[n:n+4])
		n += 4
	}
	w.inFrame, w.fin, w.opcode, w.masked, w.maskPos, w.left = true, b[0]&0x80 != 0, b[0]&0x0f, masked, 0, l
	switch {
	case w.opcode >= 0x8:
		if l > 125 || !w.fin {
			return 0, fmt.Errorf("websocket control frame of %d bytes (or fragmented): not allowed", l)
		}
		w.ctrl = w.ctrl[:0]
	case w.opcode == wsContinuation:
		if w.msg == nil {
			return 0, errors.New("websocket continuation frame without a message")
		}
	default:
		if w.msg != nil { // a new message before the last one ended
			w.msg.Close()
			w.msg = nil
			if err := w.emit(true); err != nil {
				return 0, err
			}
		}
		pol := w.pol
		if w.opcode != wsText {
			pol = w.binPol
		}
		m, err := w.e.NewStream(appendBuf{&w.msgOut}, pol, dlp.StreamOptions{Where: "websocket"}, w.rep)
		if err != nil {
			return 0, err
		}
		w.msg, w.msgOpcode, w.msgEmitted = m, w.opcode, false
	}
	return n, nil
}

// endFrame acts on a frame whose payload is complete.
func (w *wsScrubber) endFrame() error {
	w.inFrame = false
	if w.opcode >= 0x8 {
		p := w.ctrl
		if w.opcode == wsClose && len(p) >= 2 {
			p = append(p[:2:2], w.e.ScrubText(w.pol, p[2:], "websocket", w.rep)...)
		} else if len(p) > 0 {
			p = w.e.ScrubText(w.pol, p, "websocket", w.rep)
		}
		if len(p) > 125 {
			p = p[:125]
		}
		return w.writeFrame(true, w.opcode, p)
	}
	if w.fin {
		w.msg.Close()
		w.msg = nil
		return w.emit(true)
	}
	if len(w.msgOut) > 0 {
		return w.emit(false)
	}
	return nil
}

// emit sends what the message's scrubber produced as one frame.
func (w *wsScrubber) emit(fin bool) error {
	op := byte(wsContinuation)
	if !w.msgEmitted {
		op = w.msgOpcode
	}
	err := w.writeFrame(fin, op, w.msgOut)
	w.msgOut = w.msgOut[:0]
	w.msgEmitted = true
	return err
}

// writeFrame writes one frame, masked unless it goes to the guest.
func (w *wsScrubber) writeFrame(fin bool, op byte, payload []byte) error {
	var hdr [14]byte
	hdr[0] = op
	if fin {
		hdr[0] |= 0x80
	}
	n := 2
	switch l := len(payload); {
	case l <= 125:
		hdr[1] = byte(l)
	case l <= 0xffff:
		hdr[1] = 126
		binary.BigEndian.PutUint16(hdr[2:4], uint16(l))
		n = 4
	default:
		hdr[1] = 127
		binary.BigEndian.PutUint64(hdr[2:10], uint64(l))
		n = 10
	}
	if w.server {
		frame := append(append(make([]byte, 0, n+len(payload)), hdr[:n]...), payload...)
		_, err := w.dst.Write(frame)
		return err
	}
	hdr[1] |= 0x80
	var key [4]byte
	rand.Read(key[:])
	copy(hdr[n:], key[:])
	n += 4
	frame := make([]byte, 0, n+len(payload))
	frame = append(frame, hdr[:n]...)
	for i, c := range payload {
		frame = append(frame, c^key[i&3])
	}
	_, err := w.dst.Write(frame)
	return err
}

// appendBuf is an io.Writer appending to a byte slice.
type appendBuf struct{ b *[]byte }

func (a appendBuf) Write(p []byte) (int, error) {
	*a.b = append(*a.b, p...)
	return len(p), nil
}
