package overlay

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// git's base85 alphabet (base85.c): digits, upper, lower, then punctuation.
const base85Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"

var base85Value = func() (v [256]int8) {
	for i := range v {
		v[i] = -1
	}
	for i := 0; i < len(base85Alphabet); i++ {
		v[base85Alphabet[i]] = int8(i)
	}
	return v
}()

// base85Encode appends the base85 form of data, whose length is a multiple
// of 4 (callers pad with zeros): each big-endian 32-bit group becomes five
// digits, most significant first.
func base85Encode(dst []byte, data []byte) []byte {
	for len(data) >= 4 {
		v := uint32(data[0])<<24 | uint32(data[1])<<16 | uint32(data[2])<<8 | uint32(data[3])
		var d [5]byte
		for i := 4; i >= 0; i-- {
			d[i] = base85Alphabet[v%85]
			v /= 85
		}
		dst = append(dst, d[:]...)
		data = data[4:]
	}
	return dst
}

var errBase85 = errors.New("bad base85 data")

// base85Decode decodes groups of five digits into n bytes.
func base85Decode(src string, n int) ([]byte, error) {
	if len(src)%5 != 0 || len(src)/5*4 < n || len(src)/5*4-n >= 4 {
		return nil, errBase85
	}
	out := make([]byte, 0, len(src)/5*4)
	for i := 0; i < len(src); i += 5 {
		var v uint64
		for j := 0; j < 5; j++ {
			d := base85Value[src[i+j]]
			if d < 0 {
				return nil, errBase85
			}
			v = v*85 + uint64(d)
		}
		if v > 0xffffffff {
			return nil, errBase85
		}
		out = append(out, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	return out[:n], nil
}

// writeBinaryLiteral writes one "literal" hunk of a GIT binary patch: the
// zlib-deflated data in base85 lines of at most 52 bytes, each led by a
// length character ('A'–'Z' for 1–26, 'a'–'z' for 27–52), then a blank line.
func writeBinaryLiteral(w *bytes.Buffer, data []byte) {
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestSpeed)
	zw.Write(data)
	zw.Close()
	fmt.Fprintf(w, "literal %d\n", len(data))
	comp := z.Bytes()
	line := make([]byte, 0, 72)
	var pad [52]byte
	for len(comp) > 0 {
		n := min(len(comp), 52)
		line = line[:0]
		if n <= 26 {
			line = append(line, byte('A'+n-1))
		} else {
			line = append(line, byte('a'+n-27))
		}
		chunk := comp[:n]
		if n%4 != 0 {
			copy(pad[:], chunk)
			clear(pad[n : (n+3)/4*4])
			chunk = pad[:(n+3)/4*4]
		}
		line = base85Encode(line, chunk)
		line = append(line, '\n')
		w.Write(line)
		comp = comp[n:]
	}
	w.WriteByte('\n')
}

// binaryHunk is one parsed hunk of a GIT binary patch.
type binaryHunk struct {
	delta bool
	size  int64  // the literal's or the delta result's size
	data  []byte // inflated: the content, or the delta instructions
}

// maxBinarySize bounds the inflated size of one binary hunk read from a
// patch (the patch is untrusted).
const maxBinarySize = 1 << 30

// parseBinaryHunk reads "literal N" or "delta N" and its base85 lines up to
// the blank line that ends them. It returns the number of lines consumed.
func parseBinaryHunk(lines []string) (*binaryHunk, int, error) {
	if len(lines) == 0 {
		return nil, 0, errors.New("missing binary hunk")
	}
	head := strings.TrimSuffix(lines[0], "\n")
	var h binaryHunk
	var num string
	switch {
	case strings.HasPrefix(head, "literal "):
		num = head[len("literal "):]
	case strings.HasPrefix(head, "delta "):
		h.delta, num = true, head[len("delta "):]
	default:
		return nil, 0, fmt.Errorf("expected literal or delta, got %q", truncate(head))
	}
	size, err := strconv.ParseInt(num, 10, 64)
	if err != nil || size < 0 || size > maxBinarySize {
		return nil, 0, fmt.Errorf("bad binary hunk size %q", truncate(num))
	}
	h.size = size
	var comp []byte
	i := 1
	for ; i < len(lines); i++ {
		l := strings.TrimSuffix(lines[i], "\n")
		if l == "" {
			break
		}
		c := l[0]
		var n int
		switch {
		case c >= 'A' && c <= 'Z':
			n = int(c-'A') + 1
		case c >= 'a' && c <= 'z':
			n = int(c-'a') + 27
		default:
			return nil, 0, fmt.Errorf("bad binary line length %q", c)
		}
		b, err := base85Decode(l[1:], n)
		if err != nil {
			return nil, 0, fmt.Errorf("binary hunk line %d: %w", i, err)
		}
		comp = append(comp, b...)
		if int64(len(comp)) > maxBinarySize {
			return nil, 0, errors.New("binary hunk too large")
		}
	}
	if i == len(lines) {
		return nil, 0, errors.New("binary hunk not ended by a blank line")
	}
	zr, err := zlib.NewReader(bytes.NewReader(comp))
	if err != nil {
		return nil, 0, fmt.Errorf("inflate binary hunk: %w", err)
	}
	limit := size
	if h.delta {
		limit = maxBinarySize
	}
	data, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, 0, fmt.Errorf("inflate binary hunk: %w", err)
	}
	if !h.delta && int64(len(data)) != size {
		return nil, 0, fmt.Errorf("binary literal is %d bytes, header says %d", len(data), size)
	}
	h.data = data
	return &h, i + 1, nil
}

// applyDelta applies a git delta (varint source size, varint result size,
// then copy and insert instructions) to src.
func applyDelta(src, delta []byte) ([]byte, error) {
	bad := errors.New("bad binary delta")
	varint := func() (uint64, bool) {
		var v uint64
		for shift := uint(0); shift < 64; shift += 7 {
			if len(delta) == 0 {
				return 0, false
			}
			c := delta[0]
			delta = delta[1:]
			v |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	srcSize, ok1 := varint()
	dstSize, ok2 := varint()
	if !ok1 || !ok2 || srcSize != uint64(len(src)) || dstSize > maxBinarySize {
		return nil, bad
	}
	out := make([]byte, 0, dstSize)
	for len(delta) > 0 {
		op := delta[0]
		delta = delta[1:]
		switch {
		case op&0x80 != 0: // copy from src
			var off, size uint64
			for i := uint(0); i < 4; i++ {
				if op&(1<<i) != 0 {
					if len(delta) == 0 {
						return nil, bad
					}
					off |= uint64(delta[0]) << (8 * i)
					delta = delta[1:]
				}
			}
			for i := uint(0); i < 3; i++ {
				if op&(0x10<<i) != 0 {
					if len(delta) == 0 {
						return nil, bad
					}
					size |= uint64(delta[0]) << (8 * i)
					delta = delta[1:]
				}
			}
			if size == 0 {
				size = 0x10000
			}
			if off+size > uint64(len(src)) || uint64(len(out))+size > dstSize {
				return nil, bad
			}
			out = append(out, src[off:off+size]...)
		case op != 0: // insert op bytes
			n := int(op)
			if n > len(delta) || uint64(len(out)+n) > dstSize {
				return nil, bad
			}
			out = append(out, delta[:n]...)
			delta = delta[n:]
		default:
			return nil, bad
		}
	}
	if uint64(len(out)) != dstSize {
		return nil, bad
	}
	return out, nil
}

func truncate(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}
