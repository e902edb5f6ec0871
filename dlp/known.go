package dlp

import (
	"bytes"
	"encoding/base32"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Secret is a known value to scrub wherever it appears.
type Secret struct {
	// Value is the plaintext. Values shorter than MinSecretLen are not
	// matched (they would match ordinary words); values longer than
	// MaxSecretLen are matched by their first MaxSecretLen bytes.
	Value string
	// Source says where the value came from, for the audit log, e.g.
	// ".env:3 API_KEY" or "preflight aws-access-token src/aws.py:1".
	Source string
}

// String never shows the value.
func (s Secret) String() string {
	return fmt.Sprintf("secret from %s (%d bytes)", s.Source, len(s.Value))
}

// GoString keeps %#v from printing the value.
func (s Secret) GoString() string { return "dlp.Secret{" + s.String() + "}" }

// Bounds of known values.
const (
	MinSecretLen = 8
	MaxSecretLen = 4096
)

// form is the encoding a known value was found in.
type form uint8

const (
	formRaw form = iota
	formBase64
	formBase64URL
	formHex
	formURL
	formJSON
	// formLine is one line (or one secret-like token of a line) of a
	// multi-line value.
	formLine
	// Cheap obfuscations (obfuscatedForms).
	formBase32
	formRot13
	formBase64Twice
	formUTF16Base64
	formByteEscapes
	formCharCodes
	formHalf
	formSeparated
)

var formNames = [...]string{"raw", "base64", "base64url", "hex", "url", "json", "line",
	"base32", "rot13", "base64(base64)", "base64(utf-16le)", "byte escapes", "char codes", "half", "separated"}

func (f form) String() string { return formNames[f] }

// knownPattern is one encoded form of one secret.
type knownPattern struct {
	b      []byte
	secret int32
	form   form
}

// knownSet finds every pattern in one pass, through two windowIndexes:
// patterns of at least 8+knownStride-1 bytes are found by sampling the
// text every knownStride bytes; shorter ones (8 to 10 bytes) by looking
// at every position.
type knownSet struct {
	secrets []Secret
	lower   []string // the values in lower case
	pats    []knownPattern
	long    windowIndex
	short   windowIndex
	maxLen  int
}

const knownStride = 4

// windowIndex tests 8-byte windows of the text, one every stride bytes,
// against a filter of the windows its patterns hold at offsets 0 to
// stride-1 (so a pattern always covers one sampled window); the rare hits
// are looked up and checked. The filter is a blocked Bloom filter: each
// key sets two bits of one 64-bit word, so a test is one memory access
// and false hits are about the square of the words' fill (0.4 % for
// 17,000 patterns, against 3 % with one bit a key).
type windowIndex struct {
	stride int
	bitmap []uint64 // a power of two of words
	shift  uint     // 64 - log2(len(bitmap))
	byKey  map[uint64][]knownCand
	n      int
}

// bloomWord returns the word and the two bits a 64-bit key sets in a
// blocked Bloom filter of 1<<(64-shift) words. The word comes from the
// product's top bits (which every byte of the key reaches), the bits
// from two lower 6-bit fields.
func bloomWord(key uint64, shift uint) (uint64, uint64) {
	h := key * hashMul
	return h >> shift, 1<<(h>>26&63) | 1<<(h>>40&63)
}

// knownCand is a pattern whose window at offset off has a given key.
type knownCand struct {
	pat int32
	off int32
}

const hashMul = 0x9E3779B97F4A7C15

func (w *windowIndex) build(pats []knownPattern, idx []int32, stride int) {
	w.stride, w.n = stride, len(idx)
	w.byKey = map[uint64][]knownCand{}
	// About 32 bits a window (at most 256 KiB).
	logBits := uint(10)
	for logBits < 21 && 1<<logBits < 32*stride*len(idx) {
		logBits++
	}
	w.bitmap = make([]uint64, 1<<logBits/64)
	w.shift = 64 - (logBits - 6)
	for _, i := range idx {
		p := pats[i].b
		for off := 0; off < stride; off++ {
			key := binary.LittleEndian.Uint64(p[off:])
			wd, m := bloomWord(key, w.shift)
			w.bitmap[wd] |= m
			w.byKey[key] = append(w.byKey[key], knownCand{i, int32(off)})
		}
	}
}

func (w *windowIndex) scan(k *knownSet, buf []byte, from, n int, out []match) []match {
	if w.n == 0 {
		return out
	}
	buf = buf[:n]
	bm, shift := w.bitmap, w.shift
	stride := w.stride
	// Start early enough that a pattern starting at from is covered;
	// matches starting before from are dropped. The loop is kept small
	// (the rare hits are checked out of line).
	for i := max(0, from-stride+1); i <= len(buf)-8; i += stride {
		key := binary.LittleEndian.Uint64(buf[i:])
		if wd, m := bloomWord(key, shift); bm[wd]&m == m {
			out = w.check(k, buf, i, from, key, out)
		}
	}
	return out
}

// check looks at the patterns whose window at some offset is key, found
// at position i.
//
//go:noinline
func (w *windowIndex) check(k *knownSet, buf []byte, i, from int, key uint64, out []match) []match {
	for _, c := range w.byKey[key] {
		p := &k.pats[c.pat]
		st := i - int(c.off)
		if st < from || st+len(p.b) > len(buf) || !bytes.Equal(buf[st:st+len(p.b)], p.b) {
			continue
		}
		out = append(out, match{start: int32(st), end: int32(st + len(p.b)), cat: CatSecret, secret: p.secret, form: p.form})
	}
	return out
}

// newKnownSet builds the matcher for secrets (deduplicated, short ones
// dropped).
func newKnownSet(secrets []Secret) *knownSet {
	k := &knownSet{}
	seenSecret := map[string]int32{}
	seenPat := map[string]bool{}
	for _, s := range secrets {
		v := s.Value
		if len(v) > MaxSecretLen {
			v = v[:MaxSecretLen]
		}
		if len(v) < MinSecretLen {
			continue
		}
		if i, ok := seenSecret[v]; ok {
			// The same value from several places: keep them all (a few).
			if src := &k.secrets[i].Source; s.Source != "" && !strings.Contains(*src, s.Source) && strings.Count(*src, "; ") < 3 {
				*src += "; " + s.Source
			}
			continue
		}
		idx := int32(len(k.secrets))
		seenSecret[v] = idx
		k.secrets = append(k.secrets, Secret{Value: v, Source: s.Source})
		k.lower = append(k.lower, strings.ToLower(v))
		forms := encodedForms([]byte(v))
		if hexOnly(v) {
			// Case carries nothing in hex: an upper- or lower-cased
			// copy is the same value.
			forms = append(forms, encoded{[]byte(strings.ToLower(v)), formRaw}, encoded{[]byte(strings.ToUpper(v)), formRaw})
		}
		for _, part := range secretParts(v) {
			forms = append(forms, encoded{[]byte(part), formLine})
		}
		for _, enc := range forms {
			if len(enc.b) < MinSecretLen || seenPat[string(enc.b)] {
				continue
			}
			seenPat[string(enc.b)] = true
			k.pats = append(k.pats, knownPattern{b: enc.b, secret: idx, form: enc.form})
		}
	}
	var long, short []int32
	for i, p := range k.pats {
		if len(p.b) >= 8+knownStride-1 {
			long = append(long, int32(i))
		} else {
			short = append(short, int32(i))
		}
		k.maxLen = max(k.maxLen, len(p.b))
	}
	k.long.build(k.pats, long, knownStride)
	k.short.build(k.pats, short, 1)
	return k
}

// scan appends a match for every pattern occurrence starting in [from, n)
// and ending by n.
func (k *knownSet) scan(buf []byte, from, n int, out []match) []match {
	if len(k.pats) == 0 || n-from < MinSecretLen {
		return out
	}
	out = k.long.scan(k, buf, from, n, out)
	return k.short.scan(k, buf, from, n, out)
}

type encoded struct {
	b    []byte
	form form
}

// encodedForms returns the forms a secret is searched in: raw; base64 in
// both alphabets at each of the three byte alignments (trimmed to the
// characters that depend on the secret alone, so the secret is found
// inside a larger encoded blob); hex in both cases; percent-encoded (query,
// path, and every byte); JSON-escaped (Go's escaping with and without HTML
// escapes, and every character as \uXXXX in both cases).
func encodedForms(s []byte) []encoded {
	out := []encoded{{s, formRaw}}
	for _, a := range []int{0, 1, 2} {
		out = append(out, encoded{b64Aligned(base64.RawStdEncoding, s, a), formBase64})
		out = append(out, encoded{b64Aligned(base64.RawURLEncoding, s, a), formBase64URL})
	}
	h := []byte(hex.EncodeToString(s))
	out = append(out, encoded{h, formHex}, encoded{bytes.ToUpper(h), formHex})
	str := string(s)
	out = append(out,
		encoded{[]byte(url.QueryEscape(str)), formURL},
		encoded{[]byte(url.PathEscape(str)), formURL},
		encoded{percentAll(s, upperHex), formURL},
		encoded{percentAll(s, lowerHex), formURL},
	)
	out = append(out, obfuscatedForms(s)...)
	if utf8.Valid(s) {
		out = append(out, encoded{jsonEscaped(str, true), formJSON}, encoded{jsonEscaped(str, false), formJSON})
		out = append(out, encoded{unicodeEscapeAll(str, lowerHex), formJSON},
			encoded{unicodeEscapeAll(str, upperHex), formJSON})
		// A JSON encoder that escapes only the solidus.
		if strings.Contains(str, "/") {
			out = append(out, encoded{[]byte(strings.ReplaceAll(str, "/", `\/`)), formJSON})
		}
	}
	return out
}

// obfuscatedForms are the forms cheap obfuscation gives a value, each
// searched as it is: base32 (trimmed like base64, the value encoded
// alone), rot13, base64 of its base64, base64 of its UTF-16LE (PowerShell's
// -EncodedCommand, at each alignment), C/JS byte escapes (\xNN), hex
// bytes spaced or listed (68 51, 0x68, 0x51), decimal char codes
// (String.fromCharCode(104, 81), [104,81]), and each half of a value
// of 32 or more bytes whose halves look secret.
func obfuscatedForms(s []byte) []encoded {
	b32 := base32.StdEncoding.EncodeToString(s)
	out := []encoded{{[]byte(b32[:len(s)*8/5]), formBase32}, {[]byte(strings.ToLower(b32[:len(s)*8/5])), formBase32}}
	if r := rot13(s); !bytes.Equal(r, s) {
		out = append(out, encoded{r, formRot13})
	}
	inner := []byte(base64.StdEncoding.EncodeToString(s))
	out = append(out, encoded{b64Aligned(base64.RawStdEncoding, inner, 0), formBase64Twice})
	u := make([]byte, 0, 2*len(s))
	for _, r := range string(s) {
		if r >= 0x10000 {
			a, b := utf16.EncodeRune(r)
			u = append(u, byte(a), byte(a>>8), byte(b), byte(b>>8))
			continue
		}
		u = append(u, byte(r), byte(r>>8))
	}
	for a := 0; a < 3; a++ {
		out = append(out, encoded{b64Aligned(base64.RawStdEncoding, u, a), formUTF16Base64})
	}
	for _, digits := range []string{lowerHex, upperHex} {
		var esc, spaced, list, listTight []byte
		for i, c := range s {
			esc = append(esc, '\\', 'x', digits[c>>4], digits[c&15])
			if i > 0 {
				spaced = append(spaced, ' ')
				list = append(list, ',', ' ')
				listTight = append(listTight, ',')
			}
			spaced = append(spaced, digits[c>>4], digits[c&15])
			list = append(list, '0', 'x', digits[c>>4], digits[c&15])
			listTight = append(listTight, '0', 'x', digits[c>>4], digits[c&15])
		}
		out = append(out, encoded{esc, formByteEscapes}, encoded{spaced, formByteEscapes},
			encoded{list, formCharCodes}, encoded{listTight, formCharCodes})
	}
	var dec, decTight []byte
	for i, c := range s {
		if i > 0 {
			dec = append(dec, ',', ' ')
			decTight = append(decTight, ',')
		}
		dec = strconv.AppendInt(dec, int64(c), 10)
		decTight = strconv.AppendInt(decTight, int64(c), 10)
	}
	out = append(out, encoded{dec, formCharCodes}, encoded{decTight, formCharCodes})
	if h := len(s) / 2; h >= minPartLen && secretLike(string(s[:h])) && secretLike(string(s[h:])) {
		out = append(out, encoded{s[:h], formHalf}, encoded{s[h:], formHalf})
	}
	return append(out, separatedForms(s)...)
}

// maxSeparatedLen is the longest value searched with separators inserted
// (a token; a private key is not retyped in groups).
const maxSeparatedLen = 256

// maxSeparatedGroup is the longest group separatedForms cuts: a value
// with longer groups keeps a half of 16 or more characters intact, which
// the half forms find.
const maxSeparatedGroup = 16

// separatedForms are s cut into groups of n characters (1 to 16, counted
// from its start) joined by a blank or a dot (Zx8Q m2Lk 7Vn4 …,
// Zx8.Qm2.Lk7…), and one character a line, for a value that mixes cases
// or digits. Dashes, zero-width characters and folding at 2 or more
// columns are undone by the separated and wrap views instead (views.go);
// blanks and dots are too common in text to look at each one, so these
// are searched as forms of their own.
func separatedForms(s []byte) []encoded {
	if len(s) > maxSeparatedLen || classCount(s) < 2 {
		return nil
	}
	var out []encoded
	for _, sep := range []byte{' ', '.', '\n'} {
		for n := 1; n <= maxSeparatedGroup && n < len(s) && (sep != '\n' || n == 1); n++ {
			b := make([]byte, 0, len(s)+len(s)/n)
			for i := 0; i < len(s); i += n {
				if i > 0 {
					b = append(b, sep)
				}
				b = append(b, s[i:min(i+n, len(s))]...)
			}
			out = append(out, encoded{b, formSeparated})
		}
	}
	return out
}

// rot13 rotates the letters of s by 13.
func rot13(s []byte) []byte {
	out := make([]byte, len(s))
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z':
			c = 'a' + (c-'a'+13)%26
		case c >= 'A' && c <= 'Z':
			c = 'A' + (c-'A'+13)%26
		}
		out[i] = c
	}
	return out
}

// b64Aligned is the part of the base64 encoding of s, placed a bytes into
// a larger input, that depends on s alone.
func b64Aligned(enc *base64.Encoding, s []byte, a int) []byte {
	in := make([]byte, a+len(s))
	copy(in[a:], s)
	full := enc.EncodeToString(in)
	lo := (8*a + 5) / 6
	hi := (8*a + 8*len(s)) / 6
	return []byte(full[lo:hi])
}

func percentAll(s []byte, digits string) []byte {
	out := make([]byte, 0, 3*len(s))
	for _, c := range s {
		out = append(out, '%', digits[c>>4], digits[c&15])
	}
	return out
}

func unicodeEscapeAll(s string, digits string) []byte {
	var out []byte
	put := func(u uint16) {
		out = append(out, '\\', 'u', digits[u>>12], digits[u>>8&15], digits[u>>4&15], digits[u&15])
	}
	for _, r := range s {
		if r >= 0x10000 {
			a, b := utf16.EncodeRune(r)
			put(uint16(a))
			put(uint16(b))
			continue
		}
		put(uint16(r))
	}
	return out
}

// entropy is the Shannon entropy of s in bits per byte.
func entropy(s []byte) float64 {
	if len(s) == 0 {
		return 0
	}
	var counts [256]int
	for _, c := range s {
		counts[c]++
	}
	n := float64(len(s))
	var h float64
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}

// jsonEscaped is str as Go's JSON encoder writes it inside the quotes.
func jsonEscaped(str string, html bool) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	enc.Encode(str)
	q := b.Bytes() // "…"\n
	return bytes.Clone(q[1 : len(q)-2])
}

// Hex digits for the escaped forms.
const (
	lowerHex = "0123456789abcdef"
	upperHex = "0123456789ABCDEF"
)

// hexOnly reports a value of 16 or more hex digits with a letter among
// them.
func hexOnly(v string) bool {
	letter := false
	for i := 0; i < len(v); i++ {
		if !isHex(v[i]) {
			return false
		}
		letter = letter || v[i] > '9'
	}
	return len(v) >= 16 && letter
}

// minPartLen is the shortest line or token of a multi-line value that is
// matched on its own.
const minPartLen = 16

// secretParts returns what of a multi-line value is matched on its own,
// so that a value is found even if only some of its lines leave: each
// line that looks secret (a base64 or hex run such as a PEM body line, or
// a high-entropy line without blanks) and, from the other lines, each such
// token (the value of "key": "…"). Armour lines (-----BEGIN …) and
// ordinary text are not matched alone.
func secretParts(v string) []string {
	if !strings.Contains(v, "\n") {
		return nil
	}
	var out []string
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if secretLike(line) {
			out = append(out, line)
			continue
		}
		for _, tok := range strings.FieldsFunc(line, func(r rune) bool { return strings.ContainsRune(" \t\"'`,:;{}[]()<>", r) }) {
			if secretLike(tok) {
				out = append(out, tok)
			}
		}
	}
	return out
}

// secretLike reports a line or token worth matching alone: 16 or more
// bytes without blanks, either all base64/hex characters mixing at least
// two of lower case, upper case and digits, or of high entropy.
func secretLike(s string) bool {
	if len(s) < minPartLen || strings.HasPrefix(s, "-----") {
		return false
	}
	b64 := true
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' {
			return false
		}
		b64 = b64 && b64Byte(s[i])
	}
	if b64 && classCount([]byte(s)) >= 2 {
		return true
	}
	return entropy([]byte(s)) >= 3.5
}
