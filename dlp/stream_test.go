package dlp

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/textproto"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// splitReader returns its data in reads that end at the given offsets.
type splitReader struct {
	data []byte
	cuts []int
	pos  int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if r.pos >= len(r.data) {
		return 0, io.EOF
	}
	end := len(r.data)
	for _, c := range r.cuts {
		if c > r.pos {
			end = min(end, c)
			break
		}
	}
	n := copy(p, r.data[r.pos:end])
	r.pos += n
	return n, nil
}

func scrubReader(t testing.TB, e *Engine, class Class, r io.Reader, o StreamOptions) (string, *Report) {
	t.Helper()
	pol := e.PolicyForClass(class)
	var out bytes.Buffer
	rep := &Report{}
	if err := e.Scrub(&out, r, &pol, o, rep); err != nil {
		t.Fatalf("scrub: %v", err)
	}
	return out.String(), rep
}

// TestSplitAtEveryOffset feeds bodies in two reads cut at every byte
// offset (and in one-byte reads): the output must not depend on where the
// reads end.
func TestSplitAtEveryOffset(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}})
	jsonBody, _ := json.Marshal(map[string]any{"messages": []any{map[string]string{"role": "user",
		"content": "key " + knownSecret + "\nand " + awsKey + " mail bob@corp.io \"quoted\" é 😀 card 4111 1111 1111 1111"}}, "password": j("Zq8#mK2", "vL9x")})
	bodies := []struct {
		name string
		ct   string
		body string
	}{
		{"text", "text/plain", "a " + knownSecret + " b " + jwtToken + " c " + pemKey(t) + " d postgres://u:" + j("Zq8#mK2", "vL9x") + "@h.io/x"},
		{"json", "application/json", string(jsonBody)},
		{"json with escapes", "application/json", `{"k":"` + string(unicodeEscapeAll(knownSecret, lowerHex)) + `\n` + strings.ReplaceAll(knownSecret, "/", `\/`) + `"}`},
		{"form", "application/x-www-form-urlencoded", "a=1&api_key=" + "Zq8%23mK2vL9x" + "&note=" + strings.ReplaceAll(knownSecret, "+", "%2B") + "+is+it&mail=bob%40corp.io"},
		{"multipart", "multipart/form-data; boundary=XyZ", "--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nhello " + knownSecret + "\r\n--XyZ\r\nContent-Type: application/json\r\n\r\n{\"t\":\"" + awsKey + "\"}\r\n--XyZ--\r\n"},
	}
	for _, b := range bodies {
		t.Run(b.name, func(t *testing.T) {
			o := StreamOptions{ContentType: b.ct}
			want, rep := scrubReader(t, e, ClassExternal, strings.NewReader(b.body), o)
			if len(rep.Findings()) == 0 || want == b.body {
				t.Fatalf("nothing found in %q", b.body)
			}
			for cut := 1; cut < len(b.body); cut++ {
				got, _ := scrubReader(t, e, ClassExternal, &splitReader{data: []byte(b.body), cuts: []int{cut}}, o)
				if got != want {
					t.Fatalf("cut at %d:\ngot  %q\nwant %q", cut, got, want)
				}
			}
			got, _ := scrubReader(t, e, ClassExternal, iotest.OneByteReader(strings.NewReader(b.body)), o)
			if got != want {
				t.Fatalf("one-byte reads:\ngot  %q\nwant %q", got, want)
			}
		})
	}
}

// smallEngine is an engine whose segments hold small windows, so the
// window logic (cut, hold back, look behind) is exercised by short texts.
func smallEngine(t testing.TB, cfg Config, window, hold int) *Engine {
	e := mustEngine(t, cfg)
	e.window, e.holdBack = window, hold
	return e
}

// TestWindowBoundaries puts findings at every offset around the ends of
// small windows: what is found must not depend on the window size.
func TestWindowBoundaries(t *testing.T) {
	cfg := Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}}
	big := mustEngine(t, cfg)
	small := smallEngine(t, cfg, 256, 100)
	items := []string{knownSecret, awsKey, "bob@corp.io", "10.0.0.7", "4111 1111 1111 1111", "password=" + j("Zq8#mK2", "vL9x"), "https://u:" + j("Zq8#mK2", "vL9x") + "@h.io/"}
	for _, item := range items {
		for off := 150; off < 420; off++ {
			in := strings.Repeat("x ", off/2) + strings.Repeat(" ", off%2) + item + " " + strings.Repeat("y ", 200)
			want, _ := scrubText(t, big, ClassExternal, in)
			got, _ := scrubText(t, small, ClassExternal, in)
			if got != want {
				t.Fatalf("%q at %d:\nsmall window %q\nwhole text   %q", item, off, got, want)
			}
			if !strings.Contains(want, "[REDACTED:") {
				t.Fatalf("%q not found at %d", item, off)
			}
		}
	}
}

// TestLongPEMAcrossWindows: a private key longer than a window is redacted
// whole, however the windows fall.
func TestLongPEMAcrossWindows(t *testing.T) {
	key := pemKey(t)
	e := smallEngine(t, Config{}, 64, 30)
	for pad := 0; pad < 70; pad += 7 {
		in := strings.Repeat("a", pad) + " " + key + " after"
		got, _ := scrubText(t, e, ClassExternal, in)
		want := strings.Repeat("a", pad) + " [REDACTED:PRIVATE_KEY]"
		if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, " after") || strings.Contains(got, "MII") || strings.Contains(got, "-----END") {
			t.Fatalf("pad %d: %q", pad, got)
		}
	}
	// A block that never ends is redacted to the end of the text.
	got, _ := scrubText(t, e, ClassExternal, "x "+key[:len(key)-40])
	if got != "x [REDACTED:PRIVATE_KEY]" {
		t.Errorf("unterminated block: %q", got)
	}
}

func TestJSONStaysValidAndUntouchedBytesStay(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}})
	inputs := []string{
		`{"a":"` + knownSecret + `","n":4111111111111111,"arr":[1,2.5e3,true,null,"` + awsKey + `"],"e":"\u00e9\ud83d\ude00\"x\\"}`,
		`{"messages":[{"role":"user","content":"see \/Users\/bob and mail bob@corp.io\n"}],"password":"` + j("Zq8#mK2", "vL9x") + `"}`,
		`["` + string(unicodeEscapeAll(knownSecret, lowerHex)) + `"]`,
		`{"k": "lone \ud800 surrogate and bad \x escape", "v": "` + knownSecret + `"}`,
	}
	for _, in := range inputs {
		out, _, err := e.ScrubBytes(&Policy{Class: ClassPublic, act: DefaultPolicy(ClassPublic).act}, []byte(in), StreamOptions{ContentType: "application/json"})
		if err != nil {
			t.Fatal(err)
		}
		if json.Valid([]byte(in)) && !json.Valid(out) {
			t.Errorf("output is not valid JSON:\n%s", out)
		}
		if bytes.Contains(out, []byte(knownSecret)) || bytes.Contains(out, []byte(awsKey)) {
			t.Errorf("leaked: %s", out)
		}
	}
	// Nothing to find: byte for byte the same, odd escapes included.
	clean := `{"a":"caf\u00e9 \ud83d\ude00 \/ \"q\" \\ \b\f\n\r\t","b":[1,-2.5E+3,0.1],"c":{"d":null}, "e" : "x" }`
	out, _, _ := e.ScrubBytes(&Policy{act: DefaultPolicy(ClassPublic).act}, []byte(clean), StreamOptions{ContentType: "application/json"})
	if string(out) != clean {
		t.Errorf("clean JSON changed:\n%s\n%s", clean, out)
	}
}

func TestJSONKeyedValues(t *testing.T) {
	e := mustEngine(t, Config{})
	in := `{"user":"bob","password":"` + j("Zq8#mK2", "vL9x") + `","apiKey" : "` + j("f83kd92L", "sQx0P") + `","token":"short","note":"password"}`
	out, _ := scrubReader(t, e, ClassExternal, strings.NewReader(in), StreamOptions{ContentType: "application/json"})
	want := `{"user":"bob","password":"[REDACTED:PASSWORD]","apiKey" : "[REDACTED:PASSWORD]","token":"short","note":"password"}`
	if out != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
}

func TestFormAndURL(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	pol := e.PolicyForClass(ClassExternal)
	form := "user=bob&password=Zq8%23mK2vL9x&q=" + strings.ReplaceAll(strings.ReplaceAll(knownSecret, "+", "%2B"), "/", "%2F") + "&x=a+b%zz"
	out, _, err := e.ScrubBytes(&pol, []byte(form), StreamOptions{ContentType: "application/x-www-form-urlencoded"})
	if err != nil {
		t.Fatal(err)
	}
	want := "user=bob&password=%5BREDACTED%3APASSWORD%5D&q=%5BREDACTED%3ASECRET%5D&x=a+b%zz"
	if string(out) != want {
		t.Errorf("form:\ngot  %s\nwant %s", out, want)
	}
	if got := e.ScrubQuery(&pol, "a=1&m=bob%40corp.io&z", nil); got != "a=1&m=%5BREDACTED%3AEMAIL%5D&z" {
		t.Errorf("query: %s", got)
	}
	if got := e.ScrubPath(&pol, "/v1/users/bob%40corp.io/"+awsKey, nil); got != "/v1/users/%5BREDACTED%3AEMAIL%5D/%5BREDACTED%3ACLOUD_KEY%5D" {
		t.Errorf("path: %s", got)
	}
	if got := e.ScrubPath(&pol, "/a%2Fb/c", nil); got != "/a%2Fb/c" {
		t.Errorf("clean path changed: %s", got)
	}
}

func TestMultipart(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	w, _ := mw.CreateFormField("comment")
	io.WriteString(w, "contact bob@corp.io, key "+knownSecret)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="f"; filename="a.bin"`)
	h.Set("Content-Type", "application/octet-stream")
	w, _ = mw.CreatePart(h)
	// Binary data that looks like an address and a card, plus a known
	// value: only the known value goes.
	io.WriteString(w, "\x00\x01bob@corp.io 4111111111111111\x02"+knownSecret)
	h = textproto.MIMEHeader{}
	h.Set("Content-Type", "application/json")
	w, _ = mw.CreatePart(h)
	io.WriteString(w, `{"k":"`+awsKey+`"}`)
	mw.Close()
	ct := "multipart/form-data; boundary=" + mw.Boundary()
	out, _ := scrubReader(t, e, ClassExternal, bytes.NewReader(buf.Bytes()), StreamOptions{ContentType: ct})
	r := multipart.NewReader(strings.NewReader(out), mw.Boundary())
	var parts []string
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("output is not multipart: %v\n%q", err, out)
		}
		b, _ := io.ReadAll(p)
		parts = append(parts, string(b))
	}
	want := []string{"contact [REDACTED:EMAIL], key [REDACTED:SECRET]", "\x00\x01bob@corp.io 4111111111111111\x02[REDACTED:SECRET]", `{"k":"[REDACTED:CLOUD_KEY]"}`}
	if fmt.Sprint(parts) != fmt.Sprint(want) {
		t.Errorf("parts:\n%q\nwant\n%q", parts, want)
	}
}

func compress(t testing.TB, coding string, data []byte) []byte {
	var b bytes.Buffer
	var w io.WriteCloser
	switch coding {
	case "gzip":
		w = gzip.NewWriter(&b)
	case "deflate":
		w = zlib.NewWriter(&b)
	case "raw-deflate":
		w, _ = flate.NewWriter(&b, 5)
	case "br":
		w = brotli.NewWriter(&b)
	case "zstd":
		w, _ = zstd.NewWriter(&b)
	}
	w.Write(data)
	w.Close()
	return b.Bytes()
}

func decompress(t testing.TB, coding string, data []byte) []byte {
	t.Helper()
	r, err := newDecoder(coding, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestContentEncodings(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	body := []byte(`{"content":"` + knownSecret + ` and ` + awsKey + `"}`)
	want := `{"content":"[REDACTED:SECRET] and [REDACTED:CLOUD_KEY]"}`
	for _, coding := range []string{"gzip", "deflate", "br", "zstd"} {
		t.Run(coding, func(t *testing.T) {
			out, _ := scrubReader(t, e, ClassExternal, bytes.NewReader(compress(t, coding, body)), StreamOptions{ContentType: "application/json", ContentEncoding: coding})
			if got := string(decompress(t, coding, []byte(out))); got != want {
				t.Errorf("got %s", got)
			}
		})
	}
	t.Run("raw deflate", func(t *testing.T) {
		out, _ := scrubReader(t, e, ClassExternal, bytes.NewReader(compress(t, "raw-deflate", body)), StreamOptions{ContentType: "application/json", ContentEncoding: "deflate"})
		if got := string(decompress(t, "deflate", []byte(out))); got != want {
			t.Errorf("got %s", got)
		}
	})
	t.Run("stacked gzip then br", func(t *testing.T) {
		in := compress(t, "br", compress(t, "gzip", body))
		out, _ := scrubReader(t, e, ClassExternal, bytes.NewReader(in), StreamOptions{ContentType: "application/json", ContentEncoding: "gzip, br"})
		if got := string(decompress(t, "gzip", decompress(t, "br", []byte(out)))); got != want {
			t.Errorf("got %s", got)
		}
	})
	t.Run("split compressed stream", func(t *testing.T) {
		in := compress(t, "gzip", body)
		for cut := 1; cut < len(in); cut++ {
			out, _ := scrubReader(t, e, ClassExternal, &splitReader{data: in, cuts: []int{cut}}, StreamOptions{ContentType: "application/json", ContentEncoding: "gzip"})
			if got := string(decompress(t, "gzip", []byte(out))); got != want {
				t.Fatalf("cut %d: %s", cut, got)
			}
		}
	})
	bad := []struct{ name, coding, body string }{
		{"not gzip", "gzip", "plain text " + knownSecret},
		{"truncated gzip", "gzip", string(compress(t, "gzip", body)[:20])},
		{"unknown coding", "compress", "x"},
		{"not zstd", "zstd", "plain"},
		{"not brotli", "br", "\xff\xff\xff plain " + knownSecret},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			pol := e.PolicyForClass(ClassExternal)
			var out bytes.Buffer
			err := e.Scrub(&out, strings.NewReader(b.body), &pol, StreamOptions{ContentEncoding: b.coding}, nil)
			if !errors.Is(err, ErrEncoding) {
				t.Errorf("error %v, want ErrEncoding", err)
			}
			if bytes.Contains(out.Bytes(), []byte(knownSecret)) {
				t.Errorf("the secret reached the output")
			}
		})
	}
	t.Run("compression bomb", func(t *testing.T) {
		in := compress(t, "gzip", bytes.Repeat([]byte("a"), 4<<20))
		pol := e.PolicyForClass(ClassExternal)
		err := e.Scrub(io.Discard, bytes.NewReader(in), &pol, StreamOptions{ContentEncoding: "gzip", MaxDecoded: 1 << 20}, nil)
		if !errors.Is(err, ErrEncoding) {
			t.Errorf("error %v, want ErrEncoding", err)
		}
	})
}

// TestStreamingMemory scrubs a 64 MiB stream and checks the engine held
// no more than a few windows of it.
func TestStreamingMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB stream")
	}
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret}}})
	src := &repeatReader{chunk: []byte("line of text with a key " + knownSecret + " inside it\n"), left: 64 << 20}
	pol := e.PolicyForClass(ClassExternal)
	cw := &countWriter{}
	rep := &Report{}
	if err := e.Scrub(cw, src, &pol, StreamOptions{}, rep); err != nil {
		t.Fatal(err)
	}
	if cw.secret {
		t.Error("a secret passed")
	}
	if rep.Dropped() == 0 {
		t.Error("expected more findings than the report keeps")
	}
}

type repeatReader struct {
	chunk []byte
	left  int
	off   int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && r.left > 0 {
		c := copy(p[n:], r.chunk[r.off:])
		r.off = (r.off + c) % len(r.chunk)
		n += c
		r.left -= c
	}
	return n, nil
}

type countWriter struct {
	n      int
	secret bool
	tail   []byte
}

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	joined := append(w.tail, p...)
	if bytes.Contains(joined, []byte(knownSecret)) {
		w.secret = true
	}
	w.tail = append(w.tail[:0], joined[max(0, len(joined)-64):]...)
	return len(p), nil
}

func TestFalsePositiveCorpus(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	img := make([]byte, 30000)
	for i := range img {
		img[i] = byte(r.IntN(256))
	}
	corpus := map[string]string{
		"go source": `package main

import ("fmt"; "net/http"; "os")

// Server handles requests on :8080 (see https://pkg.go.dev/net/http).
func main() {
	token := os.Getenv("API_TOKEN")
	password := flag.String("password", "", "the admin password")
	if err := http.ListenAndServe("127.0.0.1:8080", nil); err != nil {
		fmt.Fprintf(os.Stderr, "listen: %v (token set: %t)\n", err, token != "")
	}
	const maxTokens = 4096
	secretName := "db-credentials"
	_ = secretName; _ = password
	ids := []int{1234567890123, 9876543210987}
	_ = ids
}
`,
		"javascript": `import { useState } from "react"; // v18.2.0
const apiKey = process.env.NEXT_PUBLIC_API_KEY;
export function Login({ onSubmit }) {
  const [password, setPassword] = useState("");
  const token = localStorage.getItem("token");
  return <input type="password" value={password} onChange={e => setPassword(e.target.value)} />;
}
fetch("https://api.github.com/repos/octo/app/issues?per_page=100&page=2");
`,
		"python": `import os
SECRET_KEY = os.environ["SECRET_KEY"]
DATABASES = {"default": {"PASSWORD": os.getenv("DB_PASSWORD"), "HOST": "db"}}
def check_token(token: str) -> bool:
    return hmac.compare_digest(token, settings.API_TOKEN)
`,
		"package-lock": `{
  "name": "app", "version": "1.0.0", "lockfileVersion": 3,
  "packages": {
    "node_modules/@babel/core": {
      "version": "7.24.0",
      "resolved": "https://registry.npmjs.org/@babel/core/-/core-7.24.0.tgz",
      "integrity": "sha512-fQfkg0Gjkza3nf0c7/w6Xf34BW4YvzNfACRLmmb7XRLa6XHdR+K9AlJlxneFfWYf6uhOzuzZVTjF/8KfndZANw==",
      "dependencies": {"@ampproject/remapping": "^2.2.0", "semver": "^6.3.1"}
    }
  }
}`,
		"go.sum":       "github.com/pkg/sftp v1.13.12 h1:X4JNTQ6HaTPFmtHT1jVuKmTGlyeyW/nd8HzJ2f6YIXI=\ngolang.org/x/crypto v0.58.0/go.mod h1:lx3yT4nWnLx7wIh7kHqTFmTiXvSbyTZaTWpGu6rJJbE=\n",
		"yarn.lock":    "\"@types/node@^20.0.0\":\n  version \"20.11.5\"\n  resolved \"https://registry.yarnpkg.com/@types/node/-/node-20.11.5.tgz#4c6a9d7d\"\n  integrity sha512-g557vgQjUUfN76MZAN/dt1z3dzcUsimuysco0KeluHgrPdJXkP/XdAURgyO2W9fZWHRtRBiVKzKn8vyOAwlG+w==\n",
		"identifiers":  "uuid 6ba7b810-9dad-11d1-80b4-00c04fd430c8 sha e83c5163316f89bfbde7d9ab23ca2e25604af290 short a1b2c3d sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"versions":     "10.0.0.1-beta v1.2.3 1.10.2 node 20.11.0 python3.11.7 10.0.19045.3930 2.0.0-rc.1 build 1.2.3.4 0.0.0.0 ::1",
		"numbers":      "price 1299.99 count 42 ts 1732345678 ms 1732345678901 phone-like 0800 123 456 epoch 2026-11-23T05:37:33Z port 5432 pid 12345",
		"base64 image": `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + base64Std(img) + `"}}`,
		"markdown":     "# Setup\n\nRun `make test`. See [docs](https://example.com/docs) or email support@example.com.\n\n| key | value |\n|---|---|\n| token | see vault |\n",
		"shell":        "export PATH=$HOME/bin:$PATH\ncurl -sSf https://sh.rustup.rs | sh\ngit clone git@github.com:org/repo.git && cd repo\nssh -i ~/.ssh/id_ed25519 deploy@203.0.113.7\n",
	}
	e := mustEngine(t, Config{Secrets: benchSecrets(200)})
	for name, text := range corpus {
		for _, class := range []Class{ClassExternal, ClassPublic} {
			for _, ct := range []string{"text/plain", "application/json"} {
				pol := e.PolicyForClass(class)
				out, rep, err := e.ScrubBytes(&pol, []byte(text), StreamOptions{ContentType: ct})
				if err != nil {
					t.Fatal(err)
				}
				if string(out) != text {
					t.Errorf("%s (%s, %s) changed: %v", name, class, ct, rep.Findings())
				}
			}
		}
	}
}

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
