package baseline

import (
	"bytes"
	"mime"
	"strings"
)

// appendWriter appends to a byte slice (a layer's output buffer).
type appendWriter struct{ out *[]byte }

func (a appendWriter) Write(p []byte) (int, error) {
	*a.out = append(*a.out, p...)
	return len(p), nil
}

// maxPartHeader bounds a multipart part's header block; a longer one turns
// the rest of the body into plain text.
const maxPartHeader = 16 << 10

// multipartLayer scrubs a multipart body: each part's content by its own
// Content-Type (JSON, form, text; parts that are not text are searched for
// known values and private keys only, so binary data is not mangled by
// recognizers), part headers as text, delimiters unchanged.
type multipartLayer struct {
	base
	where    string
	open     []byte // "--boundary"
	delim    []byte // "\r\n--boundary"
	buf      []byte
	started  bool // past the check for a delimiter at the very start
	inHeader bool
	done     bool // past the closing delimiter
	part     layer
	binPol   Policy
}

func newMultipartLayer(b base, where, boundary string) *multipartLayer {
	m := &multipartLayer{base: b, where: where}
	m.open = []byte("--" + boundary)
	m.delim = []byte("\r\n--" + boundary)
	m.binPol = b.pol.KnownOnly()
	m.part = m.sub(m.pol, "text/plain", where+":preamble")
	return m
}

// sub makes the layer for a part's content, writing into m.out.
func (m *multipartLayer) sub(pol *Policy, contentType, where string) layer {
	b := base{e: m.e, pol: pol, rep: m.rep, dst: appendWriter{&m.out}}
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case contentType == "" || strings.HasPrefix(mt, "text/"):
		return newTextLayer(b, where)
	case isJSONType(mt):
		return newJSONLayer(b, where)
	case mt == "application/x-www-form-urlencoded":
		return newFormLayer(b, where)
	case isTextType(mt):
		return newTextLayer(b, where)
	}
	b.pol = &m.binPol
	return newTextLayer(b, where)
}

func (m *multipartLayer) Write(p []byte) (int, error) {
	m.buf = append(m.buf, p...)
	m.step(false)
	return len(p), m.flush()
}

func (m *multipartLayer) Close() error {
	m.step(true)
	if m.inHeader {
		// A header block that never ended: scrub it as text.
		t := m.sub(m.pol, "text/plain", m.where)
		t.Write(m.buf)
		t.Close()
		m.buf = m.buf[:0]
	} else {
		m.part.Write(m.buf)
		m.buf = m.buf[:0]
		m.part.Close()
	}
	return m.flush()
}

// step consumes as much of m.buf as can be decided.
func (m *multipartLayer) step(eof bool) {
	for {
		if m.done {
			m.part.Write(m.buf)
			m.buf = m.buf[:0]
			return
		}
		if m.inHeader {
			k := bytes.Index(m.buf, []byte("\r\n\r\n"))
			if k < 0 {
				if len(m.buf) > maxPartHeader {
					// Not a real header block: the rest is text.
					m.inHeader, m.done = false, true
					m.part = m.sub(m.pol, "text/plain", m.where)
					continue
				}
				return
			}
			hdr := m.buf[:k+4]
			m.writeHeader(hdr)
			m.part = m.sub(m.partPolicy(hdr), headerValue(hdr, "content-type"), m.where)
			m.buf = m.buf[k+4:]
			m.inHeader = false
			continue
		}
		// In a part's content (or the preamble): find the next delimiter.
		at, dl := -1, 0
		if !m.started {
			if len(m.buf) < len(m.open) && !eof && bytes.HasPrefix(m.open, m.buf) {
				return
			}
			m.started = true
			if bytes.HasPrefix(m.buf, m.open) {
				at, dl = 0, len(m.open)
			}
		}
		if at < 0 {
			if k := bytes.Index(m.buf, m.delim); k >= 0 {
				at, dl = k, len(m.delim)
			}
		}
		if at < 0 {
			// Keep a tail that could be the start of a delimiter.
			safe := len(m.buf) - len(m.delim) + 1
			if eof {
				safe = len(m.buf)
			}
			if safe > 0 {
				m.part.Write(m.buf[:safe])
				m.buf = append(m.buf[:0], m.buf[safe:]...)
			}
			return
		}
		// The delimiter line: "--boundary" then "--" (the end) or
		// optional blanks and CRLF.
		rest := m.buf[at+dl:]
		lineEnd := bytes.Index(rest, []byte("\r\n"))
		closing := bytes.HasPrefix(rest, []byte("--"))
		if !closing && lineEnd < 0 {
			if len(rest) > 256 {
				lineEnd = 0 // not a delimiter line after all: treat as one anyway
			} else if !eof {
				return
			}
		}
		if !closing && lineEnd >= 0 && len(bytes.Trim(rest[:lineEnd], " \t")) != 0 {
			// "--boundaryXYZ": the boundary is a prefix of other text.
			m.part.Write(m.buf[:at+dl])
			m.buf = append(m.buf[:0], m.buf[at+dl:]...)
			continue
		}
		m.part.Write(m.buf[:at])
		m.part.Close()
		if closing {
			m.out = append(m.out, m.buf[at:at+dl+2]...)
			m.buf = append(m.buf[:0], m.buf[at+dl+2:]...)
			m.done = true
			m.part = m.sub(m.pol, "text/plain", m.where+":epilogue")
			continue
		}
		if lineEnd < 0 {
			lineEnd = len(rest)
		} else {
			lineEnd += 2
		}
		m.out = append(m.out, m.buf[at:at+dl+lineEnd]...)
		m.buf = append(m.buf[:0], m.buf[at+dl+lineEnd:]...)
		m.inHeader = true
	}
}

// writeHeader scrubs a part's header block as text (a file name can carry
// personal data) into the output.
func (m *multipartLayer) writeHeader(hdr []byte) {
	t := newTextLayer(base{e: m.e, pol: m.pol, rep: m.rep, dst: appendWriter{&m.out}}, m.where+":part-header")
	t.Write(hdr)
	t.Close()
}

func (m *multipartLayer) partPolicy(hdr []byte) *Policy {
	mt, _, _ := mime.ParseMediaType(headerValue(hdr, "content-type"))
	if mt == "" || strings.HasPrefix(mt, "text/") || isJSONType(mt) || isTextType(mt) || mt == "application/x-www-form-urlencoded" {
		return m.pol
	}
	return &m.binPol
}

// headerValue finds a header in a MIME header block (case-insensitive
// name), or "".
func headerValue(hdr []byte, name string) string {
	for _, line := range strings.Split(string(hdr), "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func isJSONType(mt string) bool {
	return mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "application/x-ndjson" || mt == "application/jsonl"
}

// isTextType reports media types that are text though not text/*.
func isTextType(mt string) bool {
	switch mt {
	case "application/xml", "application/javascript", "application/x-yaml", "application/yaml",
		"application/graphql", "application/sql", "application/x-sh", "application/toml":
		return true
	}
	return strings.HasSuffix(mt, "+xml")
}
