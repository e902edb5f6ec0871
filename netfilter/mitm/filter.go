package mitm

import (
	"github.com/vibedom/vibedom/netfilter/egress"

	"context"
	"io"
	"net/http"
	"strings"
)

// Destination describes where a request is going, for request filters.
type Destination struct {
	Name string
	Port uint16
	// Scheme is how the request leaves the host: "https" when the engine
	// sends it upstream over TLS, "http" in the clear. Empty means the
	// engine did not say, and counts as "http".
	Scheme string
	// Verified is true only when Scheme is "https" and the engine verifies
	// the upstream's certificate chain and name (Name) against the trusted
	// roots, never skipping the check. A credential is swapped in only
	// when it is true (see NewSwapFilter): an engine that leaves it false
	// gets no swap, and the placeholder is refused like anywhere else.
	//
	// The Go engine sets it for every https request (its transport always
	// verifies). The mitmproxy engine sets it from the decision socket's
	// request question: "scheme" is "https" only after the guest's TLS
	// handshake was checked ("sni"), and mitmdump runs with
	// ssl_insecure=false, so its upstream TLS is verified. No new field in
	// that protocol: the addon's "scheme" carries it.
	Verified bool
}

// SwapAllowed reports whether d is a destination a credential may be put in
// for: TLS to the upstream, verified.
func (d Destination) SwapAllowed() bool { return d.Scheme == "https" && d.Verified }

// RequestFilter rewrites an outgoing request before the proxy sends it
// upstream. It may replace r.Body with a streaming reader (it must not read
// the whole body into memory), rewrite r.URL and headers, and must then fix
// r.ContentLength (-1 when unknown). done is called once the body has been
// fully sent (or the request abandoned) and returns what was changed. An
// error refuses the request (403), except a *credentials.Answer, which the
// engine sends the guest in place of the request (nothing is forwarded).
type RequestFilter interface {
	FilterRequest(ctx context.Context, dest Destination, r *http.Request) (done func() []egress.Finding, err error)
}

// UpgradeFilter is an optional capability of a RequestFilter: scrubbing
// what the guest sends after the upstream agreed to switch protocols (a
// WebSocket). For a request the filter was given, UpgradeWriter returns the
// writer the guest's bytes go through on their way to upstream (nil: they
// pass as they are); the engine closes it when the guest's side ends.
// Findings go into the request's done.
type UpgradeFilter interface {
	UpgradeWriter(r *http.Request, upstream io.Writer) io.WriteCloser
}

// ResponseFilter is an optional capability of a RequestFilter: rewriting
// what upstream answers before the guest reads it (headers, and the body
// as it streams). WebSocket upgrades do not pass through it.
type ResponseFilter interface {
	FilterResponse(resp *http.Response)
}

// ResponseBodyScope is an optional capability of a ResponseFilter, for an
// engine that must decide before a response's body flows whether to stream
// it through FilterResponse (the mitmproxy engine): RewritesBody reports
// whether FilterResponse may change resp's body. When it reports false,
// the engine scrubs only the header block (ResponseHeaderScrubber). A
// ResponseFilter without it has every body streamed through.
type ResponseBodyScope interface {
	RewritesBody(resp *http.Response) bool
}

// MaxHeldEvent is the longest server-sent event a ResponseFilter holds
// back whole while it scrubs an event stream (a longer one ends the
// response); an engine charges twice that to its memory budget for each
// response it streams through the filter.
const MaxHeldEvent = 1 << 20

// ResponseSecrets is an optional capability of a ResponseFilter, for an
// engine that does not hold the response stream itself (the mitmproxy
// engine): the literal values FilterResponse replaces, and what replaces
// them, for the engine to apply the same replacement where the stream is.
type ResponseSecrets interface {
	ResponseSecrets() (vals [][]byte, with []byte)
}

// IdentityFilter is the RequestFilter that changes nothing.
type IdentityFilter struct{}

// FilterRequest implements RequestFilter.
func (IdentityFilter) FilterRequest(context.Context, Destination, *http.Request) (func() []egress.Finding, error) {
	return func() []egress.Finding { return nil }, nil
}

// ResponseHeaderScrubber is an optional capability of a RequestFilter:
// scrubbing a response header block in place, for the blocks that do not
// pass through FilterResponse (1xx, a 101's headers).
type ResponseHeaderScrubber interface {
	ScrubResponseHeader(h http.Header)
}

// UpstreamMessageScrubber is an optional capability of a RequestFilter:
// scrubbing one whole WebSocket message from upstream, for an engine that
// handles messages rather than frames (the mitmproxy engine).
type UpstreamMessageScrubber interface {
	ScrubUpstreamMessage(p []byte) []byte
}

// UpstreamFrameFilter is an optional capability of a RequestFilter:
// scrubbing the frames upstream sends the guest after a WebSocket upgrade.
type UpstreamFrameFilter interface {
	UpstreamFrames(src io.Reader) io.Reader
}

// ScrubDescription is the reason a scrubbed request's event carries.
func ScrubDescription(fs []egress.Finding) string {
	cats := map[string]bool{}
	var names []string
	for _, f := range fs {
		if (f.Action == "redact" || f.Action == "") && !cats[f.Category] {
			cats[f.Category] = true
			names = append(names, f.Category)
		}
	}
	return strings.Join(names, ", ")
}
