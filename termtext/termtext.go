// Package termtext makes text that vibedom did not write itself — file
// names, reasons and contents from the guest, names and matches from the
// workspace, host names and paths from the network logs — safe to print on
// a terminal. It is the one sanitizer every such string goes through before
// it is printed (STYLE habit 12).
//
// Unsafe characters are shown, never dropped: each becomes a visible Go
// escape, so the user sees that something is there and what it is.
//
//   - C0 controls and DEL: \n, \r, \t, else \x1b, \x7f …
//   - C1 controls, as the code points U+0080–U+009F: \u009b …
//   - bytes that are not UTF-8 (a lone 0x9b, a truncated sequence): \x9b …
//   - bidirectional controls (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F,
//     U+061C), the line and paragraph separators U+2028 and U+2029, and every
//     other invisible or format character: zero-width spaces and joiners,
//     the byte order mark, soft hyphen, tag characters (U+E0000–U+E007F),
//     Hangul fillers and the other default-ignorable code points, spaces
//     other than the ASCII space, private-use and unassigned code points:
//     \u202e, \U000e0041 …
//
// Letters, marks, digits, punctuation, symbols and the ASCII space are kept
// as they are, in every script.
//
// Line is the one-line form for names and short texts (a path, a reason, a
// host name): a string with anything unsafe is printed Go-quoted, so the
// escapes cannot be confused with the same characters typed literally.
// Inline escapes in place without quoting, for messages vibedom composes
// around names it already quoted. Text and Block are the multi-line form for contents (a diff, a log): new
// lines and tabs are kept, everything else unsafe is escaped in place. JSON
// escapes the same characters inside JSON text with JSON's own escapes, so
// the output is still the same JSON.
//
// The package does not decide what is printed or styled, and does not know
// where a string came from; it imports nothing of vibedom's.
package termtext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Safe reports whether r prints as itself, harmlessly, inside a line: an
// ASCII space or a letter, mark, number, punctuation or symbol that is not a
// bidirectional, joining or otherwise invisible (default-ignorable) code
// point. Tab and newline are not Safe; the multi-line form keeps them.
func Safe(r rune) bool {
	if r < utf8.RuneSelf {
		return r >= 0x20 && r < 0x7f
	}
	if r <= 0x9f {
		return false // C1
	}
	if unicode.Is(unicode.Bidi_Control, r) || unicode.Is(unicode.Join_Control, r) ||
		unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) {
		return false
	}
	// IsPrint leaves out Cc, Cf (format: zero-width, BOM, tags, soft
	// hyphen …), Co, Cs, Cn and every space but U+0020 (Z*, which includes
	// U+2028 and U+2029).
	return unicode.IsPrint(r)
}

// IsSafe reports whether s can be printed as it is on one line.
func IsSafe(s string) bool { return allSafe(s, false) }

// allSafe reports whether every character of s prints as itself; lines
// allows newlines and tabs (the multi-line form).
func allSafe(s string, lines bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && !(lines && (c == '\n' || c == '\t'))) || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !Safe(r) {
			return false
		}
		i += n
	}
	return true
}

// Line returns s fit for one line of a terminal: s itself when every
// character is Safe and it holds no quote or backslash, else s Go-quoted
// with every unsafe character escaped (strconv.Unquote gives s back).
func Line(s string) string {
	if IsSafe(s) && !strings.ContainsAny(s, `"\`) {
		return s
	}
	b := make([]byte, 0, len(s)+16)
	b = append(b, '"')
	b = appendEscaped(b, s, false, "", "", true)
	return string(append(b, '"'))
}

// Inline returns s fit for one line without quoting it: every unsafe
// character, newline and tab included, escaped in place. It is for messages
// vibedom composes around names it already quoted with Line (an error, an
// explanation): Line would quote them a second time.
func Inline(s string) string {
	if IsSafe(s) {
		return s
	}
	return string(appendEscaped(make([]byte, 0, len(s)+16), s, false, "", "", false))
}

// Text returns s fit for a terminal as several lines: newlines and tabs are
// kept, every other unsafe character is escaped in place (\x1b, \u202e …).
// Backslashes are not doubled, so a literal "\x1b" in s looks the same as
// an escaped ESC; use Line where that matters.
func Text(s string) string {
	if textSafe(s) {
		return s
	}
	return string(appendEscaped(make([]byte, 0, len(s)+16), s, true, "", "", false))
}

// Block is Text for bytes.
func Block(b []byte) []byte { return BlockMarked(b, "", "") }

// BlockMarked is Block with each escape wrapped in on and off (for example
// reverse video, "\x1b[7m" and "\x1b[27m"), so an escape stands out from
// the same characters typed literally. b is returned as it is when nothing
// needs escaping.
func BlockMarked(b []byte, on, off string) []byte {
	s := string(b)
	if textSafe(s) {
		return b
	}
	return appendEscaped(make([]byte, 0, len(b)+16), s, true, on, off, false)
}

func textSafe(s string) bool { return allSafe(s, true) }

const hex = "0123456789abcdef"

// appendEscaped appends s with unsafe characters escaped. multiline keeps
// newlines and tabs; quoted escapes quotes and backslashes, as inside a Go
// string literal.
func appendEscaped(b []byte, s string, multiline bool, on, off string, quoted bool) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, on...)
			b = append(b, '\\', 'x', hex[s[i]>>4], hex[s[i]&0xf])
			b = append(b, off...)
			i++
			continue
		}
		i += n
		switch {
		case multiline && (r == '\n' || r == '\t'):
			b = append(b, byte(r))
			continue
		case quoted && (r == '"' || r == '\\'):
			b = append(b, '\\', byte(r))
			continue
		case Safe(r):
			b = utf8.AppendRune(b, r)
			continue
		}
		b = append(b, on...)
		switch {
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r == '\t':
			b = append(b, `\t`...)
		case r < 0x80:
			b = append(b, '\\', 'x', hex[r>>4], hex[r&0xf])
		case r <= 0xffff:
			b = append(b, '\\', 'u')
			b = appendHex(b, uint32(r), 4)
		default:
			b = append(b, '\\', 'U')
			b = appendHex(b, uint32(r), 8)
		}
		b = append(b, off...)
	}
	return b
}

func appendHex(b []byte, v uint32, digits int) []byte {
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		b = append(b, hex[(v>>uint(shift))&0xf])
	}
	return b
}

// JSON returns JSON text with every character that is not Safe written as
// a JSON escape (\u001b, \u202e, a surrogate pair above U+FFFF), so it
// prints harmlessly and still decodes to the same values. The JSON
// whitespace characters (space, tab, newline, carriage return) are kept:
// they only occur between tokens. A byte that is not UTF-8 becomes \ufffd,
// which is what a JSON decoder makes of it. j is returned as it is when
// nothing needs escaping.
func JSON(j []byte) []byte {
	s := string(j)
	clean := true
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f {
				clean = false
				break
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !Safe(r) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return j
	}
	b := make([]byte, 0, len(j)+16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, `\ufffd`...)
		case r == ' ' || r == '\t' || r == '\n' || r == '\r' || Safe(r):
			b = utf8.AppendRune(b, r)
		case r > 0xffff:
			hi, lo := (r-0x10000)>>10+0xd800, (r-0x10000)&0x3ff+0xdc00
			b = append(b, '\\', 'u')
			b = appendHex(b, uint32(hi), 4)
			b = append(b, '\\', 'u')
			b = appendHex(b, uint32(lo), 4)
		default:
			b = append(b, '\\', 'u')
			b = appendHex(b, uint32(r), 4)
		}
	}
	return b
}
