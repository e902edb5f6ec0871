package dlp

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"mime/quotedprintable"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
)

// wrap breaks s into lines of width, joined by sep (as base64, xxd -p or
// PEM write them).
func wrap(s string, width int, sep string) string {
	var b strings.Builder
	for len(s) > width {
		b.WriteString(s[:width])
		b.WriteString(sep)
		s = s[width:]
	}
	b.WriteString(s)
	return b.String()
}

// hexSecret is a known value made of hex digits only (an API key of the
// kind many services issue), built at run time.
var hexSecret = j("9f3c2a7e", "41b0d58c", "e6a2f19d", "07b3c4e5")

// TestKnownValuesSurviveFormatting: a known value is found however it is
// formatted on the way out: line-wrapped base64 and hex, case changes of
// hex, partial JSON and percent escapes, double URL-encoding,
// quoted-printable, a body that is JSON but not labelled so.
func TestKnownValuesSurviveFormatting(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "a"}, {Value: hexSecret, Source: "b"}}})
	r := rand.New(rand.NewPCG(11, 12))
	noise := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	}
	type tc struct{ name, text string }
	var tests []tc
	// The value at every position relative to the line breaks.
	for pre := 0; pre < 80; pre += 3 {
		blob := append(append(noise(pre), "API_KEY="+knownSecret+"\n"...), noise(100)...)
		b64 := base64.StdEncoding.EncodeToString(blob)
		tests = append(tests,
			tc{fmt.Sprintf("base64 wrapped at 76, offset %d", pre), "data:\n" + wrap(b64, 76, "\n") + "\n"},
			tc{fmt.Sprintf("base64 wrapped at 64 with CRLF, offset %d", pre), wrap(b64, 64, "\r\n")},
			tc{fmt.Sprintf("base64 wrapped and indented, offset %d", pre), "key: |\n    " + wrap(b64, 76, "\n    ") + "\nnext: 1"},
			tc{fmt.Sprintf("hex wrapped at 60 (xxd -p), offset %d", pre), wrap(hex.EncodeToString(blob), 60, "\n")},
			tc{fmt.Sprintf("upper hex wrapped, offset %d", pre), wrap(strings.ToUpper(hex.EncodeToString(blob)), 60, "\n")},
		)
	}
	h := hex.EncodeToString([]byte(knownSecret))
	mixed := []byte(h)
	for i := range mixed {
		if i%3 == 0 {
			mixed[i] = bytes.ToUpper(mixed[i : i+1])[0]
		}
	}
	oneU := strings.Replace(knownSecret, "Z", `\u005a`, 1)
	tests = append(tests,
		tc{"mixed-case hex", "x " + string(mixed) + " y"},
		tc{"hex value upper-cased", "id=" + strings.ToUpper(hexSecret) + ";"},
		tc{"one \\u escape, body not labelled JSON", `{"k":"` + oneU + `"}`},
		tc{"one \\u escape in JSON inside a JSON string", `{"payload":"{\"k\":\"` + strings.ReplaceAll(oneU, `\`, `\\`) + `\"}"}`},
		tc{"JSON escapes, body not labelled JSON", `{"k":"` + strings.ReplaceAll(knownSecret, "/", `\/`) + `\n"}`},
		tc{"one character percent-encoded", "q=" + strings.Replace(knownSecret, "Z", "%5A", 1)},
		tc{"double URL-encoding", "q=" + url.QueryEscape(url.QueryEscape(knownSecret))},
		tc{"double URL-encoding, every byte", "q=" + url.QueryEscape(string(percentAll([]byte(knownSecret), upperHex)))},
	)
	// Quoted-printable, soft line breaks at every position in the value.
	for pre := 50; pre < 80; pre++ {
		var qp bytes.Buffer
		w := quotedprintable.NewWriter(&qp)
		io.WriteString(w, strings.Repeat("a", pre)+"="+knownSecret+" tail")
		w.Close()
		tests = append(tests, tc{fmt.Sprintf("quoted-printable, offset %d", pre), qp.String()})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, rep := scrubText(t, e, ClassPublic, tt.text)
			if !strings.Contains(out, "[REDACTED:SECRET]") {
				t.Fatalf("not redacted:\n%q\n->\n%q", tt.text, out)
			}
			found := false
			for _, f := range rep.Findings() {
				found = found || (f.Category == CatSecret && (f.Value() == knownSecret || f.Value() == hexSecret))
			}
			if !found {
				t.Errorf("report: %v", rep.Findings())
			}
		})
	}
}

// TestMultiLineKnownValues: a known value of several lines (a private key
// the preflight found) is found line by line: its body without the
// armour, rewrapped, or only some of its lines.
func TestMultiLineKnownValues(t *testing.T) {
	key := pemKey(t)
	e := mustEngine(t, Config{Secrets: []Secret{{Value: key, Source: "preflight private-key id_ecdsa:1"}}})
	lines := strings.Split(strings.TrimSpace(key), "\n")
	body := lines[1 : len(lines)-1]
	joined := strings.Join(body, "")
	tests := map[string]string{
		"body without armour":  strings.Join(body, "\n"),
		"body rewrapped at 76": wrap(joined, 76, "\n"),
		"body on one line":     "k=" + joined,
		"second line alone":    "line: " + body[1] + " end",
		"body in JSON":         `{"k":"` + strings.Join(body, `\n`) + `"}`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			out, rep := scrubText(t, e, ClassPublic, in)
			for i, l := range body {
				if len(l) >= 16 && strings.Contains(out, l[4:12]) {
					t.Errorf("line %d survived: %q", i, out)
				}
			}
			if len(rep.Findings()) == 0 {
				t.Errorf("no finding")
			}
		})
	}
	// Ordinary lines of a multi-line value are not indexed on their own.
	e2 := mustEngine(t, Config{Secrets: []Secret{{Value: "{\n  \"type\": \"service_account\",\n  \"key\": \"" + knownSecret + "\"\n}", Source: "x"}}})
	if out, _ := scrubText(t, e2, ClassPublic, `say "type": "service_account", ok`); strings.Contains(out, "REDACTED") {
		t.Errorf("an ordinary line of a multi-line value was redacted: %q", out)
	}
	if out, _ := scrubText(t, e2, ClassPublic, "k "+knownSecret); !strings.Contains(out, "REDACTED") {
		t.Errorf("the secret line of a multi-line value was not found: %q", out)
	}
}

// TestMultipartEncodedParts: parts in base64 or quoted-printable transfer
// encoding are searched for known values.
func TestMultipartEncodedParts(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	for _, cte := range []string{"base64", "quoted-printable"} {
		t.Run(cte, func(t *testing.T) {
			var buf bytes.Buffer
			mw := multipart.NewWriter(&buf)
			h := textproto.MIMEHeader{}
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Transfer-Encoding", cte)
			w, _ := mw.CreatePart(h)
			text := strings.Repeat("lorem ipsum ", 9) + "key=" + knownSecret + strings.Repeat(" dolor", 30)
			if cte == "base64" {
				io.WriteString(w, wrap(base64.StdEncoding.EncodeToString([]byte(text)), 76, "\r\n"))
			} else {
				q := quotedprintable.NewWriter(w)
				io.WriteString(q, text)
				q.Close()
			}
			mw.Close()
			out, rep := scrubReader(t, e, ClassPublic, bytes.NewReader(buf.Bytes()), StreamOptions{ContentType: "multipart/form-data; boundary=" + mw.Boundary()})
			if !strings.Contains(out, "[REDACTED:SECRET]") || len(rep.Findings()) == 0 {
				t.Errorf("not redacted:\n%s", out)
			}
		})
	}
}

// TestSniffedCompression: a compressed body without Content-Encoding is
// decoded for the scan (its magic decides, not a header); a body with a
// finding is re-encoded scrubbed, a clean one passes byte for byte, and a
// bomb is refused.
func TestSniffedCompression(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	pol := e.PolicyForClass(ClassPublic)
	secretBody := []byte(`{"content":"key ` + knownSecret + ` end"}`)
	clean := []byte(`{"content":"nothing to see here, only words and numbers 1 2 3"}`)
	for _, coding := range []string{"gzip", "deflate", "zstd"} {
		for _, ct := range []string{"application/json", "application/octet-stream", ""} {
			t.Run(coding+"/"+ct, func(t *testing.T) {
				in := compress(t, coding, secretBody)
				out, rep := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{ContentType: ct})
				dec := decompress(t, coding, []byte(out))
				if bytes.Contains(dec, []byte(knownSecret)) || !bytes.Contains(dec, []byte("[REDACTED:SECRET]")) {
					t.Errorf("decoded output: %q", dec)
				}
				if len(rep.Findings()) != 1 {
					t.Errorf("report: %v", rep.Findings())
				}
				in = compress(t, coding, clean)
				out, rep = scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{ContentType: ct})
				if out != string(in) || len(rep.Findings()) != 0 {
					t.Errorf("a clean compressed body changed (%v)", rep.Findings())
				}
			})
		}
	}
	t.Run("looks compressed but is not", func(t *testing.T) {
		in := append([]byte{0x1f, 0x8b, 8, 0}, "then plain text "+knownSecret...)
		out, rep := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{})
		if strings.Contains(out, knownSecret) || len(rep.Findings()) != 1 {
			t.Errorf("got %q, %v", out, rep.Findings())
		}
	})
	t.Run("compressed then plain", func(t *testing.T) {
		in := append(compress(t, "deflate", clean), " and then "+knownSecret...)
		out, _ := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{})
		if strings.Contains(out, knownSecret) {
			t.Errorf("a secret after the compressed stream passed")
		}
	})
	t.Run("declared and sniffed", func(t *testing.T) {
		in := compress(t, "br", compress(t, "gzip", secretBody))
		out, _ := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{ContentEncoding: "br"})
		if dec := decompress(t, "gzip", decompress(t, "br", []byte(out))); bytes.Contains(dec, []byte(knownSecret)) {
			t.Errorf("secret passed: %q", dec)
		}
	})
	t.Run("nested", func(t *testing.T) {
		in := compress(t, "gzip", compress(t, "zstd", secretBody))
		out, _ := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{})
		if dec := decompress(t, "zstd", decompress(t, "gzip", []byte(out))); bytes.Contains(dec, []byte(knownSecret)) {
			t.Errorf("secret in nested compression passed: %q", dec)
		}
	})
	t.Run("bomb", func(t *testing.T) {
		in := compress(t, "gzip", bytes.Repeat([]byte("a"), 8<<20))
		var out bytes.Buffer
		err := e.Scrub(&out, bytes.NewReader(in), &pol, StreamOptions{MaxDecoded: 1 << 20}, nil)
		if !errors.Is(err, ErrEncoding) {
			t.Errorf("error %v, want ErrEncoding", err)
		}
	})
	t.Run("long streamed", func(t *testing.T) {
		// Beyond the sniff buffer: re-encoded as it streams.
		r := rand.New(rand.NewPCG(1, 1))
		big := make([]byte, 12<<20)
		for i := range big {
			big[i] = "abcdefghijklmnopqrstuvwxyz   "[r.IntN(29)]
		}
		big = append(big, secretBody...)
		in := compress(t, "gzip", big)
		if len(in) <= sniffHold {
			t.Fatalf("the compressed body (%d bytes) fits the sniff buffer", len(in))
		}
		out, _ := scrubReader(t, e, ClassPublic, bytes.NewReader(in), StreamOptions{})
		if dec := decompress(t, "gzip", []byte(out)); bytes.Contains(dec, []byte(knownSecret)) || len(dec) < len(big)-100 {
			t.Errorf("secret passed or body lost (%d of %d bytes)", len(dec), len(big))
		}
	})
}
