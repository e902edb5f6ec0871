package netfilter

import (
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
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/vibedom/vibedom/dlp"
)

// AuditSink receives the original values of what a DLPFilter found, for
// the encrypted audit log. *dlp.AuditLog is one.
type AuditSink interface {
	Record(recs ...dlp.AuditRecord) error
}

// DLPFilter is the RequestFilter that scrubs every outgoing request with a
// dlp.Engine under the policy of the destination's class: the URL path
// and query, header values, and the body (decoded from its
// Content-Encoding and walked as JSON, form, multipart or text, then
// encoded again).
//
// Credential headers (Authorization, Proxy-Authorization, Cookie,
// X-Api-Key …) are how the agent signs in: they are searched for known
// values and for secrets found by their shape, not for personal data nor
// by the words before a value (see credentialPolicy), and to an external
// destination (the agent's AI API, the only reader of its own
// credential) known values there are logged, not redacted. Headers that
// frame the message (Content-Type, Accept-Encoding, Sec-WebSocket-Protocol
// …) are scanned but never rewritten (a changed multipart boundary breaks
// the body): a value there the DLP would redact refuses the request (a
// *DLPRefusal), the error naming the header and the category; the
// few whose values the engines write or check themselves (fixedHeaders)
// are not scanned.
//
// A header whose name holds a finding is dropped; request trailers are
// scrubbed as headers are (their names before the body, their values once
// it has ended, before the engine sends them), and the Trailer header is
// rewritten to name only those kept; a method that holds a finding is
// refused.
//
// A body whose length is known and at most BufferLimit is scrubbed whole
// so upstream still gets a Content-Length; a longer one is streamed
// (chunked). A body that cannot be decoded is not sent: the request is
// refused, or aborted mid-stream.
type DLPFilter struct {
	Engine *dlp.Engine
	// Audit receives each request's findings with their values; nil
	// keeps only what the network log records (category, prefix, length).
	Audit AuditSink
	// BufferLimit is the largest body scrubbed whole (4 MiB when 0).
	BufferLimit int64
	// OnAuditError is told when the audit log cannot be written; nil
	// ignores it.
	OnAuditError func(error)

	upgrades sync.Map // *http.Request -> *upgradeState, while it runs
}

type upgradeState struct {
	pol dlp.Policy
	rep *dlp.Report
}

var _ mitm.UpgradeFilter = (*DLPFilter)(nil)

// UpgradeWriter implements UpgradeFilter: the guest's WebSocket frames are
// scrubbed message by message (see wsScrubber).
func (f *DLPFilter) UpgradeWriter(r *http.Request, upstream io.Writer) io.WriteCloser {
	v, ok := f.upgrades.Load(r)
	if !ok {
		return nil
	}
	st := v.(*upgradeState)
	return newWSScrubber(upstream, f.Engine, &st.pol, st.rep)
}

var _ mitm.RequestFilter = (*DLPFilter)(nil)

// framingHeaders are never changed: they describe the message itself.
// Their values are scanned (framing) unless in fixedHeaders.
var framingHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Content-Encoding": true,
	"Transfer-Encoding": true, "Connection": true, "Keep-Alive": true, "Upgrade": true, "Te": true,
	"Trailer": true, "Expect": true, "Sec-Websocket-Key": true, "Sec-Websocket-Version": true,
	"Sec-Websocket-Extensions": true, "Sec-Websocket-Protocol": true, "Accept-Encoding": true,
}

// fixedHeaders are the framing headers that carry no text of the guest's
// upstream on either engine, so they are not scanned: Host must name the
// admitted destination (mitm.AuthorityMismatch) and is written by the
// engine; Content-Length and Transfer-Encoding are checked by the guest
// side's HTTP parser (digits; chunked only) and never passed on as sent
// (Go's transport writes its own, the mitmproxy engine drops both and sets
// the length); Trailer is rewritten from the scrubbed trailer names.
var fixedHeaders = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// credentialHeaders carry the agent's own credentials.
var credentialHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "X-Api-Key": true, "Api-Key": true,
	"X-Auth-Token": true, "X-Goog-Api-Key": true, "X-Amz-Security-Token": true, "Private-Token": true,
	"X-Gitlab-Token": true, "X-Github-Token": true,
}

// credentialCategories are what a credential header is scrubbed of: known
// values and secrets found by their shape, each as pol says for the
// destination. Personal data there (an address in a session cookie)
// passes.
var credentialCategories = []dlp.Category{
	dlp.CatSecret, dlp.CatPrivateKey, dlp.CatCloudKey, dlp.CatToken, dlp.CatJWT, dlp.CatCredentials,
}

// credentialPolicy is pol for credential headers. The guest signs in with
// them, so what it is meant to send there passes: the session's
// placeholder never reaches the DLP (the swap filter takes its header out
// and puts the real key back after, and refuses a placeholder anywhere
// else), a token a server issued (a session cookie, a bearer token) is
// not found by the words before it (dlp.Policy.ShapesOnly), and to an
// external destination (the agent's AI API, the only reader of its own
// credential) a known value is logged, not redacted. A secret found by
// its shape (an AWS key id, a GitHub token, a JWT, a private key …) or a
// known value is scrubbed as pol says, as in any other header: redacted
// to external and public destinations, passed or logged to internal
// ones.
func credentialPolicy(pol dlp.Policy) dlp.Policy {
	cp := pol.ShapesOnly()
	for _, c := range dlp.Categories() {
		if !slices.Contains(credentialCategories, c) {
			cp = cp.With(c, dlp.Pass)
		}
	}
	if pol.Class == dlp.ClassExternal && cp.Action(dlp.CatSecret) == dlp.Redact {
		cp = cp.With(dlp.CatSecret, dlp.Log)
	}
	return cp
}

// FilterRequest implements RequestFilter.
func (f *DLPFilter) FilterRequest(ctx context.Context, dest mitm.Destination, r *http.Request) (func() []egress.Finding, error) {
	e := f.Engine
	pol := e.PolicyFor(dest.Name)
	rep := &dlp.Report{}
	start := time.Now()

	// URL.
	if p := e.ScrubPath(&pol, r.URL.EscapedPath(), rep); p != r.URL.EscapedPath() {
		if up, err := url.PathUnescape(p); err == nil {
			r.URL.Path, r.URL.RawPath = up, p
		}
	}
	if r.URL.RawQuery != "" {
		r.URL.RawQuery = e.ScrubQuery(&pol, r.URL.RawQuery, rep)
	}

	// Headers.
	credPol := credentialPolicy(pol)
	// A refusal: the values to the audit log, the refused place's findings
	// as what became of them.
	refuse := func(where string, err error) error {
		return &DLPRefusal{Where: where, Findings: f.report(dest, r, start, rep, where), err: err}
	}
	if m := e.ScrubText(&pol, []byte(r.Method), "method", rep); string(m) != r.Method {
		return nil, refuse("method", errors.New("the request method carries a value the DLP redacts"))
	}
	hs := headerScrub{e: e, pol: &pol, credPol: &credPol, rep: rep}
	if name, err := hs.framing(r.Header); err != nil {
		return nil, refuse("header:"+name, err)
	}
	hs.header(r.Header, "header")
	// Trailers: the declared names now (the Trailer header lists them
	// before the body), the values once the body has ended, as headers.
	// The engine fills recv as the guest's body ends, which may be while
	// the transport still writes the head (the body below is read ahead):
	// the transport gets a map of its own, send, filled only once it has
	// read the end of the scrubbed body.
	recv := r.Trailer
	if recv != nil {
		hs.header(recv, "trailer")
		r.Trailer = make(http.Header, len(recv))
		for k := range recv {
			r.Trailer[k] = nil
		}
	}
	if _, ok := r.Header["Trailer"]; ok || len(r.Trailer) > 0 {
		r.Header.Del("Trailer")
		if len(r.Trailer) > 0 {
			r.Header.Set("Trailer", strings.Join(slices.Sorted(maps.Keys(r.Trailer)), ", "))
		}
	}
	if recv != nil {
		if r.Body == nil || r.Body == http.NoBody {
			hs.header(recv, "trailer")
			maps.Copy(r.Trailer, recv)
			recv = nil
		} else {
			r.Body = &onEOF{ReadCloser: r.Body, f: func() { hs.header(recv, "trailer") }}
		}
	}

	// A WebSocket: no extension may compress frames the scrubber must
	// read; what the guest sends after the upgrade goes through
	// UpgradeWriter with this request's report.
	if mitm.IsWebSocketUpgrade(r) {
		r.Header.Del("Sec-Websocket-Extensions")
		f.upgrades.Store(r, &upgradeState{pol: pol, rep: rep})
	}

	// Body.
	var wait func()
	if r.Body != nil && r.Body != http.NoBody {
		opts := dlp.StreamOptions{ContentType: r.Header.Get("Content-Type"), ContentEncoding: r.Header.Get("Content-Encoding")}
		limit := f.BufferLimit
		if limit <= 0 {
			limit = 4 << 20
		}
		if r.ContentLength >= 0 && r.ContentLength <= limit {
			body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
			r.Body.Close()
			if err != nil {
				return nil, fmt.Errorf("read the request body: %w", err)
			}
			out, brep, err := e.ScrubBytes(&pol, body, opts)
			if err != nil {
				return nil, err
			}
			for _, fd := range brep.Findings() {
				rep.Add(fd)
			}
			r.Body = io.NopCloser(bytes.NewReader(out))
			r.ContentLength = int64(len(out))
			r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(out)), nil }
		} else {
			pr, pw := io.Pipe()
			src := r.Body
			var wg sync.WaitGroup
			wg.Go(func() {
				err := e.Scrub(pw, src, &pol, opts, rep)
				src.Close()
				pw.CloseWithError(err)
			})
			r.Body = pr
			r.ContentLength = -1
			r.GetBody = nil
			r.Header.Del("Content-Length")
			wait = func() {
				pr.CloseWithError(errors.New("request finished"))
				wg.Wait()
			}
		}
	}

	if send := r.Trailer; recv != nil {
		fill := func(b io.ReadCloser) io.ReadCloser { return &onEOF{ReadCloser: b, f: func() { maps.Copy(send, recv) }} }
		r.Body = fill(r.Body)
		if gb := r.GetBody; gb != nil {
			r.GetBody = func() (io.ReadCloser, error) {
				b, err := gb()
				if err != nil {
					return nil, err
				}
				return fill(b), nil
			}
		}
	}

	var once sync.Once
	var findings []egress.Finding
	return func() []egress.Finding {
		once.Do(func() {
			if wait != nil {
				wait()
			}
			f.upgrades.Delete(r)
			findings = f.report(dest, r, start, rep, "")
		})
		return findings
	}, nil
}

// headerScrub scrubs a request's header or trailer block in place.
type headerScrub struct {
	e            *dlp.Engine
	pol, credPol *dlp.Policy
	rep          *dlp.Report
}

// header scrubs h: where is "header" or "trailer", the findings' place.
// Framing headers are left alone in a header block and dropped from a
// trailer block (no trailer may frame or route the message).
func (s headerScrub) header(h http.Header, where string) {
	for name, vals := range h {
		if where == "trailer" && (framingHeaders[name] || !httpguts.ValidTrailerHeader(name)) {
			h.Del(name)
			continue
		}
		if framingHeaders[name] {
			continue
		}
		// A value hidden in a header's name cannot be replaced there (a
		// placeholder is no valid name): the header is dropped.
		if n := s.e.ScrubText(s.pol, []byte(name), where+"-name", s.rep); string(n) != name {
			h.Del(name)
			continue
		}
		if s.pol.Action(dlp.CatSecret) == dlp.Redact && s.e.ContainsKnownFold(name) {
			s.rep.Add(dlp.NewFinding(dlp.CatSecret, dlp.Redact, where+"-name", name))
			h.Del(name)
			continue
		}
		hp := s.pol
		if credentialHeaders[name] && where == "header" {
			// A trailer is never how the agent signs in: it gets the
			// whole policy, whatever its name.
			hp = s.credPol
		}
		for i, v := range vals {
			if out := s.e.ScrubText(hp, []byte(v), where+":"+name, s.rep); string(out) != v {
				vals[i] = string(out)
			}
		}
	}
}

// DLPRefusal is the error of a request the DLPFilter refuses because a
// value it would redact is where it cannot be replaced: a header that
// frames the message (Where "header:<Name>"), the method ("method").
// Findings are the request's findings so far, those in Where with the
// action "refuse"; the error names the place and the categories, never a
// value.
type DLPRefusal struct {
	Where    string
	Findings []egress.Finding
	err      error
}

func (e *DLPRefusal) Error() string { return e.err.Error() }

// framing scans the values of h's framing headers (but fixedHeaders). They
// are not rewritten, as the message depends on them: a value the DLP would
// redact is an error naming the header and what was found, never the
// value, returned with the header's name.
func (s headerScrub) framing(h http.Header) (string, error) {
	for _, name := range slices.Sorted(maps.Keys(h)) {
		if !framingHeaders[name] || fixedHeaders[name] {
			continue
		}
		where := "header:" + name
		for _, v := range h[name] {
			if out := s.e.ScrubText(s.pol, []byte(v), where, s.rep); string(out) == v {
				continue
			}
			var cats []string
			for _, fd := range s.rep.Findings() {
				if c := fd.Category.String(); fd.Where == where && fd.Action == dlp.Redact && !slices.Contains(cats, c) {
					cats = append(cats, c)
				}
			}
			return name, fmt.Errorf("the %s header carries a value the DLP redacts (%s); a header that frames the message is not rewritten, so the request is not sent",
				name, strings.Join(cats, ", "))
		}
	}
	return "", nil
}

// onEOF runs f once its body has ended, before the end is passed on (by
// then a request's trailers have arrived, and they are sent only after).
type onEOF struct {
	io.ReadCloser
	once sync.Once
	f    func()
}

func (b *onEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.f)
	}
	return n, err
}

// report turns a request's findings into network-log findings and audit
// records. When refused names a place ("header:Content-Type"), the request
// is not sent: what would have been redacted there is reported as refused.
func (f *DLPFilter) report(dest mitm.Destination, r *http.Request, start time.Time, rep *dlp.Report, refused string) []egress.Finding {
	fs := rep.Findings()
	if len(fs) == 0 {
		return nil
	}
	out := make([]egress.Finding, 0, len(fs))
	recs := make([]dlp.AuditRecord, 0, len(fs))
	u := mitm.RedactURL(schemeOf(dest), r.Host, r.URL)
	for _, fd := range fs {
		if refused != "" && fd.Where == refused && fd.Action == dlp.Redact {
			fd.Action = dlp.Refuse
		}
		out = append(out, egress.Finding{Category: fd.Category.String(), Prefix: fd.Prefix, Length: fd.Length, Where: fd.Where,
			Action: fd.Action.String(), Form: fd.Form, Source: fd.Source})
		recs = append(recs, dlp.AuditRecord{Time: start.UTC(), Dest: egress.HostPort(dest.Name, dest.Port), Method: r.Method, URL: u,
			Category: fd.Category.String(), Action: fd.Action.String(), Where: fd.Where, Form: fd.Form, Source: fd.Source,
			Value: fd.Value()})
	}
	if n := rep.Dropped(); n > 0 {
		out = append(out, egress.Finding{Category: "MORE", Where: fmt.Sprintf("%d more findings not listed", n), Action: "redact"})
	}
	if f.Audit != nil {
		if err := f.Audit.Record(recs...); err != nil && f.OnAuditError != nil {
			f.OnAuditError(err)
		}
	}
	return out
}

func schemeOf(d mitm.Destination) string {
	if d.Port == 80 {
		return "http"
	}
	return "https"
}
