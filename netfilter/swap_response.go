package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"

	"github.com/vibedom/vibedom/dlp"
)

// keyScrubber finds the real keys of a swap filter in responses, in every
// form the DLP matches a known value in.
type keyScrubber struct {
	e    *dlp.Engine
	pol  dlp.Policy
	keys []string
	// public is, per key, the length of its kind's public prefix (what it
	// shares with its placeholder: sk-ant-api03-).
	public []int
}

// newKeyScrubber builds f's scrubber, or nil when f has no key.
func newKeyScrubber(vals []swapSecret) *keyScrubber {
	if len(vals) == 0 {
		return nil
	}
	var secrets []dlp.Secret
	var keys []string
	var public []int
	for _, s := range vals {
		v := s.value
		secrets = append(secrets, dlp.Secret{Value: v, Source: "credential " + s.name})
		keys = append(keys, v)
		n := 0
		for n < len(v) && n < len(s.token) && v[n] == s.token[n] {
			n++
		}
		public = append(public, n)
	}
	e, err := dlp.New(dlp.Config{Secrets: secrets})
	if err != nil {
		return nil // keys are checked (16 to 4096 printable bytes) long before
	}
	pol := dlp.DefaultPolicy(dlp.ClassPublic)
	for _, c := range dlp.Categories() {
		a := dlp.Pass
		if c == dlp.CatSecret {
			a = dlp.Redact
		}
		pol = pol.With(c, a)
	}
	return &keyScrubber{e: e, pol: pol, keys: keys, public: public}
}

// reader scrubs body (already decoded) as it streams, every DLP form of a
// key replaced (the raw key by RedactedSecret); an event stream event by
// event, guarded against a key spelled out across events.
func (k *keyScrubber) reader(body io.ReadCloser, contentType string) io.ReadCloser {
	if mt, _, _ := mime.ParseMediaType(contentType); mt == "text/event-stream" {
		// Event by event, each scrubbed whole and passed on at once: the
		// DLP's stream would hold an event's end back until the next one.
		return struct {
			io.Reader
			io.Closer
		}{&sseGuard{src: body, k: k, acc: map[string]string{}}, body}
	}
	vals := make([][]byte, len(k.keys))
	for i, key := range k.keys {
		vals[i] = []byte(key)
	}
	src := &replaceBody{src: body, vals: vals}
	pr, pw := io.Pipe()
	go func() {
		err := k.e.Scrub(pw, src, &k.pol, dlp.StreamOptions{ContentType: contentType, Where: "response"}, nil)
		pw.CloseWithError(err)
	}()
	return &pipeBody{PipeReader: pr, src: body}
}

// pipeBody is the scrubbed side of a response body; closing it stops the
// scrubber (its writes fail) and closes the source.
type pipeBody struct {
	*io.PipeReader
	src io.Closer
}

func (b *pipeBody) Close() error {
	b.PipeReader.Close()
	return b.src.Close()
}

// errKeyInStream refuses an event stream that spells a key out across
// events.
var errKeyInStream = errors.New("the provider's event stream spells out the real credential across its events: the response is cut off")

// sseGuard passes a text/event-stream through event by event, keeping per
// JSON path (Anthropic's delta.text, OpenAI's choices.0.delta.content, …;
// "" for data that is not JSON) the text the events add up to. An event
// that ends with the start of a key (past its public prefix) is held back
// until a later event shows it is not one; a key completed across events
// ends the stream with an error, the events holding its pieces unsent.
type sseGuard struct {
	src     io.Reader
	k       *keyScrubber
	in      []byte            // read, not yet a whole event
	held    []byte            // whole events held back
	out     []byte            // ready for the reader
	acc     map[string]string // path -> the text's tail
	pending bool
	err     error
}

const (
	sseMinHold = 8
)

func (g *sseGuard) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if g.err != nil {
			if g.err == io.EOF {
				// What is left is no whole event: hold nothing back that is
				// not a key.
				rest := append(g.held, g.in...)
				g.held, g.in = nil, nil
				if g.pending || g.k.holds(string(rest)) {
					return 0, errKeyInStream
				}
				if len(rest) > 0 {
					g.out = g.k.scrubText(rest)
					break
				}
			}
			return 0, g.err
		}
		buf := make([]byte, 32<<10)
		n, err := g.src.Read(buf)
		g.in = append(g.in, buf[:n]...)
		if err != nil {
			g.err = err
		}
		for {
			i, sep := bytes.Index(g.in, []byte("\n\n")), 2
			if j := bytes.Index(g.in, []byte("\r\n\r\n")); j >= 0 && (i < 0 || j < i) {
				i, sep = j, 4
			}
			if i < 0 && len(g.in) > mitm.MaxHeldEvent {
				i, sep = len(g.in), 0 // no event is this long: take what is there as one
			}
			if i < 0 {
				break
			}
			ev := g.in[:i+sep]
			g.in = g.in[i+sep:]
			if err := g.event(ev); err != nil {
				g.err, g.held, g.in = err, nil, nil
				return 0, err
			}
		}
	}
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

// event takes one whole event.
func (g *sseGuard) event(ev []byte) error {
	var data []string
	for _, line := range strings.Split(strings.ReplaceAll(string(ev), "\r\n", "\n"), "\n") {
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			data = append(data, strings.TrimPrefix(v, " "))
		}
	}
	parts := map[string]string{}
	d := strings.Join(data, "\n")
	var v any
	if json.Unmarshal([]byte(d), &v) == nil {
		flattenJSON("", v, parts)
	} else {
		parts[""] = d
	}
	g.pending = false
	for path, text := range parts {
		acc := g.acc[path] + text
		if g.k.holds(acc) {
			return errKeyInStream
		}
		if g.k.startsKey(acc) {
			g.pending = true
		}
		if max := 4 * g.k.longest(); len(acc) > max {
			acc = acc[len(acc)-max:]
		}
		g.acc[path] = acc
	}
	g.held = append(g.held, g.k.scrubText(ev)...)
	if !g.pending {
		g.out = append(g.out, g.held...)
		g.held = nil
	}
	return nil
}

// flattenJSON collects v's strings by path.
func flattenJSON(path string, v any, out map[string]string) {
	switch x := v.(type) {
	case string:
		out[path] += x
	case map[string]any:
		for k, c := range x {
			flattenJSON(path+"."+k, c, out)
		}
	case []any:
		for i, c := range x {
			flattenJSON(fmt.Sprintf("%s.%d", path, i), c, out)
		}
	}
}

// scrubText replaces each raw key by RedactedSecret and every other DLP
// form of one by the DLP's placeholder.
func (k *keyScrubber) scrubText(b []byte) []byte {
	for _, key := range k.keys {
		b = bytes.ReplaceAll(b, []byte(key), []byte(RedactedSecret))
	}
	return k.e.ScrubText(&k.pol, b, "response", nil)
}

// holds reports whether s holds a key in any DLP form.
func (k *keyScrubber) holds(s string) bool {
	return k.e.ContainsKnownFold(s) || string(k.e.ScrubText(&k.pol, []byte(s), "", nil)) != s
}

// startsKey reports whether s ends with the start of a key: its public
// prefix and 4 more characters, sseMinHold at least.
func (k *keyScrubber) startsKey(s string) bool {
	for j, key := range k.keys {
		hold := max(sseMinHold, k.public[j]+4)
		for i := max(0, len(s)-len(key)+1); i+hold <= len(s); i++ {
			if strings.HasPrefix(key, s[i:]) {
				return true
			}
		}
	}
	return false
}

func (k *keyScrubber) longest() int {
	n := 0
	for _, key := range k.keys {
		n = max(n, len(key))
	}
	return n
}

// decodeBody undoes a response's content codings (outermost last in ce).
func decodeBody(ce string, body io.ReadCloser) (io.ReadCloser, error) {
	var codings []string
	for _, c := range strings.Split(ce, ",") {
		if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
			codings = append(codings, c)
		}
	}
	if len(codings) > 4 {
		return nil, errors.New("too many stacked codings")
	}
	var r io.Reader = body
	for i := len(codings) - 1; i >= 0; i-- {
		var err error
		switch codings[i] {
		case "gzip", "x-gzip":
			r, err = gzip.NewReader(r)
		case "deflate":
			br := bufio.NewReader(r)
			h, perr := br.Peek(2)
			if perr == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
				r, err = zlib.NewReader(br)
			} else {
				r = flate.NewReader(br)
			}
		case "br":
			r = brotli.NewReader(r)
		case "zstd":
			var d *zstd.Decoder
			d, err = zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(256<<20))
			if err == nil {
				r = d.IOReadCloser()
			}
		default:
			return nil, fmt.Errorf("unsupported coding %q", egress.Shorten(codings[i]))
		}
		if err != nil {
			return nil, err
		}
	}
	return struct {
		io.Reader
		io.Closer
	}{r, body}, nil
}

var _ mitm.ResponseHeaderScrubber = (*swapFilter)(nil)

var _ mitm.UpstreamMessageScrubber = (*swapFilter)(nil)

// ScrubUpstreamMessage returns p with the real keys, in every DLP form,
// replaced: what UpstreamFrames does to each frame's payload.
func (f *swapFilter) ScrubUpstreamMessage(p []byte) []byte {
	sc := f.scrubber()
	if sc == nil {
		return p
	}
	return sc.e.ScrubText(&sc.pol, p, "response", nil)
}

// UpstreamFrames returns the reader the guest gets upstream's WebSocket
// frames through: each frame's payload (text, binary, ping, pong, close)
// has the real keys, in every DLP form, replaced.
func (f *swapFilter) UpstreamFrames(src io.Reader) io.Reader {
	sc := f.scrubber()
	if sc == nil {
		return src
	}
	return &frameReader{src: src, s: newWSScrubberTo(sc.e, &sc.pol)}
}

// frameReader pushes what it reads through a wsScrubber.
type frameReader struct {
	src io.Reader
	s   *wsScrubber
	out []byte
	err error
}

func (r *frameReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		buf := make([]byte, 32<<10)
		n, err := r.src.Read(buf)
		if n > 0 {
			if _, werr := r.s.Write(buf[:n]); werr != nil {
				r.err = werr
			}
		}
		if err != nil && r.err == nil {
			r.s.Close()
			r.err = err
		}
		r.out = append(r.out, r.s.take()...)
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}
