package baseline

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zlib"
)

// A body may be compressed without a Content-Encoding that says so (a
// gzip file uploaded as is, or a sender hiding a value). Scrub sniffs the
// decoded body's first bytes; a gzip, zlib or zstd stream is decoded for
// the scan, to maxSniffDepth levels (gzip inside zstd …):
//
//   - The compressed bytes are held, up to sniffHold. If the decoded
//     content needs no redaction, they are sent unchanged (byte for byte);
//     otherwise the scrubbed content is sent encoded again the same way.
//   - A body longer than sniffHold is streamed: what is sent is the
//     scrubbed content encoded again, whether or not something was found.
//   - Decoding is bounded by StreamOptions.MaxDecoded (a compression bomb
//     is refused with ErrEncoding); memory stays bounded as the content is
//     streamed through the scan.
//   - A body that only looks compressed (its magic, then bytes that do not
//     decode) is scanned as it is, if the failure comes within sniffHold;
//     later, the body is refused.
const (
	maxSniffDepth = 3
	sniffHold     = 4 << 20
)

// sniffCoding returns the coding whose magic starts r's content, or "".
func sniffCoding(r *bufio.Reader) string {
	m, _ := r.Peek(4)
	switch {
	case len(m) >= 3 && m[0] == 0x1f && m[1] == 0x8b && m[2] == 8:
		return "gzip"
	case len(m) >= 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd:
		return "zstd"
	case len(m) >= 2 && m[0] == 0x78 && (m[1] == 0x01 || m[1] == 0x5e || m[1] == 0x9c || m[1] == 0xda):
		return "deflate" // zlib, as HTTP's deflate is
	}
	return ""
}

// teeHold records what is read through it, up to a limit; past it, it
// stops recording and calls over once.
type teeHold struct {
	r      *bufio.Reader
	held   bytes.Buffer
	limit  int
	over   bool
	onOver func() error
	err    error
}

func (t *teeHold) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if t.record(p[:n]) != nil {
		return n, t.err
	}
	return n, err
}

func (t *teeHold) ReadByte() (byte, error) {
	c, err := t.r.ReadByte()
	if err != nil {
		return c, err
	}
	return c, t.record([]byte{c})
}

func (t *teeHold) record(p []byte) error {
	if t.over {
		return nil
	}
	t.held.Write(p)
	if t.held.Len() > t.limit {
		t.over = true
		t.held = bytes.Buffer{}
		t.err = t.onOver()
	}
	return t.err
}

// holdWriter buffers the re-encoded output until it is known to be
// needed, then writes through.
type holdWriter struct {
	w         io.Writer
	buf       bytes.Buffer
	streaming bool
	err       error
}

func (h *holdWriter) Write(p []byte) (int, error) {
	if h.err != nil {
		return 0, h.err
	}
	if h.streaming {
		n, err := h.w.Write(p)
		h.err = err
		return n, err
	}
	return h.buf.Write(p)
}

func (h *holdWriter) stream() error {
	h.streaming = true
	_, err := h.w.Write(h.buf.Bytes())
	h.buf = bytes.Buffer{}
	h.err = err
	return err
}

// scrubSniffed scrubs the content of r, found compressed with coding.
func (e *Engine) scrubSniffed(w io.Writer, r io.Reader, coding string, pol *Policy, o StreamOptions, rep *Report, depth int) error {
	out := &holdWriter{w: w}
	rb := bufio.NewReaderSize(r, 32<<10)
	tee := &teeHold{r: rb, limit: sniffHold, onOver: out.stream}
	local := &Report{}
	err := func() error {
		var dec io.Reader
		var err error
		if coding == "deflate" {
			dec, err = zlib.NewReader(tee) // sniffed as zlib; no read-ahead
		} else {
			dec, err = newDecoder(coding, tee)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrEncoding, err)
		}
		if c, ok := dec.(io.Closer); ok {
			defer c.Close()
		}
		enc, err := newEncoder(coding, out)
		if err != nil {
			return err
		}
		inner := o
		inner.ContentEncoding = ""
		if err := e.scrub(enc, dec, pol, inner, local, depth+1); err != nil {
			return err
		}
		if err := enc.Close(); err != nil {
			return err
		}
		// Bytes after the compressed stream were not scanned.
		if _, err := tee.Read(make([]byte, 1)); err != io.EOF {
			if err == nil {
				err = errors.New("data after the compressed stream")
			}
			return fmt.Errorf("%w: %v", ErrEncoding, err)
		}
		return nil
	}()
	switch {
	case out.err != nil:
		return out.err
	case tee.err != nil:
		return tee.err
	case err != nil && errors.Is(err, errTooLarge):
		return err
	case err != nil && !tee.over:
		// Not a compressed stream after all (or one with a tail):
		// scan the bytes as they are.
		plain := o
		plain.ContentEncoding = ""
		return e.scrub(w, io.MultiReader(&tee.held, rb), pol, plain, rep, maxSniffDepth)
	case err != nil:
		return fmt.Errorf("%w: a body that began as %s data stopped decoding after %d MiB: %v", ErrEncoding, coding, sniffHold>>20, err)
	}
	rep.merge(local)
	if tee.over {
		return nil // streamed, re-encoded
	}
	if local.Redacted() == 0 {
		_, err = w.Write(tee.held.Bytes())
		return err
	}
	_, err = w.Write(out.buf.Bytes())
	return err
}
