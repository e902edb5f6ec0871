package dlp

import (
	"bytes"
	"slices"
	"sort"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Known values hidden by formatting are found through views: renderings of
// a segment's window with one kind of formatting undone, each byte mapped
// back to the window. A view is built only when the window shows the
// formatting (a backslash escape, a %XX, a quoted-printable =XX or soft
// break, a line break inside a base64 or hex run, mixed-case hex), and
// views of views are built up to maxViewDepth, so double URL-encoding or a
// wrapped, percent-encoded blob is undone too. Views are searched for the
// known values only, in all their encoded forms: a view never adds a
// recognizer match (undoing a format can make ordinary text look like a
// token), so it can cost time but not false positives.
const (
	maxViewDepth = 2
	// maxViews bounds the views of one window.
	maxViews = 12
)

// A viewKind is one formatting a view undoes.
type viewKind uint8

const (
	viewJSON      viewKind = iota // \" \\ \/ \b \f \n \r \t \uXXXX
	viewPercent                   // %XX
	viewQP                        // =XX and soft line breaks (=\r\n)
	viewWrap                      // line breaks (and indentation) inside base64/hex runs
	viewHexFold                   // mixed- or upper-case hex runs, folded to lower case
	viewSeparated                 // a dash or line break every N characters, zero-width characters
	numViewKinds
)

// view is one rendering. Its bytes b[i] come from the parent text
// (the window, or another view) as identity runs between edits.
type view struct {
	b     []byte
	edits []escape // d, dl: in b; r, rl: in the parent, relative to base
	// base is where b starts in the parent.
	base   int
	parent *view // nil: the parent is the segment's window
}

// parentPos maps b position p to the parent: the start of its source
// (isEnd: the end of the source of byte p-1).
func (v *view) parentPos(p int, isEnd bool) int {
	q := p
	if isEnd {
		q = p - 1
	}
	i := sort.Search(len(v.edits), func(i int) bool { return int(v.edits[i].d) > q }) - 1
	if i < 0 {
		return v.base + p
	}
	e := v.edits[i]
	ed, er, edl, erl := int(e.d), int(e.r), int(e.dl), int(e.rl)
	if q < ed+edl {
		if isEnd {
			return v.base + er + erl
		}
		return v.base + er
	}
	return v.base + er + erl + (p - ed - edl)
}

// windowPos maps b position p back to the window.
func (v *view) windowPos(p int, isEnd bool) int {
	for w := v; w != nil; w = w.parent {
		p = w.parentPos(p, isEnd)
	}
	return p
}

func (v *view) reset(parent *view, base int) {
	if v.b == nil {
		v.b = getBuf()
	}
	v.b, v.edits, v.parent, v.base = v.b[:0], v.edits[:0], parent, base
}

// edit appends decoded bytes d that stand for src bytes at parent
// position r (relative to base) of length rl.
func (v *view) edit(d []byte, r, rl int) {
	v.edits = append(v.edits, escape{d: int32(len(v.b)), r: int32(r), dl: int32(len(d)), rl: int32(rl)})
	v.b = append(v.b, d...)
}

// viewSet is a segment's scratch space for views.
type viewSet struct {
	vs [maxViews]view
	n  int
}

// b64Byte reports the bytes of base64 (both alphabets, with padding) and
// so of hex.
func b64Byte(c byte) bool { return b64Tab[c] }

// hexTab is 1 for the hex digits.
var hexTab = func() (t [256]uint8) {
	for c := range t {
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' {
			t[c] = 1
		}
	}
	return t
}()

// b64Tab marks [A-Za-z0-9_+/=-] (not built from class, which init fills
// after package variables).
var b64Tab = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_-+/=", byte(c)) >= 0
	}
	return t
}()

// triggers calls at with the position of each place in text that shows
// the formatting kind undoes (it stops when at returns false).
func triggers(kind viewKind, text []byte, at func(int) bool) {
	switch kind {
	case viewJSON:
		for i := 0; ; {
			k := bytes.IndexByte(text[i:], '\\')
			if k < 0 || i+k+1 >= len(text) {
				return
			}
			i += k + 1
			switch text[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't', 'u':
				if !at(i - 1) {
					return
				}
			}
		}
	case viewPercent:
		for i := 0; ; {
			k := bytes.IndexByte(text[i:], '%')
			if k < 0 || i+k+2 >= len(text) {
				return
			}
			i += k + 1
			if isHex(text[i]) && isHex(text[i+1]) && !at(i-1) {
				return
			}
		}
	case viewQP:
		// What quoted-printable does to a printable value: soft line
		// breaks, and '=' written =3D.
		for i := 0; ; {
			k := bytes.IndexByte(text[i:], '=')
			if k < 0 || i+k+2 >= len(text) {
				return
			}
			i += k + 1
			x := text[i]
			if (x == '\n' && qpSoftBreak(text, i+1) || x == '\r' && text[i+1] == '\n' && qpSoftBreak(text, i+2) || x == '3' && text[i+1] == 'D') && !at(i-1) {
				return
			}
		}
	case viewWrap:
		for i := 0; ; {
			k := bytes.IndexByte(text[i:], '\n')
			if k < 0 {
				return
			}
			if nl := i + k; nl >= 2 && (b64Tab[text[nl-1]] || text[nl-1] == '\r') &&
				(nl >= 17 && wrapBreak(text, nl) >= 0 || foldBreak(text, nl) >= 0) && !at(nl) {
				return
			}
			i += k + 1
		}
	case viewHexFold:
		// A run of 16 or more hex digits holds a whole 8-byte block at a
		// multiple of 8: look at blocks (last byte first, then the
		// rest), then at the run around a block that is all hex.
		for i := 0; i+8 <= len(text); i += 8 {
			// Branch-free tests: text is random to the predictor.
			if hexTab[text[i+7]]&hexTab[text[i]] == 0 {
				continue
			}
			b := text[i : i+8]
			if hexTab[b[1]]&hexTab[b[2]]&hexTab[b[3]]&hexTab[b[4]]&hexTab[b[5]]&hexTab[b[6]] == 0 {
				continue
			}
			s, e := i, i+8
			for s > 0 && isHex(text[s-1]) {
				s--
			}
			for e < len(text) && isHex(text[e]) {
				e++
			}
			if e-s >= 16 && hasUpperHex(text[s:e]) {
				// A point every 16 bytes: the regions around them
				// cover the whole run.
				for p := s; p < e+16; p += 16 {
					if !at(min(p, e)) {
						return
					}
				}
			}
			i = (e &^ 7) // the next block after the run
		}
	case viewSeparated:
		// A token cut into groups of equal length by dashes
		// (Zx8Q-m2Lk-7Vn4-…), or holding zero-width characters. Each
		// is found with a byte search (blanks, dots and line breaks
		// are too common in code to look at each one: a value folded
		// every 16 or more columns is joined by the wrap view), and
		// the places are handed on in order.
		var pts [64]int
		found := pts[:0]
		for _, c := range [...]byte{'-', 0xE2, 0xEF, 0xC2} {
			for i := 0; len(found) < cap(found); {
				k := bytes.IndexByte(text[i:], c)
				if k < 0 {
					break
				}
				i += k
				if c >= 0xC2 {
					if zeroWidth(text[i:]) > 0 {
						found = append(found, i)
					}
				} else if end := separatedAt(text, i); end > 0 {
					found = append(found, i)
					i = end
				}
				i++
			}
		}
		slices.Sort(found)
		for _, p := range found {
			if !at(p) {
				return
			}
		}
	}
}

// separatedAt looks at the separator text[i] for the token of equal
// groups it cuts (separatedRun), returning its end or -1.
func separatedAt(text []byte, i int) int {
	c := text[i]
	if c == '\n' && i > 0 && text[i-1] == '\r' {
		i--
		c = '\r'
	}
	run := 0
	for run <= 16 && i-run > 0 && class[text[i-run-1]]&cAlnum != 0 {
		run++
	}
	if run == 0 || run > 16 {
		return -1
	}
	// The next group must end at the same width (one look) before the
	// run is followed: most dashes are not cut so.
	if c == '\n' || c == '\r' {
		j := i + 1
		if c == '\r' {
			j++
		}
		for j < len(text) && j-i <= 10 && (text[j] == ' ' || text[j] == '\t') {
			j++
		}
		if !(j+run < len(text) && (text[j+run] == '\n' || text[j+run] == '\r') && class[text[j+run-1]]&cAlnum != 0) {
			return -1
		}
	} else if !(i+run+1 < len(text) && text[i+run+1] == c && class[text[i+run]]&cAlnum != 0) {
		return -1
	}
	return separatedRun(text, i-run, run, c)
}

// sepByte marks what the separated view drops: the separators a value may
// be cut by, and the indentation of folded lines.
var sepByte = func() (t [256]bool) {
	for _, c := range []byte("-\n\r \t") {
		t[c] = true
	}
	return t
}()

// zeroWidth returns the length of the zero-width character (or soft
// hyphen) UTF-8 encodes at the start of b, else 0: U+200B–U+200D, U+2060,
// U+FEFF, U+00AD.
func zeroWidth(b []byte) int {
	switch {
	case len(b) >= 3 && b[0] == 0xE2 && b[1] == 0x80 && b[2] >= 0x8B && b[2] <= 0x8D,
		len(b) >= 3 && b[0] == 0xE2 && b[1] == 0x81 && b[2] == 0xA0,
		len(b) >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF:
		return 3
	case len(b) >= 2 && b[0] == 0xC2 && b[1] == 0xAD:
		return 2
	}
	return 0
}

// separatedRun looks at text[start:] for groups of l alphanumerics, each
// followed by sep (for a line break, CRLF too, after optional
// indentation), at least four groups (three lines, or groups longer than
// 8), the last one of 1 to l, holding 12 or more characters in all; it
// returns the end of the last group, else -1. The separator must not also
// be inside the groups' neighbours (prose has words of unequal length;
// this wants equal ones).
func separatedRun(text []byte, start, l int, sep byte) int {
	lines := sep == '\n' || sep == '\r'
	if start > 0 && (class[text[start-1]]&cAlnum != 0 || text[start-1] == sep && !lines) {
		return -1
	}
	i, groups, chars := start, 0, 0
	for {
		g := i
		for i < len(text) && class[text[i]]&cAlnum != 0 && i-g <= l {
			i++
		}
		n := i - g
		if n == 0 || n > l {
			return -1
		}
		groups++
		chars += n
		if n < l || i >= len(text) || text[i] != sep {
			break // the last group
		}
		i++
		if sep == '\r' {
			if i >= len(text) || text[i] != '\n' {
				return -1
			}
			i++
		}
		if lines {
			for i < len(text) && (text[i] == ' ' || text[i] == '\t') && i-g <= l+9 {
				i++
			}
		}
	}
	minGroups := 4
	if lines || l > 8 {
		minGroups = 3
	}
	if groups < minGroups || chars < 12 || (i < len(text) && class[text[i]]&cAlnum != 0) {
		return -1
	}
	// A value mixes cases or digits; words of code or prose cut by
	// blanks (err nil for int) mostly do not.
	if classCount(text[start:i]) < 2 {
		return -1
	}
	return i
}

// qpSoftBreak reports whether the line that starts at text[i], after a
// '=' ending the line before, goes on as quoted-printable does after a
// soft break: at once, with no indentation (or the text ends there). Code
// that breaks a line after an operator (x <=, a ==) indents the next one,
// and a soft break inside an encoded value never does.
func qpSoftBreak(text []byte, i int) bool {
	return i >= len(text) || text[i] != ' ' && text[i] != '\t'
}

// hasUpperHex reports an upper-case hex digit in b.
func hasUpperHex(b []byte) bool {
	for _, c := range b {
		if c >= 'A' && c <= 'F' {
			return true
		}
	}
	return false
}

// wrapBreak looks at the line break at text[nl] == '\n': when it sits
// inside a wrapped base64 or hex run it returns the end of the break (the
// index of the next run byte), else -1. Inside a run means: at least 16
// run bytes end the line (optionally before a '\r'), the next line goes
// on with a run byte after at most 8 bytes of indentation, and the line
// before or the line after is a run from its indentation to its end (as
// base64, xxd -p and PEM write them, a label line above aside).
func wrapBreak(text []byte, nl int) int {
	s := nl
	if s > 0 && text[s-1] == '\r' {
		s--
	}
	if s < 16 || !b64Tab[text[s-1]] || !b64Tab[text[s-16]] || !b64Tab[text[s-8]] {
		return -1
	}
	for k := s - 2; k > s-16; k-- {
		if !b64Byte(text[k]) {
			return -1
		}
	}
	e := nl + 1
	for e < len(text) && e-nl <= 8 && (text[e] == ' ' || text[e] == '\t') {
		e++
	}
	if e >= len(text) || !b64Byte(text[e]) {
		return -1
	}
	// The line before, back to its indentation.
	k := s - 16
	for k > 0 && b64Byte(text[k-1]) {
		k--
	}
	for k > 0 && (text[k-1] == ' ' || text[k-1] == '\t') {
		k--
	}
	if k == 0 || text[k-1] == '\n' {
		return e
	}
	// The line after, to its end.
	k = e
	for k < len(text) && b64Byte(text[k]) {
		k++
	}
	if k > e && (k == len(text) || text[k] == '\n' || text[k] == '\r' || text[k] == '"' || text[k] == '\'') {
		return e
	}
	return -1
}

// foldBreak looks at the line break at text[nl] == '\n' for a value folded
// at a width under 16 (every 10 characters, say), which wrapBreak leaves:
// the line is a base64/hex run of 2 to 16 bytes from its indentation,
// mixing cases or digits, the next line goes on with a run no longer than
// it after at most 8 bytes of indentation, and the line before or the
// line after has the same width. It returns the index of the next run
// byte, else -1.
func foldBreak(text []byte, nl int) int {
	s := nl
	if s > 0 && text[s-1] == '\r' {
		s--
	}
	ls := s
	for ls > 0 && s-ls <= 16 && b64Byte(text[ls-1]) {
		ls--
	}
	w := s - ls
	if w < 2 || w > 16 || classCount(text[ls:s]) < 2 {
		return -1
	}
	e, ne := runLineAt(text, nl+1)
	if e < 0 || ne-e > w || ne == e {
		return -1
	}
	if ne-e == w && ne < len(text) && (text[ne] == '\n' || text[ne] == '\r') {
		return e // the next line is as wide: the fold goes on (its first line may follow a key)
	}
	// The last line of the value: this line stands alone and the line
	// before is as wide (that one may follow a key).
	if !lineStartAt(text, ls) {
		return -1
	}
	p := ls
	for p > 0 && (text[p-1] == ' ' || text[p-1] == '\t') {
		p--
	}
	if p == 0 || text[p-1] != '\n' {
		return -1
	}
	q := p - 1
	if q > 0 && text[q-1] == '\r' {
		q--
	}
	pl := q
	for pl > 0 && q-pl <= w && b64Byte(text[pl-1]) {
		pl--
	}
	if q-pl == w {
		return e
	}
	return -1
}

// lineStartAt reports whether only indentation (up to 8 bytes) stands
// between the line start and text[i].
func lineStartAt(text []byte, i int) bool {
	for k := 0; k <= 8; k++ {
		if i == 0 || text[i-1] == '\n' {
			return true
		}
		if text[i-1] != ' ' && text[i-1] != '\t' {
			return false
		}
		i--
	}
	return false
}

// runLineAt skips up to 8 bytes of indentation from i and returns where
// the base64/hex run there starts and ends, if it ends the line (or the
// text); e is -1 otherwise.
func runLineAt(text []byte, i int) (e, ne int) {
	e = i
	for e < len(text) && e-i < 8 && (text[e] == ' ' || text[e] == '\t') {
		e++
	}
	ne = e
	for ne < len(text) && ne-e <= 16 && b64Byte(text[ne]) {
		ne++
	}
	if ne < len(text) && text[ne] != '\n' && text[ne] != '\r' && b64Byte(text[ne]) {
		return -1, 0
	}
	return e, ne
}

// build renders text[a:b] (text at base in its parent) as a view of
// kind, appending to v.
func (v *view) build(kind viewKind, text []byte, a, b int) {
	switch kind {
	case viewJSON:
		v.buildJSON(text, a, b)
	case viewPercent, viewQP:
		v.buildHexEscapes(kind, text, a, b)
	case viewWrap:
		last := a
		for i := a; ; {
			k := bytes.IndexByte(text[i:b], '\n')
			if k < 0 {
				break
			}
			nl := i + k
			i = nl + 1
			e := -1
			if nl-16 >= a {
				e = wrapBreak(text[:b], nl)
			}
			if e < 0 && nl-2 >= a {
				e = foldBreak(text[:b], nl)
			}
			if e < 0 {
				continue
			}
			s := nl
			if text[s-1] == '\r' {
				s--
			}
			v.b = append(v.b, text[last:s]...)
			v.edit(nil, s, e-s)
			last = e
		}
		v.b = append(v.b, text[last:b]...)
	case viewSeparated:
		// Drop separators and zero-width characters: the view may join
		// words, but it only ever adds known values.
		last := a
		for i := a; i < b; i++ {
			l := 0
			if c := text[i]; sepByte[c] {
				l = 1
			} else if c >= 0xC2 {
				l = zeroWidth(text[i:b])
			}
			if l == 0 {
				continue
			}
			v.b = append(v.b, text[last:i]...)
			v.edit(nil, i, l)
			i += l - 1
			last = i + 1
		}
		v.b = append(v.b, text[last:b]...)
	case viewHexFold:
		off := len(v.b)
		v.b = append(v.b, text[a:b]...)
		start, upper := a, false
		for i := a; i <= b; i++ {
			if i < b && isHex(text[i]) {
				upper = upper || (text[i] >= 'A' && text[i] <= 'F')
				continue
			}
			if i-start >= 16 && upper {
				for k := start; k < i; k++ {
					v.b[off+k-a] = fold(v.b[off+k-a])
				}
			}
			start, upper = i+1, false
		}
	}
}

func (v *view) buildJSON(text []byte, a, b int) {
	last := a
	for i := a; i < b; {
		k := bytes.IndexByte(text[i:b], '\\')
		if k < 0 || i+k+1 >= b {
			break
		}
		s := i + k
		i = s + 2
		if text[s+1] == 'u' {
			r, l := jsonU(text[s:b])
			if l == 0 {
				i = s + 1
				continue
			}
			v.b = append(v.b, text[last:s]...)
			var buf [4]byte
			v.edit(buf[:utf8.EncodeRune(buf[:], r)], s, l)
			i, last = s+l, s+l
			continue
		}
		d, ok := jsonShortEscape(text[s+1])
		if !ok {
			i = s + 1
			continue
		}
		v.b = append(v.b, text[last:s]...)
		v.edit([]byte{d}, s, 2)
		last = i
	}
	v.b = append(v.b, text[last:b]...)
}

// jsonU decodes \uXXXX (or a surrogate pair of them) at the start of t,
// returning the rune and the bytes read (0 if malformed).
func jsonU(t []byte) (rune, int) {
	if len(t) < 6 || !isHex(t[2]) || !isHex(t[3]) || !isHex(t[4]) || !isHex(t[5]) {
		return 0, 0
	}
	r := rune(hexVal(t[2:6]))
	if utf16.IsSurrogate(r) {
		if r < 0xDC00 && len(t) >= 12 && t[6] == '\\' && t[7] == 'u' && isHex(t[8]) && isHex(t[9]) && isHex(t[10]) && isHex(t[11]) {
			if p := utf16.DecodeRune(r, rune(hexVal(t[8:12]))); p != utf8.RuneError {
				return p, 12
			}
		}
		return utf8.RuneError, 6
	}
	return r, 6
}

// buildHexEscapes undoes %XX (percent) or =XX and soft line breaks
// (quoted-printable).
func (v *view) buildHexEscapes(kind viewKind, text []byte, a, b int) {
	c := byte('%')
	if kind == viewQP {
		c = '='
	}
	text = text[:b]
	last := a
	for i := a; i < len(text); {
		k := bytes.IndexByte(text[i:], c)
		if k < 0 {
			break
		}
		s := i + k
		i = s + 1
		if kind == viewQP && s+1 < len(text) && (text[s+1] == '\n' || s+2 < len(text) && text[s+1] == '\r' && text[s+2] == '\n') {
			l := 2
			if text[s+1] == '\r' {
				l = 3
			}
			v.b = append(v.b, text[last:s]...)
			v.edit(nil, s, l)
			i, last = s+l, s+l
			continue
		}
		if s+2 >= len(text) || !isHex(text[s+1]) || !isHex(text[s+2]) {
			continue
		}
		v.b = append(v.b, text[last:s]...)
		v.edit([]byte{byte(hexVal(text[s+1 : s+3]))}, s, 3)
		i, last = s+3, s+3
	}
	v.b = append(v.b, text[last:b]...)
}

// scanViews finds known values in the views of buf[from:n] and appends
// their matches, in window positions.
func (k *knownSet) scanViews(buf []byte, from, n int, out []match, set *viewSet) []match {
	if len(k.pats) == 0 || n-from < MinSecretLen {
		return out
	}
	set.n = 0
	out = k.viewsOf(nil, buf[from:n], from, 1, out, set)
	return out
}

// viewsOf builds and searches the views of text (at base in parent).
// Each view covers only the regions around the places that show its
// formatting (reach bytes either side: the longest encoded form), the
// text between them standing in as one zero byte.
func (k *knownSet) viewsOf(parent *view, text []byte, base, depth int, out []match, set *viewSet) []match {
	reach := k.maxLen + 8
	for kind := range numViewKinds {
		if set.n == maxViews {
			return out
		}
		var v *view
		last := 0 // end of the last region
		regionStart := -1
		flush := func(end int) {
			if v == nil {
				v = &set.vs[set.n]
				set.n++
				v.reset(parent, base)
				if regionStart > 0 {
					v.edit([]byte{0}, 0, regionStart)
				}
			} else {
				v.edit([]byte{0}, last, regionStart-last)
			}
			v.build(kind, text, regionStart, end)
			last = end
		}
		regionEnd := 0
		triggers(kind, text, func(t int) bool {
			a, b := max(0, t-reach), min(len(text), t+reach)
			if regionStart >= 0 && a <= regionEnd {
				regionEnd = max(regionEnd, b)
				return true
			}
			if regionStart >= 0 {
				flush(regionEnd)
			}
			regionStart, regionEnd = a, b
			return true
		})
		if regionStart < 0 {
			continue
		}
		flush(regionEnd)
		mark := len(out)
		out = k.long.scan(k, v.b, 0, len(v.b), out)
		out = k.short.scan(k, v.b, 0, len(v.b), out)
		for i := mark; i < len(out); i++ {
			m := &out[i]
			m.start, m.end = int32(v.windowPos(int(m.start), false)), int32(v.windowPos(int(m.end), true))
		}
		if depth < maxViewDepth {
			out = k.viewsOf(v, v.b, 0, depth+1, out, set)
		}
	}
	return out
}
