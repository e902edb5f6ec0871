package netfilter

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// upstreamKind names how a request leaves, for messages.
func upstreamKind(d mitm.Destination) string {
	switch {
	case d.Scheme == "https" && !d.Verified:
		return "unverified TLS"
	case d.Scheme == "https":
		return "verified TLS"
	}
	return "plain HTTP"
}

// ErrPlaceholder means a request carried a credential placeholder where it
// is not swapped.
var ErrPlaceholder = errors.New("a credential placeholder where vibedom does not put the key")

// ErrLoginPath means a request carried a subscription login's access
// placeholder to its API host on a path the pinned CLI does not send its
// token to (credentials.Swap.Paths): the user's token is not the guest's
// for the rest of the account (chat history, minting an API key).
var ErrLoginPath = errors.New("a subscription login's placeholder on a path the CLI does not use with a subscription login")

// NewSwapFilter wraps inner (the DLP) with credential swaps. A swap happens
// only when a request to the swap's host on port 443, going upstream over
// TLS the engine verifies (Destination.SwapAllowed), has the swap's header,
// once, with exactly the placeholder value: that header is kept out of
// inner's sight and set to the real value after inner ran, so the DLP,
// which knows the real value, never scrubs it there. A placeholder in any
// other header (of any request) or in the URL refuses the request, and so
// does one on a path the swap does not name (Swap.Paths, for logins); in
// a body the DLP finds it (give it the placeholders as known values). A
// placeholder in a trailer (name or value) is never swapped: it refuses
// the request as well, or, when the trailer arrives after the head has
// gone, fails the body so the request is aborted and the trailer unsent.
func NewSwapFilter(inner mitm.RequestFilter, swaps []credentials.Swap) mitm.RequestFilter {
	if inner == nil {
		inner = mitm.IdentityFilter{}
	}
	f := &swapFilter{inner: inner, swaps: swaps, initial: map[string]bool{}}
	for _, s := range swaps {
		if s.Dynamic != nil {
			for _, v := range s.Dynamic.Secrets() {
				f.initial[v] = true
			}
		}
	}
	return f
}

type swapFilter struct {
	inner mitm.RequestFilter
	swaps []credentials.Swap
	// scrub finds the real keys in the DLP's encodings (nil when there is
	// no key), built for the secrets counted in scrubFor; see scrubber.
	mu       sync.Mutex
	scrub    *keyScrubber
	scrubFor int
	// initial are the dynamic credentials' real values when the filter
	// was built, the ones inner (the DLP) knows; learn finds the others
	// (tokens the host refreshed since) in requests, built for the
	// learnFor values it holds.
	initial  map[string]bool
	learn    *keyScrubber
	learnFor int
}

// learned is a scrubber of the real values inner does not know (tokens
// the host refreshed during the session), nil when there is none.
func (f *swapFilter) learned() *keyScrubber {
	var vals []swapSecret
	for _, s := range f.secrets() {
		if !f.initial[s.value] {
			vals = append(vals, s)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.learnFor != len(vals) {
		f.learn, f.learnFor = newKeyScrubber(vals), len(vals)
	}
	return f.learn
}

// ErrRefreshedToken means a request carried a real token the host
// refreshed during the session: the guest never gets one, so it leaks.
var ErrRefreshedToken = errors.New("a real credential the host holds, outside the swap")

// scrubber is the key scrubber for the real values as they stand (a
// refreshed token adds one), nil when there is none.
func (f *swapFilter) scrubber() *keyScrubber {
	secrets := f.secrets()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.scrubFor != len(secrets) || (f.scrub == nil && len(secrets) > 0) {
		f.scrub, f.scrubFor = newKeyScrubber(secrets), len(secrets)
	}
	return f.scrub
}

// swapSecret is one real value a response must not carry.
type swapSecret struct {
	name, value, token string
}

// secrets are the real values of every swap, static and dynamic, each
// long enough to mean something.
func (f *swapFilter) secrets() []swapSecret {
	var out []swapSecret
	for _, s := range f.swaps {
		if s.Dynamic != nil {
			phs := s.Dynamic.Placeholders()
			tok := ""
			if len(phs) > 0 {
				tok = phs[0]
			}
			for _, v := range s.Dynamic.Secrets() {
				if len(v) >= 8 {
					out = append(out, swapSecret{s.Name, v, tok})
				}
			}
			continue
		}
		key := s.Value
		if i := strings.LastIndexByte(key, ' '); i >= 0 {
			key = key[i+1:] // "Bearer <key>": the key
		}
		if len(key) >= 8 {
			out = append(out, swapSecret{s.Name, key, s.Token})
		}
	}
	return out
}

// current is the swaps as they stand: each dynamic credential expanded to
// one swap per placeholder (refresh placeholders with no header, so they
// are only refused).
func (f *swapFilter) current() []credentials.Swap {
	var out []credentials.Swap
	for _, s := range f.swaps {
		if s.Dynamic == nil {
			out = append(out, s)
			continue
		}
		for _, ph := range s.Dynamic.Placeholders() {
			d := credentials.Swap{Name: s.Name, Host: s.Host, Token: ph, Paths: s.Paths, Dynamic: s.Dynamic}
			if s.Dynamic.IsAccessPlaceholder(ph) {
				d.Header, d.Placeholder = s.Header, "Bearer "+ph
			}
			out = append(out, d)
		}
	}
	return out
}

func (f *swapFilter) FilterRequest(ctx context.Context, dest mitm.Destination, r *http.Request) (func() []egress.Finding, error) {
	for _, s := range f.swaps {
		if ea, ok := s.Dynamic.(credentials.EndpointAnswerer); ok && strings.EqualFold(dest.Name, ea.AnswersHost()) {
			return nil, ea.Answer(r)
		}
	}
	var do *credentials.Swap
	swaps := f.current()
	for name, vals := range r.Header {
		for _, v := range vals {
			for i := range swaps {
				s := &swaps[i]
				if !strings.Contains(v, s.Token) {
					continue
				}
				if do == nil && s.Header != "" && dest.Port == 443 && strings.EqualFold(dest.Name, s.Host) && strings.EqualFold(name, s.Header) &&
					len(vals) == 1 && v == s.Placeholder {
					if !dest.SwapAllowed() {
						return nil, fmt.Errorf("%w (%s's, to %s:%d over %s: the key goes only over TLS verified for the provider)",
							ErrPlaceholder, s.Name, dest.Name, dest.Port, upstreamKind(dest))
					}
					do = s
					continue
				}
				return nil, fmt.Errorf("%w (%s's, in header %s, to %s:%d)", ErrPlaceholder, s.Name, strings.ToLower(name), dest.Name, dest.Port)
			}
		}
	}
	for _, u := range []string{r.URL.String(), r.URL.RawQuery, r.URL.Path, r.Host} {
		dec, _ := url.QueryUnescape(u)
		for _, s := range swaps {
			if strings.Contains(u, s.Token) || strings.Contains(dec, s.Token) {
				return nil, fmt.Errorf("%w (%s's, in the URL, to %s:%d)", ErrPlaceholder, s.Name, dest.Name, dest.Port)
			}
		}
	}
	var late *eofCheck
	var recv, own http.Header
	lk := f.learned()
	if tr := r.Trailer; tr != nil {
		// Values known now (the mitmproxy engine) are checked now; the Go
		// engine fills them once the body has ended.
		if err := trailerPlaceholder(tr, swaps, lk, dest); err != nil {
			return nil, err
		}
		if r.Body != nil && r.Body != http.NoBody {
			late = &eofCheck{ReadCloser: r.Body, check: func() error { return trailerPlaceholder(tr, swaps, lk, dest) }}
			r.Body = late
			// The body may be read ahead (learned, below): inner gets a
			// map of its own, filled once it reads the body's end.
			recv, own = tr, make(http.Header, len(tr))
			for k := range tr {
				own[k] = nil
			}
			r.Trailer = own
		}
	}
	if do != nil && !do.PathAllowed(r.URL) {
		return nil, fmt.Errorf("%w (%s's, %s %s to %s:%d: the paths it uses are %s)", ErrLoginPath, do.Name,
			egress.Shorten(r.Method), egress.Shorten(r.URL.EscapedPath()), dest.Name, dest.Port, strings.Join(do.Paths, " "))
	}
	if lk != nil {
		// The DLP's known values were fixed when the session began.
		for name, vals := range r.Header {
			for _, v := range vals {
				if lk.holds(name) {
					// Not named: the log redactor would miss it lower-cased.
					return nil, fmt.Errorf("%w (in a header's name, to %s:%d)", ErrRefreshedToken, dest.Name, dest.Port)
				}
				if lk.holds(v) {
					return nil, fmt.Errorf("%w (in header %s, to %s:%d)", ErrRefreshedToken, strings.ToLower(name), dest.Name, dest.Port)
				}
			}
		}
		u := r.URL.String()
		if dec, _ := url.QueryUnescape(u); lk.holds(u) || lk.holds(dec) || lk.holds(r.Host) {
			return nil, fmt.Errorf("%w (in the URL, to %s:%d)", ErrRefreshedToken, dest.Name, dest.Port)
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = lk.reader(r.Body, r.Header.Get("Content-Type"))
			r.ContentLength = -1
			r.Header.Del("Content-Length")
			r.GetBody = nil
		}
	}
	if own != nil {
		r.Body = &onEOF{ReadCloser: r.Body, f: func() { maps.Copy(own, recv) }}
	}
	value := ""
	if do != nil {
		value = do.Value
		if do.Dynamic != nil {
			tok, err := do.Dynamic.AccessToken(ctx)
			if err != nil {
				return nil, err
			}
			value = "Bearer " + tok
		}
		r.Header.Del(do.Header)
	}
	done, err := f.inner.FilterRequest(ctx, dest, r)
	if err != nil {
		return nil, err
	}
	if do != nil {
		r.Header.Set(do.Header, value)
	}
	if late != nil {
		// A request aborted for its trailer is an alert, as a refusal is.
		inner := done
		done = func() []egress.Finding {
			var fs []egress.Finding
			if inner != nil {
				fs = inner()
			}
			if late.failed.Load() {
				fs = append(slices.Clip(fs), egress.Finding{Category: "PLACEHOLDER", Where: "trailer", Action: "refuse"})
			}
			return fs
		}
	}
	return done, nil
}

// trailerPlaceholder reports a placeholder, or a real token the host
// refreshed (lk, when not nil), in a trailer's name or value.
func trailerPlaceholder(tr http.Header, swaps []credentials.Swap, lk *keyScrubber, dest mitm.Destination) error {
	for name, vals := range tr {
		if lk != nil {
			if lk.holds(name) {
				return fmt.Errorf("%w (in a trailer's name, to %s:%d)", ErrRefreshedToken, dest.Name, dest.Port)
			}
			for _, v := range vals {
				if lk.holds(v) {
					return fmt.Errorf("%w (in trailer %s, to %s:%d)", ErrRefreshedToken, strings.ToLower(name), dest.Name, dest.Port)
				}
			}
		}
		for _, s := range swaps {
			if strings.Contains(strings.ToLower(name), strings.ToLower(s.Token)) { // HTTP/2 lowers names
				// Not named: it holds the placeholder.
				return fmt.Errorf("%w (%s's, in a trailer's name, to %s:%d)", ErrPlaceholder, s.Name, dest.Name, dest.Port)
			}
			for _, v := range vals {
				if strings.Contains(v, s.Token) {
					return fmt.Errorf("%w (%s's, in trailer %s, to %s:%d)", ErrPlaceholder, s.Name, strings.ToLower(name), dest.Name, dest.Port)
				}
			}
		}
	}
	return nil
}

// eofCheck is a body that, once it has ended, returns check's error, if
// any, in place of the end (and then failed is true).
type eofCheck struct {
	io.ReadCloser
	check  func() error
	failed atomic.Bool
}

func (b *eofCheck) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		if cerr := b.check(); cerr != nil {
			b.failed.Store(true)
			return n, cerr
		}
	}
	return n, err
}

// UpgradeWriter passes the inner filter's WebSocket scrubbing through,
// the guest's frames first scrubbed of the tokens inner does not know
// (see learned).
func (f *swapFilter) UpgradeWriter(r *http.Request, upstream io.Writer) io.WriteCloser {
	var w io.WriteCloser
	if uf, ok := f.inner.(mitm.UpgradeFilter); ok {
		w = uf.UpgradeWriter(r, upstream)
	}
	lk := f.learned()
	switch {
	case lk == nil:
		return w
	case w == nil:
		return newWSScrubber(upstream, lk.e, &lk.pol, nil)
	}
	return closeBoth{newWSScrubber(w, lk.e, &lk.pol, nil), w}
}

// closeBoth is a writer chained onto next: closing it closes both, in order.
type closeBoth struct {
	io.WriteCloser
	next io.Closer
}

func (c closeBoth) Close() error { return errors.Join(c.WriteCloser.Close(), c.next.Close()) }

// FilterResponse scrubs the real values from every response (a provider
// echoing a key back, or anything else) before the guest reads it:
// header names (such a header is dropped) and values, trailers (when the
// body ends), and the body as it streams, each literal key replaced by
// RedactedSecret. A response from a swap's host, the one place the key
// goes, is scrubbed further: its body is decoded (Content-Encoding gzip,
// deflate, br, zstd; the guest gets it identity-encoded) and the key is
// looked for in every form the DLP knows (base64, hex, percent and \u
// escapes, JSON escapes...), and an event stream is refused mid-way when
// the key is spelled out across its events (see sseGuard).
func (f *swapFilter) FilterResponse(resp *http.Response) {
	if rf, ok := f.inner.(mitm.ResponseFilter); ok {
		rf.FilterResponse(resp)
	}
	vals, _ := f.ResponseSecrets()
	if len(vals) == 0 {
		return
	}
	f.ScrubResponseHeader(resp.Header)
	f.ScrubResponseHeader(resp.Trailer)
	if resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	var body io.ReadCloser = resp.Body
	if sc := f.scrubber(); sc != nil && f.fromProvider(resp) {
		if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
			body = &lazyDecode{ce: ce, src: body}
			resp.Header.Del("Content-Encoding")
		}
		body = sc.reader(body, resp.Header.Get("Content-Type"))
	} else {
		body = &replaceBody{src: body, vals: vals}
	}
	resp.Body = &trailerBody{ReadCloser: body, resp: resp, f: f}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
}

// ScrubResponseHeader scrubs one header block of a response (final, 1xx,
// 101, trailers) in place: a header whose name holds a real key, in any
// case, is dropped; values have the key, in every form the DLP knows,
// replaced.
func (f *swapFilter) ScrubResponseHeader(h http.Header) {
	vals, _ := f.ResponseSecrets()
	sc := f.scrubber()
	for name, vs := range h {
		if f.holdsKey(name) {
			delete(h, name)
			continue
		}
		for i, v := range vs {
			for _, k := range vals {
				v = strings.ReplaceAll(v, string(k), RedactedSecret)
			}
			if sc != nil {
				v = string(sc.e.ScrubText(&sc.pol, []byte(v), "response-header", nil))
			}
			vs[i] = v
		}
	}
}

// holdsKey reports whether s holds a real key, in any case or DLP form.
func (f *swapFilter) holdsKey(s string) bool {
	if sc := f.scrubber(); sc != nil {
		return sc.e.ContainsKnownFold(s) || string(sc.e.ScrubText(&sc.pol, []byte(s), "", nil)) != s
	}
	vals, _ := f.ResponseSecrets()
	for _, k := range vals {
		if strings.Contains(strings.ToLower(s), strings.ToLower(string(k))) {
			return true
		}
	}
	return false
}

var _ mitm.ResponseBodyScope = (*swapFilter)(nil)

// RewritesBody implements mitm.ResponseBodyScope: the swap filter rewrites
// the body of a response from a swap's host (where the real key went).
func (f *swapFilter) RewritesBody(resp *http.Response) bool { return f.fromProvider(resp) }

// fromProvider reports whether resp answers a request to a swap's host.
func (f *swapFilter) fromProvider(resp *http.Response) bool {
	if resp.Request == nil || resp.Request.URL == nil {
		return true // unknown: scrub as if it were
	}
	host := resp.Request.URL.Hostname()
	for _, s := range f.swaps {
		if strings.EqualFold(host, s.Host) {
			return true
		}
	}
	return false
}

// trailerBody scrubs the response's trailers once its body has ended
// (they arrive after it, and the proxy copies them after the last read).
type trailerBody struct {
	io.ReadCloser
	resp *http.Response
	f    *swapFilter
	done bool
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.f.ScrubResponseHeader(b.resp.Trailer)
	}
	return n, err
}

// lazyDecode undoes a body's content codings from its first read on: a
// decoder reads the coding's header when made, which must not wait here
// (the mitmproxy engine feeds the body only once the headers are sent).
type lazyDecode struct {
	ce  string
	src io.ReadCloser
	r   io.Reader
	err error
}

func (b *lazyDecode) Read(p []byte) (int, error) {
	if b.r == nil && b.err == nil {
		dec, err := decodeBody(b.ce, b.src)
		if err != nil {
			b.err = fmt.Errorf("a provider's response in Content-Encoding %q cannot be scanned for the credential: %w", egress.Shorten(b.ce), err)
		}
		b.r = dec
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.r.Read(p)
}

func (b *lazyDecode) Close() error { return b.src.Close() }

// errBody fails its first read: a body that must not reach the guest.
type errBody struct {
	src io.ReadCloser
	err error
}

func (b errBody) Read([]byte) (int, error) { return 0, b.err }
func (b errBody) Close() error             { return b.src.Close() }

// ResponseSecrets are the real values FilterResponse replaces: each
// swap's key (without a "Bearer " prefix), when it is long enough to mean
// something.
func (f *swapFilter) ResponseSecrets() (vals [][]byte, with []byte) {
	for _, s := range f.secrets() {
		vals = append(vals, []byte(s.value))
	}
	return vals, []byte(RedactedSecret)
}

// RedactedSecret replaces a real credential in a response.
const RedactedSecret = "[REDACTED:vibedom credential]"

// replaceBody replaces vals in a stream, holding back len(longest)-1 bytes
// so a value split across reads is still found.
type replaceBody struct {
	src  io.ReadCloser
	vals [][]byte
	buf  []byte // read, not yet emitted
	out  []byte // ready to emit
	eof  bool
}

func (r *replaceBody) Read(p []byte) (int, error) {
	hold := 0
	for _, v := range r.vals {
		if len(v)-1 > hold {
			hold = len(v) - 1
		}
	}
	for len(r.out) == 0 {
		if r.eof {
			if len(r.buf) == 0 {
				return 0, io.EOF
			}
			r.out, r.buf = r.replace(r.buf), nil
			break
		}
		chunk := make([]byte, 32<<10)
		n, err := r.src.Read(chunk)
		r.buf = append(r.buf, chunk[:n]...)
		if err == io.EOF {
			r.eof = true
		} else if err != nil {
			return 0, err
		}
		r.buf = r.replace(r.buf)
		if len(r.buf) > hold {
			cut := len(r.buf) - hold
			// Never cut inside a replacement just made.
			r.out = append(r.out, r.buf[:cut]...)
			r.buf = append([]byte(nil), r.buf[cut:]...)
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *replaceBody) replace(b []byte) []byte {
	for _, v := range r.vals {
		b = bytes.ReplaceAll(b, v, []byte(RedactedSecret))
	}
	return b
}

func (r *replaceBody) Close() error { return r.src.Close() }
