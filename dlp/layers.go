package dlp

import (
	"bytes"
	"io"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// A layer is a streaming scrubber for one body format: bytes written to it
// come out scrubbed on its destination when it is flushed or closed.
type layer interface {
	io.Writer
	// Close scrubs and writes what is pending; it does not close the
	// destination.
	Close() error
}

// base holds what every layer shares: the engine, policy, report, the
// output buffer and its destination.
type base struct {
	e   *Engine
	pol *Policy
	rep *Report
	dst io.Writer
	out []byte
	pp  *pipe
}

func (b *base) newSegment() *segment {
	if b.out == nil {
		b.out = getBuf()
	}
	if b.pp == nil {
		b.pp = newPipe(b.e, b.pol, b.rep, &b.out, b.dst)
	}
	g := &segment{e: b.e, pol: b.pol, rep: b.rep, out: &b.out, dec: getBuf(), pp: b.pp}
	if sc, _ := scratchPool.Get().(*segScratch); sc != nil {
		g.esc, g.ms, g.rms, g.spans, g.views = sc.esc[:0], sc.ms[:0], sc.rms[:0], sc.spans[:0], sc.views
	}
	return g
}

// segScratch is what a segment grows besides its byte buffers: escapes,
// matches and views. It is recycled between bodies too: a 64 KB body of
// escape-heavy JSON otherwise allocates ~100 KB of escapes alone.
type segScratch struct {
	esc            []escape
	ms, rms, spans []match
	views          *viewSet
}

var scratchPool sync.Pool

// maxScratch bounds the entries a recycled slice may keep.
const maxScratch = 1 << 16

// release returns the layer's buffers to the pool; the layer is not used
// again.
func (b *base) release(segs ...*segment) {
	for _, g := range segs {
		putBuf(g.dec)
		putBuf(g.raw)
		g.dec, g.raw = nil, nil
		sc := &segScratch{views: g.views}
		if cap(g.esc) <= maxScratch {
			sc.esc = g.esc[:0]
		}
		if cap(g.ms) <= maxScratch {
			sc.ms = g.ms[:0]
		}
		if cap(g.rms) <= maxScratch {
			sc.rms = g.rms[:0]
		}
		if cap(g.spans) <= maxScratch {
			sc.spans = g.spans[:0]
		}
		if sc.views != nil {
			for i := range sc.views.vs {
				if v := &sc.views.vs[i]; cap(v.b) > 1<<20 || cap(v.edits) > maxScratch {
					putBuf(v.b)
					v.b, v.edits = nil, nil
				}
			}
		}
		g.esc, g.ms, g.rms, g.spans, g.views = nil, nil, nil, nil, nil
		scratchPool.Put(sc)
	}
	putBuf(b.out)
	b.out = nil
	if b.pp != nil {
		b.pp.release()
		b.pp = nil
	}
}

// bufPool recycles the segments' and layers' buffers between bodies (a
// body's buffers grow to a window, about 80 KiB).
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 96<<10); return &b }}

func getBuf() []byte { return (*bufPool.Get().(*[]byte))[:0] }

func putBuf(b []byte) {
	// Too small a buffer (one grown from nil) would not hold a read.
	if cap(b) >= 32<<10 && cap(b) <= 1<<20 {
		b = b[:0]
		bufPool.Put(&b)
	}
}

func (b *base) flush() error {
	if b.pp != nil {
		if ok, err := b.pp.flush(); !ok || err != nil {
			return err
		}
	}
	if len(b.out) == 0 {
		return nil
	}
	_, err := b.dst.Write(b.out)
	b.out = b.out[:0]
	return err
}

// end settles and writes everything pending (the layer's Close).
func (b *base) end() error {
	if b.pp != nil {
		b.pp.drain()
	}
	return b.flush()
}

// textLayer scrubs a body as one run of text.
type textLayer struct {
	base
	seg *segment
}

func newTextLayer(b base, where string) *textLayer {
	t := &textLayer{base: b}
	t.seg = t.newSegment()
	t.seg.reset(where, phPlain, false)
	return t
}

func (t *textLayer) Write(p []byte) (int, error) {
	t.seg.write(p)
	return len(p), t.flush()
}

func (t *textLayer) Close() error {
	t.seg.finish()
	err := t.end()
	t.release(t.seg)
	return err
}

// jsonLayer walks JSON: each string (key or value) is its own segment,
// decoded from its escapes, and so is each run of text between strings
// (numbers, and whatever a malformed body puts there). A string under a
// secret-named key is also checked whole as a password. Bytes of untouched
// spans pass through unchanged, so the output is the input byte for byte
// but for the placeholders, and stays valid JSON.
type jsonLayer struct {
	base
	where      string
	outer, str *segment
	state      uint8
	esc        []byte // the escape being read, from its backslash
	key        []byte // decoded start of the current string
	keyLong    bool
	lastStr    []byte // the last string, a candidate key
	lastOK     bool
	curKey     []byte
	afterColon bool
}

const (
	jsOutside = iota
	jsString
	jsEscape
)

func newJSONLayer(b base, where string) *jsonLayer {
	j := &jsonLayer{base: b, where: where}
	j.outer, j.str = j.newSegment(), j.newSegment()
	j.outer.reset(where, phJSONValue, false)
	return j
}

func (j *jsonLayer) Write(p []byte) (int, error) {
	// The positions of the next quote and backslash are searched once per
	// Write: they are valid for this p only (a caller may pass the same
	// buffer again with other bytes in it).
	sc := stringScan{nextQ: -1, nextB: -1}
	i := 0
	for i < len(p) {
		switch j.state {
		case jsOutside:
			k := bytes.IndexByte(p[i:], '"')
			chunk := p[i:]
			if k >= 0 {
				chunk = p[i : i+k]
			}
			j.trackKey(chunk)
			j.outer.write(chunk)
			if k < 0 {
				i = len(p)
				continue
			}
			i += k + 1
			j.outer.finish()
			j.outer.reset(j.where, phJSONValue, false)
			j.out = append(j.out, '"')
			keyed := j.afterColon && secretKeyName(j.curKey)
			j.afterColon = false
			j.str.reset(j.where, phPlain, keyed)
			j.key, j.keyLong = j.key[:0], false
			j.state = jsString
		case jsString:
			k := sc.end(p, i)
			j.str.write(p[i:k])
			j.keep(p[i:k])
			i = k
			if k == len(p) {
				continue
			}
			i++
			if p[k] == '"' {
				j.endString()
				continue
			}
			// The common short escapes (\n, \t, \") in one step.
			if i < len(p) {
				if d, ok := jsonShortEscape(p[i]); ok {
					j.str.writeEsc1(d, p[k:i+1])
					if !j.keyLong {
						j.keep([]byte{d})
					}
					i++
					// Escapes often come in pairs (\n\t).
					for i+1 < len(p) && p[i] == '\\' {
						d, ok := jsonShortEscape(p[i+1])
						if !ok {
							break
						}
						j.str.writeEsc1(d, p[i:i+2])
						if !j.keyLong {
							j.keep([]byte{d})
						}
						i += 2
					}
					continue
				}
				// \uXXXX outside the surrogates in one step too
				// (Go's encoder writes < > & so).
				if p[i] == 'u' && i+4 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) && isHex(p[i+3]) && isHex(p[i+4]) {
					if r := rune(hexVal(p[i+1 : i+5])); !utf16.IsSurrogate(r) {
						var buf [4]byte
						d := buf[:utf8.EncodeRune(buf[:], r)]
						j.str.writeEsc(d, p[k:i+5])
						j.keep(d)
						i += 5
						continue
					}
				}
			}
			j.esc = append(j.esc[:0], '\\')
			j.state = jsEscape
		case jsEscape:
			j.esc = append(j.esc, p[i])
			i++
			j.escape()
		}
	}
	return len(p), j.flush()
}

// stringScan remembers, within one Write, where the next quote and
// backslash are, so a long string with many escapes is searched once per
// byte.
type stringScan struct{ nextQ, nextB int }

// end returns the index of the next quote or backslash in p at or after i
// (len(p) if none). p must be the same slice at every call.
func (s *stringScan) end(p []byte, i int) int {
	if s.nextQ < i {
		s.nextQ = indexFrom(p, i, '"')
	}
	if s.nextB < i {
		s.nextB = indexFrom(p, i, '\\')
	}
	return min(s.nextQ, s.nextB)
}

func indexFrom(p []byte, i int, c byte) int {
	if k := bytes.IndexByte(p[i:], c); k >= 0 {
		return i + k
	}
	return len(p)
}

// trackKey follows "key": so the next string knows its key.
func (j *jsonLayer) trackKey(chunk []byte) {
	for _, c := range chunk {
		switch c {
		case ' ', '\t', '\r', '\n':
		case ':':
			if j.lastOK {
				j.curKey = append(j.curKey[:0], j.lastStr...)
				j.afterColon = true
			}
			j.lastOK = false
		default:
			j.lastOK, j.afterColon = false, false
		}
	}
}

func (j *jsonLayer) keep(d []byte) {
	if j.keyLong {
		return
	}
	if len(j.key)+len(d) > 64 {
		j.keyLong = true
		return
	}
	j.key = append(j.key, d...)
}

func (j *jsonLayer) endString() {
	j.str.finish()
	j.out = append(j.out, '"')
	j.lastStr = append(j.lastStr[:0], j.key...)
	j.lastOK = !j.keyLong
	j.state = jsOutside
}

// escape decodes j.esc once it is complete. A malformed escape passes
// through as text; a quote that ends the string inside it ends the string.
func (j *jsonLayer) escape() {
	e := j.esc
	if len(e) == 2 {
		if e[1] == 'u' {
			return // four hex digits follow
		}
		d, ok := jsonShortEscape(e[1])
		if !ok {
			j.bad()
			return
		}
		j.str.writeEsc([]byte{d}, e)
		j.keep([]byte{d})
		j.state = jsString
		return
	}
	// \uXXXX, possibly \uXXXX\uXXXX for a surrogate pair.
	last := e[len(e)-1]
	switch {
	case len(e) <= 6:
		if !isHex(last) {
			j.bad()
			return
		}
		if len(e) < 6 {
			return
		}
		r := rune(hexVal(e[2:6]))
		if utf16.IsSurrogate(r) && r < 0xDC00 {
			return // a high surrogate: its low half should follow
		}
		j.emitRune(r, e)
	case len(e) == 7:
		if last != '\\' {
			j.splitSurrogate()
			return
		}
	case len(e) == 8:
		if last != 'u' {
			j.splitSurrogate()
			return
		}
	default:
		if !isHex(last) {
			j.splitSurrogate()
			return
		}
		if len(e) < 12 {
			return
		}
		r := utf16.DecodeRune(rune(hexVal(e[2:6])), rune(hexVal(e[8:12])))
		if r == utf8.RuneError {
			j.splitSurrogate()
			return
		}
		j.emitRune(r, e)
	}
}

func (j *jsonLayer) emitRune(r rune, raw []byte) {
	var buf [4]byte
	n := utf8.EncodeRune(buf[:], r)
	j.str.writeEsc(buf[:n], raw)
	j.keep(buf[:n])
	j.state = jsString
}

// splitSurrogate handles a high surrogate not followed by a low one: it
// stands alone (as U+FFFD) and the bytes after it are read again.
func (j *jsonLayer) splitSurrogate() {
	rest := append([]byte(nil), j.esc[6:]...)
	j.emitRune(utf8.RuneError, j.esc[:6])
	j.replay(rest)
}

// bad passes a malformed escape through as text, but its last byte is
// read again (it may be the closing quote or a new escape).
func (j *jsonLayer) bad() {
	e := j.esc
	last := e[len(e)-1]
	j.str.write(e[:len(e)-1])
	j.keep(e[:len(e)-1])
	j.state = jsString
	j.replay([]byte{last})
}

// replay feeds bytes through the string states again.
func (j *jsonLayer) replay(b []byte) {
	for _, c := range b {
		switch j.state {
		case jsString:
			switch c {
			case '"':
				j.endString()
			case '\\':
				j.esc = append(j.esc[:0], '\\')
				j.state = jsEscape
			default:
				j.str.write([]byte{c})
				j.keep([]byte{c})
			}
		case jsEscape:
			j.esc = append(j.esc, c)
			j.escape()
		case jsOutside:
			// Only reachable after a quote ended the string: the rest is
			// outside text.
			j.trackKey([]byte{c})
			j.outer.write([]byte{c})
		}
	}
}

func (j *jsonLayer) Close() error {
	switch j.state {
	case jsEscape:
		j.str.write(j.esc)
		j.str.finish()
	case jsString:
		j.str.finish()
	default:
		j.outer.finish()
	}
	err := j.end()
	j.release(j.outer, j.str)
	return err
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(b []byte) int {
	v := 0
	for _, c := range b {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= int(c - '0')
		case c >= 'a' && c <= 'f':
			v |= int(c-'a') + 10
		default:
			v |= int(c-'A') + 10
		}
	}
	return v
}

// formLayer scrubs application/x-www-form-urlencoded text (and URL
// queries): each name and each value is a segment, percent- and
// plus-decoded; a value under a secret-named field is also checked whole
// as a password. Placeholders are written percent-encoded.
type formLayer struct {
	base
	where   string
	seg     *segment
	inValue bool
	pct     []byte
	name    []byte
	nameBig bool
}

func newFormLayer(b base, where string) *formLayer {
	f := &formLayer{base: b, where: where}
	f.seg = f.newSegment()
	f.seg.reset(where, phURL, false)
	return f
}

func (f *formLayer) Write(p []byte) (int, error) {
	for i := 0; i < len(p); {
		if len(f.pct) > 0 {
			f.pct = append(f.pct, p[i])
			i++
			f.percent()
			continue
		}
		k := i
		for k < len(p) && p[k] != '&' && p[k] != '=' && p[k] != '%' && p[k] != '+' {
			k++
		}
		f.seg.write(p[i:k])
		f.keepName(p[i:k])
		if k == len(p) {
			break
		}
		i = k + 1
		switch c := p[k]; c {
		case '&':
			f.seg.finish()
			f.out = append(f.out, '&')
			f.inValue = false
			f.name, f.nameBig = f.name[:0], false
			f.seg.reset(f.where, phURL, false)
		case '=':
			if f.inValue {
				f.seg.write([]byte{'='})
				continue
			}
			f.seg.finish()
			f.out = append(f.out, '=')
			f.inValue = true
			f.seg.reset(f.where, phURL, !f.nameBig && secretKeyName(f.name))
		case '+':
			f.seg.writeEsc([]byte{' '}, []byte{'+'})
			f.keepName([]byte{' '})
		case '%':
			f.pct = append(f.pct[:0], '%')
		}
	}
	return len(p), f.flush()
}

func (f *formLayer) keepName(d []byte) {
	if f.inValue || f.nameBig {
		return
	}
	if len(f.name)+len(d) > 64 {
		f.nameBig = true
		return
	}
	f.name = append(f.name, d...)
}

func (f *formLayer) percent() {
	e := f.pct
	if !isHex(e[len(e)-1]) {
		// Not an escape: the '%' passes as text; read the rest again.
		rest := append([]byte(nil), e[1:]...)
		f.pct = f.pct[:0]
		f.seg.write([]byte{'%'})
		f.keepName([]byte{'%'})
		f.Write(rest)
		return
	}
	if len(e) < 3 {
		return
	}
	d := []byte{byte(hexVal(e[1:3]))}
	f.seg.writeEsc(d, e)
	f.keepName(d)
	f.pct = f.pct[:0]
}

func (f *formLayer) Close() error {
	if len(f.pct) > 0 {
		f.seg.write(f.pct)
		f.pct = f.pct[:0]
	}
	f.seg.finish()
	err := f.end()
	f.release(f.seg)
	return err
}

// jsonShortEscape returns the byte a JSON two-character escape \c stands
// for; ok is false for \u (four hex digits follow) and for anything JSON
// does not define.
func jsonShortEscape(c byte) (d byte, ok bool) {
	switch c {
	case '"', '\\', '/':
		return c, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}
