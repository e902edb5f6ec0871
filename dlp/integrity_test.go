package dlp

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

var seedFlag = flag.Uint64("dlp.seed", 0, "seed of the random read sizes in the integrity tests (0: the fixed seeds and one from the clock)")

// seeds are the seeds a randomised integrity test runs with: -dlp.seed
// alone when given, else a few fixed ones and one from the clock. Each is
// logged, so a failure can be replayed.
func seeds(t *testing.T) []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	return []uint64{1, 2, 3, uint64(time.Now().UnixNano())}
}

// chunker hands out read or write sizes from 1 byte to 70 KiB: runs of
// one random size (a pipe hands out equal reads, and a writer reusing its
// buffer passes the same slice again), single random sizes, and runs of
// tiny ones.
type chunker struct {
	r    *rand.Rand
	size int
	left int
}

func (c *chunker) next() int {
	if c.left == 0 {
		c.left = 1 + c.r.IntN(40)
		switch c.r.IntN(4) {
		case 0:
			c.size = 1 + c.r.IntN(16)
		case 1:
			c.size = []int{512, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10}[c.r.IntN(6)]
		case 2:
			c.size, c.left = 1+c.r.IntN(70<<10), 1
		default:
			c.size = 1 + c.r.IntN(70<<10)
		}
	}
	c.left--
	return c.size
}

// chunkReader returns its data in reads whose sizes a chunker picks.
type chunkReader struct {
	data []byte
	c    *chunker
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.c.next())], r.data)
	r.data = r.data[n:]
	return n, nil
}

// scrubChunked scrubs body twice, with a chunker's sizes: through Scrub
// (reads of those sizes, into one reused buffer) and through NewStream
// (writes of those sizes, each from the same reused buffer, as io.Copy
// does). Both outputs must be the same; that output and the report of the
// Scrub run are returned.
func scrubChunked(t testing.TB, e *Engine, pol *Policy, body []byte, ct string, seed uint64) (string, *Report) {
	t.Helper()
	var out bytes.Buffer
	rep := &Report{}
	c := &chunker{r: rand.New(rand.NewPCG(seed, 1))}
	if err := e.Scrub(&out, &chunkReader{data: body, c: c}, pol, StreamOptions{ContentType: ct}, rep); err != nil {
		t.Fatalf("seed %d: scrub: %v", seed, err)
	}
	var out2 bytes.Buffer
	w, err := e.NewStream(&out2, pol, StreamOptions{ContentType: ct}, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 70<<10)
	for rest := body; len(rest) > 0; {
		n := copy(buf[:min(len(buf), c.next())], rest)
		rest = rest[n:]
		if _, err := w.Write(buf[:n]); err != nil {
			t.Fatalf("seed %d: write: %v", seed, err)
		}
		clear(buf[:n]) // the caller may reuse its buffer at once
	}
	if err := w.Close(); err != nil {
		t.Fatalf("seed %d: close: %v", seed, err)
	}
	if out.String() != out2.String() {
		t.Fatalf("seed %d: Scrub and NewStream disagree at byte %d", seed, firstDiff(out.String(), out2.String()))
	}
	return out.String(), rep
}

func firstDiff(a, b string) int {
	for i := 0; i < min(len(a), len(b)); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// diffContext shows got and want around their first difference.
func diffContext(got, want string) string {
	i := firstDiff(got, want)
	lo := max(0, i-40)
	return fmt.Sprintf("first difference at byte %d (of %d, want %d):\ngot  %q\nwant %q", i, len(got), len(want),
		got[lo:min(len(got), i+40)], want[lo:min(len(want), i+40)])
}

// benignJSON is a large JSON body without a finding: long strings of
// code-like text with every kind of escape, raw and escaped non-ASCII,
// nested objects and arrays, numbers.
func benignJSON(r *rand.Rand, size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","max_tokens":4096,"messages":[`)
	pieces := []string{`\n`, `\t`, `\"`, `\\`, `\/`, `\u00e9`, `\u00E9`, `\ud83d\ude00`, `\u2028`, `é`, `😀`, `日本語`, `\r\n`, `\b\f`, `\u0041`}
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":%q,"n":%d,"f":-%d.%de+%d,"ok":true,"x":null,"content":"`, []string{"user", "assistant"}[i%2], i, r.IntN(1000), r.IntN(1000), r.IntN(9))
		// Strings from a few bytes to a few hundred KiB.
		n := []int{8, 300, 4 << 10, 40 << 10, 100 << 10, 300 << 10}[r.IntN(6)]
		n = n/2 + r.IntN(n)
		for k := 0; k < n; {
			if r.IntN(8) == 0 {
				p := pieces[r.IntN(len(pieces))]
				b.WriteString(p)
				k += len(p)
				continue
			}
			w := benchWords[r.IntN(len(benchWords))]
			w = strings.NewReplacer(`"`, `\"`, `\`, `\\`).Replace(w)
			b.WriteString(w)
			b.WriteByte(' ')
			k += len(w) + 1
		}
		b.WriteString(`","tags":[[1,2,[3]],{"a":{"b":"c"}}]}`)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// benignText is text without a finding, with long lines and none.
func benignText(r *rand.Rand, size int) []byte {
	return []byte(benchText(r, size) + " é 😀 \\ \" ' end")
}

// TestBenignBodiesByteIdentical: large bodies with nothing to find come
// out byte for byte the same, whatever the read and write sizes.
func TestBenignBodiesByteIdentical(t *testing.T) {
	t.Parallel()
	e := mustEngine(t, Config{Secrets: benchSecrets(100)})
	for _, seed := range seeds(t) {
		t.Logf("seed %d (replay with -dlp.seed=%d)", seed, seed)
		r := rand.New(rand.NewPCG(seed, 2))
		bodies := []struct {
			name, ct string
			body     []byte
		}{
			{"json 5MB", "application/json", benignJSON(r, 5<<20)},
			{"json 300KB", "application/json", benignJSON(r, 300<<10)},
			{"text 2MB", "text/plain", benignText(r, 2<<20)},
		}
		for _, b := range bodies {
			if b.ct == "application/json" && !json.Valid(b.body) {
				t.Fatalf("%s: the fixture is not valid JSON", b.name)
			}
			for _, class := range []Class{ClassExternal, ClassPublic} {
				pol := e.PolicyForClass(class)
				out, rep := scrubChunked(t, e, &pol, b.body, b.ct, seed)
				if fs := rep.Findings(); len(fs) > 0 {
					t.Fatalf("seed %d, %s to %s: the benign body had findings: %v", seed, b.name, class, fs)
				}
				if out != string(b.body) {
					t.Fatalf("seed %d, %s to %s: changed; %s", seed, b.name, class, diffContext(out, string(b.body)))
				}
			}
		}
	}
}

// boundaryItem is a finding placed in a body: its decoded text, and what
// it becomes.
type boundaryItem struct {
	name, text, want string
	cat              Category
}

func boundaryItems(t *testing.T) []boundaryItem {
	pw := j("Zq8#mK2", "vL9x")
	return []boundaryItem{
		{"known", knownSecret, "[REDACTED:SECRET]", CatSecret},
		{"aws", awsKey, "[REDACTED:CLOUD_KEY]", CatCloudKey},
		{"email", "bob@corp.io", "[REDACTED:EMAIL]", CatEmail},
		{"assignment", "password=" + pw, "password=[REDACTED:PASSWORD]", CatPassword},
		{"card", "4111 1111 1111 1111", "[REDACTED:CREDIT_CARD]", CatCreditCard},
		{"jwt", jwtToken, "[REDACTED:JWT]", CatJWT},
		{"pem", strings.TrimSpace(pemKey(t)), "[REDACTED:PRIVATE_KEY]", CatPrivateKey},
		{"host label", "http://buildbox/job", "http://[REDACTED:INTERNAL_IP]/job", CatInternalIP},
		{"phone", "415-839-" + "2271", "[REDACTED:PHONE]", CatPhone},
		{"known spaced", separated(knownSecret, 4, " "), "[REDACTED:SECRET]", CatSecret},
		// Two findings back to back: the second must not be taken for
		// the rest of the first when the first ends a window.
		{"adjacent", knownSecret + awsKey, "[REDACTED:SECRET][REDACTED:CLOUD_KEY]", CatSecret},
	}
}

// jsonEscapeFiller escapes text for a JSON string the way a sender might:
// newlines as \n, é as \u00e9, quotes and backslashes.
func jsonEscapeFiller(s string) string {
	return strings.NewReplacer("\n", `\n`, "é", `\u00e9`, `"`, `\"`, `\`, `\\`, "\t", `\t`).Replace(s)
}

// TestFindingsAroundWindowBoundaries places each finding at every decoded
// offset around the places a segment's window is cut (the hold-back cut
// and the window's end, first and second window), in text and inside one
// long JSON string with escapes around it, read 4 KiB at a time: the body
// must come out with exactly the expected redaction and the report must
// list it, whatever the offset.
func TestFindingsAroundWindowBoundaries(t *testing.T) {
	e := mustEngine(t, Config{Secrets: []Secret{{Value: knownSecret, Source: "t"}}})
	if e.window != 64<<10 || e.holdBack < 8<<10 {
		t.Fatalf("window %d, hold back %d: the offsets below assume 64 KiB and 8 KiB", e.window, e.holdBack)
	}
	// Where a segment cuts: the first window is processed when it is
	// full, and settles up to window-holdBack; the next one starts
	// lookbehind bytes before that cut.
	cut1 := e.window - e.holdBack
	win2 := cut1 + e.window - lookbehind
	marks := []int{cut1, e.window, win2 - e.holdBack, win2}
	// Filler: text with newlines, tabs and accents (escaped in JSON), n
	// bytes decoded; esc gives its JSON-escaped form.
	fillUnit := "lorem ipsum\tdolor é sit amet\n"
	escUnit := jsonEscapeFiller(fillUnit)
	filler := func(n int, esc bool) string {
		q, r := n/len(fillUnit), n%len(fillUnit)
		tail := fillUnit[:r]
		for !utf8.ValidString(tail) {
			tail = tail[:len(tail)-1]
		}
		tail += strings.Repeat(" ", r-len(tail))
		if esc {
			return strings.Repeat(escUnit, q) + jsonEscapeFiller(tail)
		}
		return strings.Repeat(fillUnit, q) + tail
	}
	pol := e.PolicyForClass(ClassPublic)
	for _, it := range boundaryItems(t) {
		// Every offset where the item's start or end is within 24 bytes
		// of a mark, every 7th between.
		var offsets []int
		for _, m := range marks {
			for d := m - len(it.text) - 24; d <= m+24; d++ {
				if d <= m-len(it.text)+24 || d >= m-24 || d%7 == 0 {
					offsets = append(offsets, d)
				}
			}
		}
		for _, ctx := range []string{"text", "json"} {
			t.Run(it.name+"/"+ctx, func(t *testing.T) {
				for _, off := range offsets {
					esc := ctx == "json"
					pre, post := filler(off-1, esc)+" ", " "+filler(win2+e.holdBack-off, esc)
					in, want := pre+it.text+post, pre+it.want+post
					ct := "text/plain"
					if esc {
						ct = "application/json"
						in = `{"content":"` + pre + jsonEscapeFiller(it.text) + post + `","n":1}`
						want = `{"content":"` + pre + it.want + post + `","n":1}`
					}
					var out bytes.Buffer
					rep := &Report{}
					err := e.Scrub(&out, &splitReader{data: []byte(in), cuts: every(len(in), 4<<10)}, &pol, StreamOptions{ContentType: ct}, rep)
					if err != nil {
						t.Fatal(err)
					}
					if out.String() != want {
						t.Fatalf("offset %d: %s", off, diffContext(out.String(), want))
					}
					wantN := strings.Count(it.want, "[REDACTED:")
					fs := rep.Findings()
					if len(fs) != wantN || fs[0].Category != it.cat || rep.Redacted() != wantN {
						t.Fatalf("offset %d: report %v, want %d finding(s), the first %s", off, fs, wantN, it.cat)
					}
				}
			})
		}
	}
}

// every returns the multiples of step below n.
func every(n, step int) []int {
	var out []int
	for c := step; c < n; c += step {
		out = append(out, c)
	}
	return out
}

// TestAssignmentsDeepInLongJSONStrings: an assignment anywhere in a JSON
// string longer than a window, whole-body reads (32 KiB) and 4 KiB reads:
// only the value goes, the bytes after it stay, and the report has it.
func TestAssignmentsDeepInLongJSONStrings(t *testing.T) {
	e := mustEngine(t, Config{})
	pol := e.PolicyForClass(ClassPublic)
	pw := j("Zq8#mK2", "vL9x")
	r := rand.New(rand.NewPCG(5, 5))
	text := benchText(r, 200<<10)
	for off := 1000; off < 150<<10; off += 997 {
		// At a word's start: a word cut short could be something else
		// (http://loca is a single-label host).
		for strings.IndexByte(" \t\n", text[off-1]) < 0 {
			off++
		}
		// Escapes before and after the assignment.
		s := jsonEscapeFiller(text[:off]) + " password=" + pw + " after" + jsonEscapeFiller(text[off:])
		in := `{"a":[1,2],"content":"` + s + `","b":"tail"}`
		want := strings.Replace(in, "password="+pw, "password=[REDACTED:PASSWORD]", 1)
		for _, reads := range []int{32 << 10, 4 << 10} {
			var out bytes.Buffer
			rep := &Report{}
			if err := e.Scrub(&out, &splitReader{data: []byte(in), cuts: every(len(in), reads)}, &pol, StreamOptions{ContentType: "application/json"}, rep); err != nil {
				t.Fatal(err)
			}
			if out.String() != want {
				t.Fatalf("assignment at %d, %d-byte reads: %s", off, reads, diffContext(out.String(), want))
			}
			if fs := rep.Findings(); len(fs) != 1 || fs[0].Category != CatPassword {
				t.Fatalf("assignment at %d, %d-byte reads: report %v", off, reads, fs)
			}
		}
	}
}

// FuzzScrubStream: for any body, scrubbing it in pieces gives what
// scrubbing it whole gives; a body with no finding comes out unchanged;
// each placeholder in the output is one redaction in the report.
func FuzzScrubStream(f *testing.F) {
	e, err := New(Config{Secrets: []Secret{{Value: knownSecret, Source: "fuzz"}}})
	if err != nil {
		f.Fatal(err)
	}
	// A small window, so short inputs cross many boundaries.
	small, _ := New(Config{Secrets: []Secret{{Value: knownSecret, Source: "fuzz"}}})
	small.window, small.holdBack = 256, 100
	for _, s := range []string{
		`{"a":"b\n\u00e9\ud83d\ude00 \"q\" \\","n":[1,2.5e3,true,null]}`,
		`{"content":"key ` + knownSecret + ` password=` + j("Zq8#mK2", "vL9x") + ` mail bob@corp.io"}`,
		"text " + awsKey + knownSecret + " 4111 1111 1111 1111 10.0.0.7 " + jwtToken,
		"a=1&password=Zq8%23mK2vL9x&q=" + strings.ReplaceAll(knownSecret, "+", "%2B"),
		`{"k":"lone \ud800 and bad \x escape","v":"\u` + `"}`,
		strings.Repeat(`{"x":"`+strings.Repeat(`ab\n`, 50)+`"},`, 20),
		// Formatting the renderings undo, and a sniffed compressed body.
		wrap(base64.StdEncoding.EncodeToString([]byte("k="+knownSecret+strings.Repeat("-", 60))), 20, "\n"),
		"q=" + strings.Replace(knownSecret, "=", "=3D", 1) + "=\n tail %2541 \\u0041 ABCDEF0123456789abcdef",
		string(compress(f, "gzip", []byte("x "+knownSecret))),
	} {
		for ct := range uint8(4) {
			f.Add([]byte(s), ct, uint64(len(s)))
		}
	}
	types := []string{"application/json", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=XyZ"}
	f.Fuzz(func(t *testing.T, body []byte, ct uint8, seed uint64) {
		typ := types[int(ct)%len(types)]
		for _, eng := range []*Engine{e, small} {
			pol := eng.PolicyForClass(ClassPublic)
			whole, rep, err := eng.ScrubBytes(&pol, body, StreamOptions{ContentType: typ})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			rep2 := &Report{}
			c := &chunker{r: rand.New(rand.NewPCG(seed, 3))}
			c.left, c.size = 1<<30, 1+int(seed%97)
			if err := eng.Scrub(&out, &chunkReader{data: body, c: c}, &pol, StreamOptions{ContentType: typ}, rep2); err != nil {
				t.Fatal(err)
			}
			if out.String() != string(whole) {
				t.Fatalf("%s, reads of %d: %s", typ, c.size, diffContext(out.String(), string(whole)))
			}
			if len(rep.Findings()) == 0 && !bytes.Equal(whole, body) {
				t.Fatalf("%s: changed without a finding: %s", typ, diffContext(string(whole), string(body)))
			}
			if !bytes.Contains(body, []byte("REDACTED")) && sniffCoding(bufio.NewReader(bytes.NewReader(body))) == "" {
				n := bytes.Count(whole, []byte("[REDACTED:")) + bytes.Count(whole, []byte("%5BREDACTED%3A"))
				if n != rep.Redacted() {
					t.Fatalf("%s: %d placeholders, %d redactions reported: %v", typ, n, rep.Redacted(), rep.Findings())
				}
			}
			if typ == "application/json" && json.Valid(body) && !json.Valid(whole) {
				t.Fatalf("valid JSON in, invalid out:\n%q\n%q", body, whole)
			}
		}
	})
}
