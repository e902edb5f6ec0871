package overlay

import (
	"errors"
	"strings"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"

	"github.com/vibedom/vibedom/termtext"
)

// DisplayPath returns p safe to print on a terminal: as is when every rune is
// printable and harmless, else Go-quoted with escapes for control characters,
// bidirectional overrides and invisible characters (so a name cannot move the
// cursor, recolor the screen or hide what it really is). It is termtext.Line.
func DisplayPath(p string) string { return termtext.Line(p) }

// isIgnorable reports the code points HFS+ ignores in file names (git's
// is_hfs_dotgit list): zero-width joiners and marks, bidi embeddings, and the
// byte order mark. ".g\u200cit" is ".git" on such a file system.
func isIgnorable(r rune) bool {
	switch {
	case r >= 0x200c && r <= 0x200f, r >= 0x202a && r <= 0x202e,
		r >= 0x206a && r <= 0x206f, r == 0xfeff:
		return true
	}
	return false
}

var folder = cases.Fold()

// foldName maps a path component to the key under which case-insensitive,
// normalising file systems (APFS, HFS+) see it: ignorable code points
// dropped, NFD, case folded. Two names with one key are one file on a Mac.
func foldName(s string) string {
	if isPlainLowerASCII(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !isIgnorable(r) {
			b.WriteRune(r)
		}
	}
	return norm.NFD.String(folder.String(norm.NFD.String(b.String())))
}

func isPlainLowerASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || (c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// foldPath folds every component of a slash-separated path.
func foldPath(p string) string {
	if isPlainLowerASCII(p) {
		return p
	}
	comps := strings.Split(p, "/")
	for i, c := range comps {
		comps[i] = foldName(c)
	}
	return strings.Join(comps, "/")
}

// needsGitQuote reports whether git (core.quotePath=true) quotes p.
func needsGitQuote(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			return true
		}
	}
	return false
}

// gitQuoteSpace is gitQuote that also quotes a name holding a space.
func gitQuoteSpace(prefix, p string) string {
	if strings.ContainsRune(p, ' ') && !needsGitQuote(prefix+p) {
		return `"` + prefix + p + `"`
	}
	return gitQuote(prefix, p)
}

// gitQuote returns prefix+p the way git writes a name in a patch header:
// C-quoted in double quotes (octal escapes for bytes ≥ 0x80) when needed,
// else as is.
func gitQuote(prefix, p string) string {
	s := prefix + p
	if !needsGitQuote(s) {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\a':
			b.WriteString(`\a`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\v':
			b.WriteString(`\v`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		default:
			if c < 0x20 || c >= 0x7f {
				b.WriteByte('\\')
				b.WriteByte('0' + c>>6)
				b.WriteByte('0' + (c>>3)&7)
				b.WriteByte('0' + c&7)
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

var errBadQuote = errors.New("bad C-quoted name")

// gitUnquote decodes a C-quoted name starting at s[0] == '"'. It returns
// the name and the rest of s after the closing quote.
func gitUnquote(s string) (name, rest string, err error) {
	if s == "" || s[0] != '"' {
		return "", s, errBadQuote
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			i++
			if i >= len(s) {
				return "", s, errBadQuote
			}
			switch e := s[i]; e {
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 't':
				b.WriteByte('\t')
			case 'n':
				b.WriteByte('\n')
			case 'v':
				b.WriteByte('\v')
			case 'f':
				b.WriteByte('\f')
			case 'r':
				b.WriteByte('\r')
			case '"', '\\':
				b.WriteByte(e)
			case '0', '1', '2', '3':
				if i+2 >= len(s) {
					return "", s, errBadQuote
				}
				v := 0
				for j := 0; j < 3; j++ {
					d := s[i+j]
					if d < '0' || d > '7' {
						return "", s, errBadQuote
					}
					v = v*8 + int(d-'0')
				}
				b.WriteByte(byte(v))
				i += 2
			default:
				return "", s, errBadQuote
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", s, errBadQuote
}
