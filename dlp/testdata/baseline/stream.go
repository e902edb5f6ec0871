package baseline

import (
	"bufio"
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// StreamOptions describe a body to scrub.
type StreamOptions struct {
	// ContentType picks the walker: JSON (application/json, *+json,
	// ndjson), form (application/x-www-form-urlencoded), multipart/*, or
	// text for anything else (including no type).
	ContentType string
	// ContentEncoding lists the codings applied to the body, in order
	// ("gzip", "deflate", "br", "zstd", "identity"). The body is decoded,
	// scrubbed and encoded again the same way.
	ContentEncoding string
	// Where names the body in findings; "body" when empty.
	Where string
	// MaxDecoded bounds the decoded size (a compression bomb); 1 GiB when
	// zero.
	MaxDecoded int64
}

// SupportedEncodings are the content codings Scrub undoes.
var SupportedEncodings = []string{"gzip", "x-gzip", "deflate", "br", "zstd", "identity"}

// parseEncodings reads a Content-Encoding value into the codings applied,
// in order, without identity.
func parseEncodings(ce string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(ce, ",") {
		c = strings.ToLower(strings.TrimSpace(c))
		switch c {
		case "", "identity":
		case "gzip", "x-gzip", "deflate", "br", "zstd":
			out = append(out, c)
		default:
			return nil, fmt.Errorf("%w: unsupported Content-Encoding %q (vibedom decodes %s)", ErrEncoding, c, strings.Join(SupportedEncodings, ", "))
		}
	}
	if len(out) > 4 {
		return nil, fmt.Errorf("%w: %d stacked content codings", ErrEncoding, len(out))
	}
	return out, nil
}

// Scrub copies r to w scrubbed under pol, decoding and re-encoding its
// content codings, and adds what it found to rep (which may be nil). It
// holds a bounded amount of the body in memory whatever its size. An error
// means w holds an incomplete body that must not be sent; ErrEncoding
// means the body could not be decoded and so could not be scanned.
func (e *Engine) Scrub(w io.Writer, r io.Reader, pol *Policy, o StreamOptions, rep *Report) error {
	return e.scrub(w, r, pol, o, rep, 0)
}

// scrub is Scrub for a body found compressed inside depth others.
func (e *Engine) scrub(w io.Writer, r io.Reader, pol *Policy, o StreamOptions, rep *Report, depth int) error {
	encs, err := parseEncodings(o.ContentEncoding)
	if err != nil {
		return err
	}
	if o.Where == "" {
		o.Where = "body"
	}
	if o.MaxDecoded <= 0 {
		o.MaxDecoded = 1 << 30
	}
	if !pol.any() {
		_, err := io.Copy(w, r)
		return err
	}
	// Decoders, outermost coding first.
	src := r
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for i := len(encs) - 1; i >= 0; i-- {
		d, err := newDecoder(encs[i], src)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrEncoding, encs[i], err)
		}
		if c, ok := d.(io.Closer); ok {
			closers = append(closers, c)
		}
		src = d
	}
	src = &limitReader{r: src, left: o.MaxDecoded}
	// A compressed body whose header does not say so: its magic decides.
	if depth < maxSniffDepth {
		br := bufio.NewReaderSize(src, 16)
		if coding := sniffCoding(br); coding != "" {
			var dst io.Writer = w
			var encoders []io.WriteCloser
			for i := len(encs) - 1; i >= 0; i-- {
				enc, err := newEncoder(encs[i], dst)
				if err != nil {
					return err
				}
				encoders = append(encoders, enc)
				dst = enc
			}
			if err := e.scrubSniffed(dst, br, coding, pol, o, rep, depth); err != nil {
				return err
			}
			for i := len(encoders) - 1; i >= 0; i-- {
				if err := encoders[i].Close(); err != nil {
					return err
				}
			}
			return nil
		}
		src = br
	}
	// Encoders, innermost coding first.
	dst := w
	var encoders []io.WriteCloser
	for i := len(encs) - 1; i >= 0; i-- {
		enc, err := newEncoder(encs[i], dst)
		if err != nil {
			return err
		}
		encoders = append(encoders, enc)
		dst = enc
	}
	l := e.newLayer(base{e: e, pol: pol, rep: rep, dst: dst}, o.ContentType, o.Where)
	buf := getBuf()[:32<<10]
	defer putBuf(buf)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := l.Write(buf[:n]); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if len(encs) > 0 && !errors.Is(rerr, errTooLarge) {
				return fmt.Errorf("%w: %v", ErrEncoding, rerr)
			}
			return rerr
		}
	}
	if err := l.Close(); err != nil {
		return err
	}
	for i := len(encoders) - 1; i >= 0; i-- {
		if err := encoders[i].Close(); err != nil {
			return err
		}
	}
	return nil
}

// ScrubBytes scrubs a whole body held in memory.
func (e *Engine) ScrubBytes(pol *Policy, body []byte, o StreamOptions) ([]byte, *Report, error) {
	var out bytes.Buffer
	rep := &Report{}
	err := e.Scrub(&out, bytes.NewReader(body), pol, o, rep)
	return out.Bytes(), rep, err
}

// ScrubText scrubs one short text (a header value, a URL component) as a
// single segment and returns it, or text itself when nothing changed.
func (e *Engine) ScrubText(pol *Policy, text []byte, where string, rep *Report) []byte {
	if !pol.any() || len(text) == 0 {
		return text
	}
	var out []byte
	g := &segment{e: e, pol: pol, rep: rep, out: &out}
	g.reset(where, phPlain, false)
	g.write(text)
	g.finish()
	if bytes.Equal(out, text) {
		return text
	}
	return out
}

// ScrubQuery scrubs a raw URL query (name=value&…) the way a form body is
// scrubbed, percent-encoding the placeholders.
func (e *Engine) ScrubQuery(pol *Policy, rawQuery string, rep *Report) string {
	if !pol.any() || rawQuery == "" {
		return rawQuery
	}
	var out bytes.Buffer
	f := newFormLayer(base{e: e, pol: pol, rep: rep, dst: &out}, "url")
	f.Write([]byte(rawQuery))
	f.Close()
	return out.String()
}

// ScrubPath scrubs an escaped URL path segment by segment (each segment
// percent-decoded for the scan), percent-encoding the placeholders.
func (e *Engine) ScrubPath(pol *Policy, escapedPath string, rep *Report) string {
	if !pol.any() || escapedPath == "" {
		return escapedPath
	}
	parts := strings.Split(escapedPath, "/")
	for i, p := range parts {
		if p == "" {
			continue
		}
		var out []byte
		g := &segment{e: e, pol: pol, rep: rep, out: &out}
		g.reset("url", phURL, false)
		for j := 0; j < len(p); {
			if p[j] == '%' && j+2 < len(p) && isHex(p[j+1]) && isHex(p[j+2]) {
				g.writeEsc([]byte{byte(hexVal([]byte(p[j+1 : j+3])))}, []byte(p[j:j+3]))
				j += 3
				continue
			}
			k := j + 1
			for k < len(p) && p[k] != '%' {
				k++
			}
			g.write([]byte(p[j:k]))
			j = k
		}
		g.finish()
		parts[i] = string(out)
	}
	return strings.Join(parts, "/")
}

// newLayer picks the walker for a content type.
func (e *Engine) newLayer(b base, contentType, where string) layer {
	mt, params, _ := mime.ParseMediaType(contentType)
	switch {
	case isJSONType(mt):
		return newJSONLayer(b, where)
	case mt == "application/x-www-form-urlencoded":
		return newFormLayer(b, where)
	case strings.HasPrefix(mt, "multipart/") && params["boundary"] != "":
		return newMultipartLayer(b, where, params["boundary"])
	}
	return newTextLayer(b, where)
}

var errTooLarge = errors.New("decoded body exceeds the limit")

type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, fmt.Errorf("%w: %w", ErrEncoding, errTooLarge)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

func newDecoder(coding string, r io.Reader) (io.Reader, error) {
	switch coding {
	case "gzip", "x-gzip":
		return gzip.NewReader(r)
	case "deflate":
		// RFC 9110 deflate is zlib-wrapped; some senders use raw deflate.
		br := bufio.NewReader(r)
		h, err := br.Peek(2)
		if err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
			return zlib.NewReader(br)
		}
		return flate.NewReader(br), nil
	case "br":
		return brotli.NewReader(r), nil
	case "zstd":
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return nil, fmt.Errorf("unsupported coding %q", coding)
}

func newEncoder(coding string, w io.Writer) (io.WriteCloser, error) {
	switch coding {
	case "gzip", "x-gzip":
		return gzip.NewWriterLevel(w, gzip.DefaultCompression)
	case "deflate":
		return zlib.NewWriterLevel(w, zlib.DefaultCompression)
	case "br":
		return brotli.NewWriterLevel(w, 4), nil
	case "zstd":
		return zstd.NewWriter(w, zstd.WithEncoderConcurrency(1))
	}
	return nil, fmt.Errorf("unsupported coding %q", coding)
}

// NewStream returns a writer that scrubs what is written to it under pol,
// as one body of o.ContentType, writing the result to dst; Close scrubs
// and writes what is still held back (it does not close dst). Content
// codings are not undone here: o.ContentEncoding must be empty or
// identity (use Scrub for encoded bodies).
func (e *Engine) NewStream(dst io.Writer, pol *Policy, o StreamOptions, rep *Report) (io.WriteCloser, error) {
	encs, err := parseEncodings(o.ContentEncoding)
	if err != nil {
		return nil, err
	}
	if len(encs) > 0 {
		return nil, fmt.Errorf("%w: NewStream does not undo content codings (%s)", ErrEncoding, o.ContentEncoding)
	}
	if o.Where == "" {
		o.Where = "body"
	}
	if !pol.any() {
		return nopCloser{dst}, nil
	}
	return e.newLayer(base{e: e, pol: pol, rep: rep, dst: dst}, o.ContentType, o.Where), nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// KnownOnly returns a copy of p that acts only on known values and
// private keys (for data that is not text: recognizers would mangle it).
func (p Policy) KnownOnly() Policy {
	for i := range p.act {
		if Category(i) != CatSecret && Category(i) != CatPrivateKey {
			p.act[i] = Pass
		}
	}
	return p
}
