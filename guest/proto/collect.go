package proto

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The collection stream is what proto.CollectCommand writes on stdout: the
// overlay's change set and the content of every added or modified regular
// file, in one pass over one channel. It is a magic line, then frames:
//
//	kind     1 byte   FrameChangeSet, FrameFile or FrameEnd
//	pathLen  2 bytes  big-endian; 0 except for FrameFile
//	path     pathLen bytes, slash-separated, relative to the overlay root
//	size     8 bytes  big-endian, the body's length
//	body     size bytes
//	sha256   32 bytes, the SHA-256 of body
//
// The first frame is FrameChangeSet (the change set JSON), then one
// FrameFile per file sent, in strictly increasing byte order of path, then
// FrameEnd, whose body is the number of FrameFile frames as 8 bytes
// big-endian, then the end of the stream. The guest writes it; the host
// reads it with CollectReader, which trusts none of it.
const CollectMagic = "vibedom-collect/1\n"

// Frame kinds of the collection stream.
const (
	FrameChangeSet byte = 'C'
	FrameFile      byte = 'F'
	FrameEnd       byte = 'E'
)

// ErrCollectStream means the collection stream broke its format or a limit.
// Nothing after the error may be used.
var ErrCollectStream = errors.New("invalid collection stream")

// CollectWriter writes a collection stream. It is the guest's side.
type CollectWriter struct {
	w   *bufio.Writer
	buf []byte
}

// NewCollectWriter writes the magic line to w and returns a writer for the
// frames. Call Flush at the end.
func NewCollectWriter(w io.Writer) (*CollectWriter, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	if _, err := bw.WriteString(CollectMagic); err != nil {
		return nil, err
	}
	return &CollectWriter{w: bw, buf: make([]byte, 256<<10)}, nil
}

// Frame writes one frame whose body is exactly size bytes read from body.
// It fails, leaving a stream the reader will refuse, when body ends early.
// Bytes past size are not read.
func (c *CollectWriter) Frame(kind byte, path string, size int64, body io.Reader) error {
	if len(path) > 0xffff || size < 0 {
		return fmt.Errorf("collection frame for %q: path or size out of range", path)
	}
	var hdr [1 + 2]byte
	hdr[0] = kind
	binary.BigEndian.PutUint16(hdr[1:], uint16(len(path)))
	if _, err := c.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := c.w.WriteString(path); err != nil {
		return err
	}
	var sz [8]byte
	binary.BigEndian.PutUint64(sz[:], uint64(size))
	if _, err := c.w.Write(sz[:]); err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(c.w, h), io.LimitReader(body, size), c.buf)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("collection frame for %q: %d bytes read, %d announced (did the file change?)", path, n, size)
	}
	_, err = c.w.Write(h.Sum(nil))
	return err
}

// End writes the end frame carrying the number of file frames.
func (c *CollectWriter) End(files int64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(files))
	return c.Frame(FrameEnd, "", 8, bytes.NewReader(b[:]))
}

// Flush writes what is buffered.
func (c *CollectWriter) Flush() error { return c.w.Flush() }

// CollectLimits bound what a CollectReader accepts. A zero field refuses
// every frame that needs it.
type CollectLimits struct {
	// MaxPath is the longest path of a file frame, in bytes.
	MaxPath int
	// MaxChangeSet is the largest change set frame.
	MaxChangeSet int64
	// MaxFile is the largest file frame.
	MaxFile int64
}

// Frame is the header of one frame of a collection stream.
type Frame struct {
	Kind byte
	Path string
	Size int64
}

// CollectReader reads a collection stream the guest wrote. It checks the
// format and the limits before it reads a body, and the SHA-256 trailer of
// every body it hands out: a body reader returns an error instead of its
// last bytes' EOF when the trailer does not match what was read.
type CollectReader struct {
	r    *bufio.Reader
	lim  CollectLimits
	body *FrameBody // the current frame's body, nil when consumed
}

// NewCollectReader reads and checks the magic line.
func NewCollectReader(r io.Reader, lim CollectLimits) (*CollectReader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(CollectMagic))
	if _, err := io.ReadFull(br, magic); err != nil {
		return nil, fmt.Errorf("%w: no header: %v", ErrCollectStream, unexpected(err))
	}
	if string(magic) != CollectMagic {
		return nil, fmt.Errorf("%w: wrong header (update vibedom-guest and vibedom together)", ErrCollectStream)
	}
	return &CollectReader{r: br, lim: lim}, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Next reads the next frame's header, after skipping (and checking) what is
// left of the previous body. Kinds, path lengths and sizes are checked
// against the limits before any body byte is read.
func (c *CollectReader) Next() (Frame, error) {
	if c.body != nil {
		if _, err := io.Copy(io.Discard, c.body); err != nil {
			return Frame{}, err
		}
		c.body = nil
	}
	var hdr [3]byte
	if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
		return Frame{}, fmt.Errorf("%w: frame header: %v", ErrCollectStream, unexpected(err))
	}
	f := Frame{Kind: hdr[0]}
	plen := int(binary.BigEndian.Uint16(hdr[1:]))
	var max int64
	switch f.Kind {
	case FrameChangeSet:
		max = c.lim.MaxChangeSet
	case FrameFile:
		max = c.lim.MaxFile
		if plen == 0 || plen > c.lim.MaxPath {
			return Frame{}, fmt.Errorf("%w: file frame path of %d bytes (1 to %d allowed)", ErrCollectStream, plen, c.lim.MaxPath)
		}
	case FrameEnd:
		max = 8
	default:
		return Frame{}, fmt.Errorf("%w: unknown frame kind 0x%02x", ErrCollectStream, f.Kind)
	}
	if f.Kind != FrameFile && plen != 0 {
		return Frame{}, fmt.Errorf("%w: path on a frame of kind %q", ErrCollectStream, f.Kind)
	}
	path := make([]byte, plen)
	if _, err := io.ReadFull(c.r, path); err != nil {
		return Frame{}, fmt.Errorf("%w: frame path: %v", ErrCollectStream, unexpected(err))
	}
	f.Path = string(path)
	var sz [8]byte
	if _, err := io.ReadFull(c.r, sz[:]); err != nil {
		return Frame{}, fmt.Errorf("%w: frame size: %v", ErrCollectStream, unexpected(err))
	}
	u := binary.BigEndian.Uint64(sz[:])
	if u > uint64(max) || (f.Kind == FrameEnd && u != 8) {
		return Frame{}, fmt.Errorf("%w: frame of kind %q announces %d bytes (at most %d allowed)", ErrCollectStream, f.Kind, u, max)
	}
	f.Size = int64(u)
	c.body = &FrameBody{r: c.r, left: f.Size, h: sha256.New()}
	return f, nil
}

// Body reads the current frame's body: exactly its size, then an error
// unless the trailer matches the SHA-256 of what was read (io.EOF only
// then). Sum gives that hash once the body was read to its end.
func (c *CollectReader) Body() *FrameBody { return c.body }

// End checks that the stream ends right after the current frame (its body
// read to the end): no trailing bytes.
func (c *CollectReader) End() error {
	if c.body != nil {
		if _, err := io.Copy(io.Discard, c.body); err != nil {
			return err
		}
		c.body = nil
	}
	var b [1]byte
	if n, _ := io.ReadFull(c.r, b[:]); n != 0 {
		return fmt.Errorf("%w: data after the end frame", ErrCollectStream)
	}
	return nil
}

// FrameBody is the body of one frame (see CollectReader.Body).
type FrameBody struct {
	r    *bufio.Reader
	left int64
	h    interface {
		io.Writer
		Sum([]byte) []byte
	}
	done bool
	err  error
	sum  [32]byte
}

// Sum is the SHA-256 of the body, valid once Read returned io.EOF.
func (b *FrameBody) Sum() [32]byte { return b.sum }

// Read reads the body; see CollectReader.Body.
func (b *FrameBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.left == 0 {
		if !b.done {
			b.done = true
			var want [32]byte
			if _, err := io.ReadFull(b.r, want[:]); err != nil {
				b.err = fmt.Errorf("%w: frame hash: %v", ErrCollectStream, unexpected(err))
				return 0, b.err
			}
			copy(b.sum[:], b.h.Sum(nil))
			if want != b.sum {
				b.err = fmt.Errorf("%w: the body does not match its hash", ErrCollectStream)
				return 0, b.err
			}
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	b.h.Write(p[:n])
	if err != nil && !(errors.Is(err, io.EOF) && b.left == 0) {
		b.err = fmt.Errorf("%w: frame body: %v", ErrCollectStream, unexpected(err))
		return n, b.err
	}
	return n, nil
}
