package alpine

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
)

// An apk v2 file (a package, or APKINDEX.tar.gz) is concatenated gzip
// members, each a tar stream: a signature member holding one
// .SIGN.RSA[256].<key> entry, signing the next member's compressed bytes;
// then the control member (.PKGINFO and scripts) or the index member
// (APKINDEX, DESCRIPTION); a package then has its data member, whose
// compressed bytes' SHA-256 is .PKGINFO's datahash.

// Bounds on what an untrusted file may make us hold or decompress.
const (
	maxSignature  = 64 << 10  // one RSA signature
	maxControl    = 8 << 20   // a control member, decompressed
	maxPKGINFO    = 1 << 20   // .PKGINFO
	maxIndex      = 256 << 20 // an index member, decompressed
	maxEntrySize  = 2 << 30   // one file in a package
	maxDataTotal  = 8 << 30   // a package's data, decompressed
	maxEntries    = 1 << 20   // entries in one package
	maxPathLength = 4096
)

// memberReader reads the compressed stream byte-exactly (it is an
// io.ByteReader, so neither gzip nor flate reads ahead past a member's
// end) and feeds what it hands out to the current member's hashes. It
// hashes whole stretches of its buffer, not byte by byte: flate calls
// ReadByte for every compressed byte.
type memberReader struct {
	r        io.Reader
	buf      []byte
	pos, end int
	hashed   int // buf[hashed:pos] is handed out but not hashed yet
	err      error
	sha1     hash.Hash
	sha256   hash.Hash
	n        int64
}

func newMemberReader(r io.Reader) *memberReader {
	return &memberReader{r: r, buf: make([]byte, 64<<10)}
}

// startMember resets the hashes for the member about to be read.
func (m *memberReader) startMember() {
	m.hashed = m.pos
	m.sha1, m.sha256 = sha1.New(), sha256.New()
}

// flush hashes what was handed out since the last flush.
func (m *memberReader) flush() {
	if m.pos > m.hashed {
		m.sha1.Write(m.buf[m.hashed:m.pos])
		m.sha256.Write(m.buf[m.hashed:m.pos])
	}
	m.hashed = m.pos
}

// sums returns the current member's digests so far.
func (m *memberReader) sums() ([]byte, []byte) {
	m.flush()
	return m.sha1.Sum(nil), m.sha256.Sum(nil)
}

// fill refills an exhausted buffer; false when the stream has ended.
func (m *memberReader) fill() bool {
	if m.pos < m.end {
		return true
	}
	if m.err != nil {
		return false
	}
	m.flush()
	m.pos, m.end, m.hashed = 0, 0, 0
	for m.end == 0 && m.err == nil {
		m.end, m.err = m.r.Read(m.buf)
	}
	return m.end > 0
}

func (m *memberReader) Read(p []byte) (int, error) {
	if !m.fill() {
		return 0, m.err
	}
	k := copy(p, m.buf[m.pos:m.end])
	m.pos += k
	m.n += int64(k)
	return k, nil
}

func (m *memberReader) ReadByte() (byte, error) {
	if !m.fill() {
		return 0, m.err
	}
	b := m.buf[m.pos]
	m.pos++
	m.n++
	return b, nil
}

// atEOF reports whether nothing follows the last member.
func (m *memberReader) atEOF() bool {
	return !m.fill() && m.err == io.EOF
}

// apkStream walks the members of one apk v2 file.
type apkStream struct {
	file string
	mr   *memberReader
	zr   *gzip.Reader
	cur  *capReader // the current member, decompressed and bounded
}

func newAPKStream(file string, r io.Reader) *apkStream {
	return &apkStream{file: file, mr: newMemberReader(r)}
}

// member opens the next gzip member and returns a tar reader over at most
// limit decompressed bytes.
func (s *apkStream) member(what string, limit int64) (*tar.Reader, error) {
	s.mr.startMember()
	var err error
	if s.zr == nil {
		s.zr, err = gzip.NewReader(s.mr)
	} else {
		err = s.zr.Reset(s.mr)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w: %s member missing (file truncated?)", s.file, ErrFormat, what)
		}
		return nil, fmt.Errorf("%s: %w: %s member: %v", s.file, ErrFormat, what, err)
	}
	s.zr.Multistream(false)
	s.cur = &capReader{r: s.zr, left: limit, file: s.file, what: what}
	return tar.NewReader(s.cur), nil
}

// finish drains the current member to its gzip trailer (which checks its
// CRC) and returns its SHA-1 and SHA-256.
func (s *apkStream) finish(what string) (sum1, sum256 []byte, err error) {
	// Through the cap: what follows the tar stream inside the member
	// counts toward the member's bound too.
	if _, err := io.Copy(io.Discard, s.cur); err != nil {
		return nil, nil, fmt.Errorf("%s: %w: %s member: %v (file truncated or corrupted)", s.file, ErrFormat, what, unexpected(err))
	}
	s1, s256 := s.mr.sums()
	return s1, s256, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// capReader bounds a member's decompressed size.
type capReader struct {
	r          io.Reader
	left       int64
	file, what string
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, fmt.Errorf("%s: %w: %s member larger than vibedom accepts", c.file, ErrFormat, c.what)
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// maxSignatures bounds the signature entries one member may carry.
const maxSignatures = 8

// sigEntry is one .SIGN.RSA[256].<key> entry.
type sigEntry struct {
	name string
	sig  []byte
}

// signature reads the signature member: one or more signature entries
// (apk tries each; Alpine signs with one).
func (s *apkStream) signature() ([]sigEntry, error) {
	tr, err := s.member("signature", maxSignatures*(maxSignature+4096))
	if err != nil {
		return nil, err
	}
	var out []sigEntry
	for {
		h, err := tr.Next()
		if err == io.EOF && len(out) > 0 {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w: signature member: %v", s.file, ErrSignature, unexpected(err))
		}
		if _, _, ok := parseSigName(h.Name); !ok || h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s: %w: unsigned (entry %q where a signature belongs)", s.file, ErrSignature, h.Name)
		}
		if len(out) == maxSignatures {
			return nil, fmt.Errorf("%s: %w: more than %d signatures", s.file, ErrSignature, maxSignatures)
		}
		sig, err := io.ReadAll(io.LimitReader(tr, maxSignature+1))
		if err != nil || len(sig) > maxSignature || len(sig) == 0 {
			return nil, fmt.Errorf("%s: %w: signature entry unreadable", s.file, ErrSignature)
		}
		out = append(out, sigEntry{h.Name, sig})
	}
	// The signature tar has no end-of-archive blocks; the member's end
	// is the gzip trailer.
	if _, _, err := s.finish("signature"); err != nil {
		return nil, err
	}
	return out, nil
}

// files reads a member, keeping the named regular files (each at most
// max bytes), and returns them with the member's digests.
func (s *apkStream) files(what string, limit, max int64, want ...string) (map[string][]byte, []byte, []byte, error) {
	tr, err := s.member(what, limit)
	if err != nil {
		return nil, nil, nil, err
	}
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("%s: %w: %s member: %v (file truncated or corrupted)", s.file, ErrFormat, what, err)
		}
		for _, w := range want {
			if h.Name == w && h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(io.LimitReader(tr, max+1))
				if err != nil {
					return nil, nil, nil, fmt.Errorf("%s: %w: %s: %v (file truncated or corrupted)", s.file, ErrFormat, w, err)
				}
				if int64(len(b)) > max {
					return nil, nil, nil, fmt.Errorf("%s: %w: %s larger than %d bytes", s.file, ErrFormat, w, max)
				}
				out[w] = b
			}
		}
	}
	s1, s256, err := s.finish(what)
	return out, s1, s256, err
}
