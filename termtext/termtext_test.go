package termtext

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Hostile is one character of every class that must never reach a terminal
// raw, with the escape that shows it. Other packages' tests use the same
// list through their own copies of these literals.
var hostile = []struct {
	name, raw, escaped string
}{
	{"NUL", "\x00", `\x00`},
	{"BEL", "\a", `\x07`},
	{"backspace", "\b", `\x08`},
	{"carriage return", "\r", `\r`},
	{"ESC", "\x1b", `\x1b`},
	{"DEL", "\x7f", `\x7f`},
	{"C1 CSI as a code point", "\u009b", `\u009b`},
	{"C1 NEL as a code point", "\u0085", `\u0085`},
	{"C1 CSI as a lone byte", "\x9b", `\x9b`},
	{"C1 OSC as a lone byte", "\x9d", `\x9d`},
	{"invalid UTF-8", "\xff\xfe", `\xff\xfe`},
	{"truncated UTF-8", "\xe2\x80", `\xe2\x80`},
	{"UTF-8 surrogate", "\xed\xa0\x80", `\xed\xa0\x80`},
	{"LRE", "\u202a", `\u202a`},
	{"RLE", "\u202b", `\u202b`},
	{"PDF", "\u202c", `\u202c`},
	{"LRO", "\u202d", `\u202d`},
	{"RLO", "\u202e", `\u202e`},
	{"LRI", "\u2066", `\u2066`},
	{"RLI", "\u2067", `\u2067`},
	{"FSI", "\u2068", `\u2068`},
	{"PDI", "\u2069", `\u2069`},
	{"LRM", "\u200e", `\u200e`},
	{"RLM", "\u200f", `\u200f`},
	{"ALM", "\u061c", `\u061c`},
	{"line separator", "\u2028", `\u2028`},
	{"paragraph separator", "\u2029", `\u2029`},
	{"zero-width space", "\u200b", `\u200b`},
	{"zero-width non-joiner", "\u200c", `\u200c`},
	{"zero-width joiner", "\u200d", `\u200d`},
	{"word joiner", "\u2060", `\u2060`},
	{"BOM", "\ufeff", `\ufeff`},
	{"soft hyphen", "\u00ad", `\u00ad`},
	{"tag A", "\U000E0041", `\U000e0041`},
	{"cancel tag", "\U000E007F", `\U000e007f`},
	{"Hangul filler", "\u3164", `\u3164`},
	{"no-break space", "\u00a0", `\u00a0`},
	{"private use", "\ue000", `\ue000`},
	{"unassigned", "\U0010fffe", `\U0010fffe`},
}

func TestLineEscapesEveryClass(t *testing.T) {
	for _, h := range hostile {
		t.Run(h.name, func(t *testing.T) {
			in := "a" + h.raw + "b"
			got := Line(in)
			want := `"a` + h.escaped + `b"`
			if got != want {
				t.Errorf("Line(%q) = %s, want %s", in, got, want)
			}
			if u, err := strconv.Unquote(got); err != nil || u != in {
				t.Errorf("Line(%q) = %s does not unquote to the input: %q, %v", in, got, u, err)
			}
			if got := Inline(in); got != "a"+h.escaped+"b" {
				t.Errorf("Inline(%q) = %s, want a%sb", in, got, h.escaped)
			}
			if got := Text(in); got != "a"+h.escaped+"b" {
				t.Errorf("Text(%q) = %s, want a%sb", in, got, h.escaped)
			}
		})
	}
}

func TestKeptAsIs(t *testing.T) {
	for _, s := range []string{
		"", "src/main.go", "docs/été.md", "中文/文件.txt", "עברית.txt", "مرحبا", "emoji 😀.png",
		"e\u0301", "x ~!#$%&'()*+,-./:;<=>?@[]^_`{|}", "\ufffd",
	} {
		if got := Line(s); got != s {
			t.Errorf("Line(%q) = %q, want it unchanged", s, got)
		}
		if got := Text(s); got != s {
			t.Errorf("Text(%q) = %q, want it unchanged", s, got)
		}
	}
	if got := Text("a\n\tb\n"); got != "a\n\tb\n" {
		t.Errorf("Text keeps newlines and tabs: got %q", got)
	}
	if got := Line("a\n\tb"); got != `"a\n\tb"` {
		t.Errorf("Line escapes newlines and tabs: got %s", got)
	}
	if got := Inline("open \"x\\u202e\": gone\n\u202e"); got != `open "x\u202e": gone\n\u202e` {
		t.Errorf("Inline quotes nothing and escapes in place: got %s", got)
	}
	// Quotes and backslashes alone make Line quote, so a name cannot pose
	// as an escaped one.
	for in, want := range map[string]string{`"a\x1b"`: `"\"a\\x1b\""`, `a\b`: `"a\\b"`} {
		if got := Line(in); got != want {
			t.Errorf("Line(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestBlockMarked(t *testing.T) {
	got := string(BlockMarked([]byte("+x\x1b[2Jy\n"), "<", ">"))
	if got != `+x<\x1b>[2Jy`+"\n" {
		t.Errorf("BlockMarked: got %q", got)
	}
	plain := []byte("nothing to do\n")
	if got := Block(plain); &got[0] != &plain[0] {
		t.Error("Block copied clean input")
	}
}

// unsafeOut reports the first unsafe character in printed output
// (newline and tab allowed).
func unsafeOut(s string) (string, bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return s[i : i+1], true
		}
		if r != '\n' && r != '\t' && !Safe(r) {
			return string(r), true
		}
		i += n
	}
	return "", false
}

func randomHostile(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(12) {
		switch rng.IntN(4) {
		case 0:
			b.WriteString(hostile[rng.IntN(len(hostile))].raw)
		case 1:
			b.WriteByte(byte(rng.IntN(256)))
		case 2:
			b.WriteRune(rune(rng.IntN(0x110000)))
		default:
			b.WriteString(`ab \"x`[rng.IntN(6):])
		}
	}
	return b.String()
}

// TestRandom: whatever goes in, nothing unsafe comes out, Line round-trips
// through strconv.Unquote, and JSON stays the same JSON.
func TestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		s := randomHostile(rng)
		line := Line(s)
		if c, bad := unsafeOut(line); bad || strings.ContainsAny(line, "\n\t") {
			t.Fatalf("Line(%q) = %q prints %q raw", s, line, c)
		}
		if line != s {
			if u, err := strconv.Unquote(line); err != nil || u != s {
				t.Fatalf("Line(%q) = %s does not unquote to the input (%q, %v)", s, line, u, err)
			}
		}
		if c, bad := unsafeOut(Inline(s)); bad || strings.ContainsAny(Inline(s), "\n\t") {
			t.Fatalf("Inline(%q) prints %q raw", s, c)
		}
		if c, bad := unsafeOut(Text(s)); bad {
			t.Fatalf("Text(%q) prints %q raw", s, c)
		}
		if c, bad := unsafeOut(string(Block([]byte(s)))); bad {
			t.Fatalf("Block(%q) prints %q raw", s, c)
		}
		enc, err := json.Marshal(map[string]string{"k": s})
		if err != nil {
			t.Fatal(err)
		}
		j := JSON(enc)
		if c, bad := unsafeOut(string(j)); bad {
			t.Fatalf("JSON(%s) prints %q raw", enc, c)
		}
		var a, b map[string]string
		if err := json.Unmarshal(enc, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(j, &b); err != nil || a["k"] != b["k"] {
			t.Fatalf("JSON(%s) = %s decodes to %q (%v), want %q", enc, j, b["k"], err, a["k"])
		}
	}
}

func TestJSONRawControlAndInvalid(t *testing.T) {
	in := []byte("{\"a\": \"x\x1b\u202e\U000E0041\xff\"}\n")
	got := JSON(in)
	want := `{"a": "x\u001b\u202e\udb40\udc41\ufffd"}` + "\n"
	if string(got) != want {
		t.Errorf("JSON(%q) = %q, want %q", in, got, want)
	}
	var v map[string]string
	if err := json.Unmarshal(got, &v); err != nil || v["a"] != "x\x1b\u202e\U000E0041\ufffd" {
		t.Errorf("decoded %q, %v", v["a"], err)
	}
}
