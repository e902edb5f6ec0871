package mitmproxy

import (
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// ctlMsg is one question from the addon (one JSON line).
type ctlMsg struct {
	Op        string      `json:"op"`
	Peer      string      `json:"peer"`
	ID        string      `json:"id"`
	SNI       string      `json:"sni"`
	Scheme    string      `json:"scheme"`
	Method    string      `json:"method"`
	Host      string      `json:"host"`
	Authority string      `json:"authority"` // an HTTP/1 absolute-form request line's
	DHost     string      `json:"dhost"`     // where mitmdump would send the request
	DPort     int         `json:"dport"`
	Path      string      `json:"path"`
	Proto     string      `json:"proto"`
	Headers   [][2]string `json:"headers"`
	// Trailers are a request's trailers ("request"), which mitmdump has
	// read whole with the body.
	Trailers [][2]string `json:"trailers"`
	Body     []byte      `json:"body"` // base64 in JSON (a WebSocket message)
	// BodyLen is the length of a request body sent as raw bytes right
	// after the JSON line (never base64 in it: a 60 MiB body would be held
	// three times over); body reads them.
	BodyLen int64 `json:"blen"`
	// Len is a request's declared Content-Length ("reserve"; -1 unknown).
	Len    int64     `json:"len"`
	body   io.Reader `json:"-"`
	Text   bool      `json:"text"`
	Status int       `json:"status"`
	Down   int64     `json:"down"`
	Error  string    `json:"error"`
	Replay bool      `json:"replay"` // a replay from mitmweb's UI
	End    bool      `json:"end"`    // the last piece of a response body ("rbody")
}

// ctlReply is the engine's answer.
type ctlReply struct {
	Action  string      `json:"action"` // "allow" or "deny"
	Status  int         `json:"status,omitempty"`
	Reason  string      `json:"reason,omitempty"`
	Method  string      `json:"method,omitempty"`
	Path    string      `json:"path,omitempty"`
	Headers [][2]string `json:"headers,omitempty"`
	// Trailers are the request's trailers to send, scrubbed ("request").
	Trailers [][2]string `json:"trailers,omitempty"`
	Body     []byte      `json:"body,omitempty"`
	// Scrub lists the values the addon replaces with ScrubWith in the
	// response's headers and body (see ResponseSecrets).
	Scrub     [][]byte `json:"scrub,omitempty"`
	ScrubWith []byte   `json:"scrub_with,omitempty"`
	// BodyLen is the length of the request body to send, written as raw
	// bytes (raw) after the JSON line.
	BodyLen int64  `json:"blen,omitempty"`
	raw     []byte `json:"-"`
	// Stream is set when the response body is to be fed through this
	// side ("rbody"): a provider's response.
	Stream bool `json:"stream,omitempty"`
	// Refusal is a refused request's answer, as the Go engine gives it:
	// content type, RefusedHeader's value and body text.
	Refusal *ctlRefusal `json:"refusal,omitempty"`
}

type ctlRefusal struct {
	CType   string `json:"ctype"`
	Refused string `json:"refused"`
	Text    string `json:"text"`
}

// maxCtlLine bounds one JSON line from the addon (headers, or a WebSocket
// message in base64); request bodies come after it, raw.
const maxCtlLine = 96 << 20

// readCtlLine reads one line of at most max bytes.
func readCtlLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errors.New("control message too long")
		}
		line = append(line, frag...)
		if err == nil {
			return line, nil
		}
		if err != bufio.ErrBufferFull {
			return nil, err
		}
	}
}

func (e *Engine) serveCtl() {
	defer e.wg.Done()
	for {
		c, err := e.ctlLn.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.ctls[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer func() {
				e.mu.Lock()
				delete(e.ctls, c)
				e.mu.Unlock()
				c.Close()
			}()
			br := bufio.NewReaderSize(c, 64<<10)
			bw := bufio.NewWriterSize(c, 64<<10)
			enc := json.NewEncoder(bw)
			for {
				line, err := readCtlLine(br, maxCtlLine)
				if err != nil {
					return
				}
				var m ctlMsg
				if json.Unmarshal(line, &m) != nil || m.BodyLen < 0 || m.BodyLen > e.cfg.BodyLimit {
					return
				}
				var lr *io.LimitedReader
				if m.BodyLen > 0 {
					lr = &io.LimitedReader{R: br, N: m.BodyLen}
					m.body = lr
				}
				rep := e.answer(&m)
				// What the answer did not read (a refused request) is
				// skipped, so the next message starts where it should.
				if lr != nil && lr.N > 0 {
					if _, err := io.Copy(io.Discard, lr); err != nil || lr.N > 0 {
						return
					}
				}
				if rep == nil {
					continue
				}
				if enc.Encode(rep) != nil {
					return
				}
				if len(rep.raw) > 0 {
					if _, err := bw.Write(rep.raw); err != nil {
						return
					}
				}
				if bw.Flush() != nil {
					return
				}
			}
		}()
	}
}

func deny(status int, reason string) *ctlReply {
	return &ctlReply{Action: "deny", Status: status, Reason: reason}
}

func (e *Engine) conn(peer string) *mitmConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.conns[peer]
}

// answer decides one question; nil means no answer is sent.
func (e *Engine) answer(m *ctlMsg) *ctlReply {
	switch m.Op {
	case "hello":
		e.helloOnce.Do(func() { close(e.hello) })
		return &ctlReply{Action: "allow"}
	case "sni":
		c := e.conn(m.Peer)
		if c == nil {
			return deny(403, "not a connection vibedom handed over")
		}
		if reason := mitm.SNIMismatch(m.SNI, m.SNI != "", c.t.Name); reason != "" {
			c.refused.Store(&reason)
			c.guest.Close()
			c.mc.Close()
			return deny(403, reason)
		}
		c.sniOK.Store(true)
		return &ctlReply{Action: "allow"}
	case "request":
		return e.request(m)
	case "reserve":
		return e.reserve(m)
	case "release":
		e.release(m.ID)
		return nil
	case "raw":
		return e.rawTCP(m)
	case "ws":
		return e.wsMessage(m)
	case "wsin":
		return e.wsUpstream(m)
	case "rhead":
		return e.respHead(m)
	case "rtrail":
		return e.respTrailers(m)
	case "rbody":
		return e.respBody(m)
	case "status":
		e.mu.Lock()
		if f := e.flows[m.ID]; f != nil {
			f.status = m.Status
		}
		e.mu.Unlock()
		return nil
	case "done":
		e.release(m.ID)
		e.mu.Lock()
		f := e.flows[m.ID]
		delete(e.flows, m.ID)
		if f != nil {
			if c := e.conns[f.peer]; c != nil {
				delete(c.flows, m.ID)
			}
		}
		e.mu.Unlock()
		if f != nil {
			e.finish(f, m.Status, m.Down, m.Error)
		}
		return nil
	}
	return deny(400, "unknown question")
}

// request checks a request's Host against the admitted name, runs it
// through the filter (the DLP) and returns the request to send.
func (e *Engine) request(m *ctlMsg) *ctlReply {
	c := e.conn(m.Peer)
	if c == nil {
		return deny(403, "not a connection vibedom handed over")
	}
	t := c.t
	// Only what the guest sent, each request once: a replay (of the same
	// flow, or of a duplicate) from the live view's UI is refused here
	// too, whatever the addon did about it.
	e.mu.Lock()
	_, again := c.seen[m.ID]
	if !again && m.ID != "" {
		c.seen[m.ID] = struct{}{}
	}
	e.mu.Unlock()
	if m.Replay || again || m.ID == "" {
		return e.refuseReq(m, reqDest{name: t.Name, port: t.Port, decision: t.Decision, src: t.Guest}, nil,
			http.StatusForbidden, "a replayed request: vibedom passes only what the guest sends, once")
	}
	scheme := "http"
	if m.Scheme == "https" {
		scheme = "https"
		if !c.sniOK.Load() {
			return deny(403, "the TLS handshake was not checked")
		}
	}
	dest := reqDest{name: t.Name, port: t.Port, scheme: scheme, decision: t.Decision, src: t.Guest}
	// Port 443 is TLS's: plain HTTP to it (inside a CONNECT tunnel or
	// transparent) never goes out, so no credential is ever swapped into
	// a request upstream would read in clear.
	if scheme != "https" && (t.Port == 443 || m.DPort == 443) {
		return e.refuseReq(m, dest, nil, http.StatusBadRequest, "plain HTTP to port 443: use https://")
	}
	u, err := url.ParseRequestURI(m.Path)
	if err != nil || m.Method == "" {
		return e.refuseReq(m, dest, nil, http.StatusBadRequest, "malformed request")
	}
	r := &http.Request{Method: m.Method, URL: u, Host: m.Host, Header: http.Header{}, RequestURI: m.Path,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	if strings.HasPrefix(m.Proto, "HTTP/2") {
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
	}
	hadHost := false
	for _, kv := range m.Headers {
		if !httpguts.ValidHeaderFieldName(kv[0]) || !httpguts.ValidHeaderFieldValue(kv[1]) {
			return e.refuseReq(m, dest, nil, http.StatusBadRequest, fmt.Sprintf("malformed header %q", egress.Shorten(kv[0])))
		}
		k := http.CanonicalHeaderKey(kv[0])
		if k == "Host" {
			hadHost = true
			continue
		}
		r.Header.Add(k, kv[1])
	}
	for _, kv := range m.Trailers {
		if !httpguts.ValidHeaderFieldName(kv[0]) || !httpguts.ValidHeaderFieldValue(kv[1]) {
			return e.refuseReq(m, dest, nil, http.StatusBadRequest, fmt.Sprintf("malformed trailer %q", egress.Shorten(kv[0])))
		}
		if r.Trailer == nil {
			r.Trailer = http.Header{}
		}
		r.Trailer.Add(http.CanonicalHeaderKey(kv[0]), kv[1])
	}
	if m.Authority != "" {
		r.URL.Host = m.Authority // checked against Host below, as the Go engine does
	}
	if m.Method == http.MethodConnect {
		return e.refuseReq(m, dest, r, http.StatusMethodNotAllowed, "CONNECT is served only by the explicit proxy, not on an intercepted connection")
	}
	if reason := mitm.AuthorityMismatch(r, t.Name, t.Port, scheme); reason != "" {
		return e.refuseReq(m, dest, r, http.StatusMisdirectedRequest, reason)
	}
	// An absolute-form request line names its own destination, which
	// mitmdump would follow: it must be the admitted one too.
	if name, ok := normalTarget(m.DHost); !ok || name != t.Name || m.DPort != int(t.Port) {
		return e.refuseReq(m, dest, r, http.StatusMisdirectedRequest,
			fmt.Sprintf("request target %q does not match the admitted destination %s", egress.Shorten(egress.HostPort(m.DHost, uint16(m.DPort))), egress.HostPort(t.Name, t.Port)))
	}
	ws := mitm.RestrictUpgrade(r)
	switch {
	case m.body != nil:
		r.ContentLength = m.BodyLen
		r.Body = io.NopCloser(m.body) // streamed from the socket into the filter
	case len(m.Body) > 0:
		r.ContentLength = int64(len(m.Body))
		r.Body = io.NopCloser(bytes.NewReader(m.Body))
	default:
		r.Body = http.NoBody
	}
	ctx := context.Background()
	r = r.WithContext(ctx)
	ev := egress.Event{Time: time.Now(), Kind: "request", Name: t.Name, Port: t.Port, Src: mitm.AddrString(t.Guest), Method: m.Method, Rule: t.Decision.Rule}
	// "https" only after the checked handshake (above); mitmdump verifies
	// upstream TLS (ssl_insecure=false): the swap's condition.
	done, err := e.filter.FilterRequest(ctx, mitm.Destination{Name: t.Name, Port: t.Port, Scheme: scheme, Verified: scheme == "https"}, r)
	var ans *credentials.Answer
	if errors.As(err, &ans) {
		return e.answerReq(m, dest, r, ans)
	}
	if err != nil {
		return e.refuseReq(m, dest, r, http.StatusForbidden, "request refused by the content filter: "+err.Error())
	}
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, e.cfg.BodyLimit+1))
		r.Body.Close()
		if err == nil && int64(len(body)) > e.cfg.BodyLimit {
			err = errors.New("the scrubbed body is over the limit")
		}
		if err != nil {
			if done != nil {
				done()
			}
			return e.refuseReq(m, dest, r, http.StatusForbidden, "request refused by the content filter: "+err.Error())
		}
	}
	out := &ctlReply{Action: "allow", Method: r.Method, Path: r.URL.RequestURI(), raw: body, BodyLen: int64(len(body))}
	if rs, ok := e.filter.(mitm.ResponseSecrets); ok {
		out.Scrub, out.ScrubWith = rs.ResponseSecrets()
	}
	if r.ProtoMajor < 2 && hadHost {
		out.Headers = append(out.Headers, [2]string{"Host", r.Host})
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "Content-Length" || k == "Transfer-Encoding" {
			continue
		}
		for _, v := range r.Header[k] {
			out.Headers = append(out.Headers, [2]string{k, v})
		}
	}
	if len(body) > 0 || r.Header.Get("Content-Length") != "" || r.Header.Get("Transfer-Encoding") != "" {
		out.Headers = append(out.Headers, [2]string{"Content-Length", strconv.Itoa(len(body))})
	}
	// The filter scrubbed the trailers once it read the body's end (above).
	for _, k := range slices.Sorted(maps.Keys(r.Trailer)) {
		for _, v := range r.Trailer[k] {
			out.Trailers = append(out.Trailers, [2]string{k, v})
		}
	}
	ev.URL = mitm.RedactURL(scheme, r.Host, r.URL)
	f := &mitmFlow{peer: m.Peer, ev: ev, done: done}
	if ws {
		f.req = r
	}
	e.mu.Lock()
	if cur := e.conns[m.Peer]; cur == c {
		e.flows[m.ID] = f
		c.flows[m.ID] = struct{}{}
		f = nil
	}
	e.mu.Unlock()
	if f != nil { // the connection is gone
		e.finish(f, 0, 0, "the connection ended")
		return deny(502, "the connection ended")
	}
	f2 := int64(len(body))
	e.mu.Lock()
	if fl := e.flows[m.ID]; fl != nil {
		fl.ev.BytesUp = f2
	}
	e.mu.Unlock()
	return out
}

// refuseReq records a refused request and tells the addon to answer it.
// reqDest is where a request the engine refuses or answers itself was
// going, and why it was admitted.
type reqDest struct {
	name     string
	port     uint16
	scheme   string
	decision egress.Decision
	src      netip.AddrPort
}

func (e *Engine) refuseReq(m *ctlMsg, dest reqDest, r *http.Request, status int, reason string) *ctlReply {
	id := m.ID
	e.release(id)
	e.lastRefused.Store(&id)
	ev := egress.Event{Time: time.Now(), Kind: "request", Name: dest.name, Port: dest.port, Src: mitm.AddrString(dest.src),
		Method: m.Method, Decision: "deny", Rule: dest.decision.Rule, Reason: reason, Status: status}
	if r != nil {
		ev.URL = mitm.RedactURL(dest.scheme, m.Host, r.URL)
	}
	e.events.Record(ev)
	accept := ""
	for _, h := range m.Headers {
		if strings.EqualFold(h[0], "Accept") {
			accept = h[1]
		}
	}
	rep := deny(status, reason)
	ctype, refused, body := mitm.Refusal(accept, dest.name, dest.port, status, reason, e.cfg.Session, false)
	rep.Refusal = &ctlRefusal{CType: ctype, Refused: refused, Text: string(body)}
	return rep
}

// answerReq has the addon answer the request with a filter's own answer
// (nothing is forwarded) and records it.
func (e *Engine) answerReq(m *ctlMsg, dest reqDest, r *http.Request, a *credentials.Answer) *ctlReply {
	id := m.ID
	e.release(id)
	e.lastRefused.Store(&id)
	e.events.Record(egress.Event{Time: time.Now(), Kind: "request", Name: dest.name, Port: dest.port, Src: mitm.AddrString(dest.src),
		Method: m.Method, URL: mitm.RedactURL(dest.scheme, m.Host, r.URL), Decision: a.Decision, Rule: dest.decision.Rule,
		Reason: "answered by vibedom, not forwarded: " + a.Reason, Status: a.Status})
	out := &ctlReply{Action: "answer", Status: a.Status, Body: a.Body}
	for k, vs := range a.Header {
		for _, v := range vs {
			out.Headers = append(out.Headers, [2]string{k, v})
		}
	}
	return out
}

// finish records a request's event, as the Go engine does.
func (e *Engine) finish(f *mitmFlow, status int, down int64, errText string) {
	if f.stream != nil {
		f.stream.close()
	}
	var findings []egress.Finding
	if f.done != nil {
		findings = f.done()
	}
	ev := f.ev
	ev.Status, ev.BytesDn, ev.Findings = status, down, findings
	switch {
	case errText != "":
		ev.Decision, ev.Reason = "error", errText
	case mitm.ScrubDescription(findings) != "":
		ev.Decision, ev.Reason = "scrub", "redacted: "+mitm.ScrubDescription(findings)
	case len(findings) > 0:
		ev.Decision, ev.Reason = "allow", fmt.Sprintf("%d finding(s) logged, not redacted", len(findings))
	default:
		ev.Decision = "allow"
	}
	e.events.Record(ev)
}

// wsMessage scrubs one WebSocket message the guest sends, with the
// filter's UpgradeWriter (the same scrubber the Go engine runs on frames).
func (e *Engine) wsMessage(m *ctlMsg) *ctlReply {
	e.mu.Lock()
	f := e.flows[m.ID]
	e.mu.Unlock()
	if f == nil || f.req == nil {
		return deny(403, "not a WebSocket vibedom let through")
	}
	uf, ok := e.filter.(mitm.UpgradeFilter)
	if !ok {
		return &ctlReply{Action: "allow", Body: m.Body}
	}
	var out bytes.Buffer
	w := uf.UpgradeWriter(f.req, &out)
	if w == nil {
		return &ctlReply{Action: "allow", Body: m.Body}
	}
	op := byte(0x2)
	if m.Text {
		op = 0x1
	}
	if _, err := w.Write(wsOneFrame(op, m.Body)); err != nil {
		return deny(403, "message refused by the content filter: "+err.Error())
	}
	if err := w.Close(); err != nil {
		return deny(403, "message refused by the content filter: "+err.Error())
	}
	payload, err := wsPayloads(out.Bytes())
	if err != nil {
		return deny(403, err.Error())
	}
	return &ctlReply{Action: "allow", Body: payload}
}

// wsUpstream scrubs a WebSocket message from upstream the way the Go
// engine scrubs each frame's payload (every DLP form of a real key).
func (e *Engine) wsUpstream(m *ctlMsg) *ctlReply {
	e.mu.Lock()
	f := e.flows[m.ID]
	e.mu.Unlock()
	if f == nil {
		return deny(403, "not a WebSocket vibedom let through")
	}
	if s, ok := e.filter.(mitm.UpstreamMessageScrubber); ok {
		return &ctlReply{Action: "allow", Body: s.ScrubUpstreamMessage(m.Body)}
	}
	return &ctlReply{Action: "allow", Body: m.Body}
}

// wsOneFrame is one final, unmasked frame.
func wsOneFrame(op byte, p []byte) []byte {
	b := []byte{0x80 | op}
	switch l := len(p); {
	case l <= 125:
		b = append(b, byte(l))
	case l <= 0xffff:
		b = append(b, 126, byte(l>>8), byte(l))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(l))
	}
	return append(b, p...)
}

// wsPayloads joins the (masked) data frames' payloads of one message.
func wsPayloads(b []byte) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, errors.New("truncated frame from the scrubber")
		}
		op, n := b[0]&0x0f, 2
		l := uint64(b[1] & 0x7f)
		switch l {
		case 126:
			if len(b) < 4 {
				return nil, errors.New("truncated frame from the scrubber")
			}
			l, n = uint64(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			if len(b) < 10 {
				return nil, errors.New("truncated frame from the scrubber")
			}
			l, n = binary.BigEndian.Uint64(b[2:10]), 10
		}
		var key []byte
		if b[1]&0x80 != 0 {
			if len(b) < n+4 {
				return nil, errors.New("truncated frame from the scrubber")
			}
			key, n = b[n:n+4], n+4
		}
		if uint64(len(b)-n) < l {
			return nil, errors.New("truncated frame from the scrubber")
		}
		p := b[n : n+int(l)]
		if op < 0x8 {
			for i, c := range p {
				if key != nil {
					c ^= key[i&3]
				}
				out = append(out, c)
			}
		}
		b = b[n+int(l):]
	}
	return out, nil
}

// normalTarget normalises a host name or IP literal as admission does.
func normalTarget(h string) (string, bool) {
	if ip, ok := egress.ParseAddr(strings.Trim(h, "[]")); ok {
		return ip.String(), true
	}
	n, err := egress.NormalizeName(h)
	return n, err == nil
}

// reserve charges a request body mitmdump is about to buffer to the
// session's memory budget (the Go engine's), before a byte of it is read:
// its declared length three times over (mitmdump's copy, the scrubbed one
// here and mitmdump's copy of that), or, when unknown (chunked, HTTP/2
// without a length), the body limit three times over. The charge is held until the request is done; a request it
// does not fit is refused at once (503), as on the Go engine.
func (e *Engine) reserve(m *ctlMsg) *ctlReply {
	c := e.conn(m.Peer)
	if c == nil || m.ID == "" {
		return deny(403, "not a connection vibedom handed over")
	}
	n := m.Len
	if n < 0 || n > e.cfg.BodyLimit {
		n = e.cfg.BodyLimit
	}
	rel, err := e.front.Budget().Take(mitm.RequestCharge+3*n, true)
	if err != nil {
		e.events.Record(egress.Event{Time: time.Now(), Kind: "request", Name: c.t.Name, Port: c.t.Port, Src: mitm.AddrString(c.t.Guest),
			Method: m.Method, Decision: "deny", Rule: c.t.Decision.Rule, Reason: err.Error(), Status: http.StatusServiceUnavailable})
		return deny(http.StatusServiceUnavailable, err.Error())
	}
	e.mu.Lock()
	if cur := e.conns[m.Peer]; cur != c {
		e.mu.Unlock()
		rel()
		return deny(502, "the connection ended")
	}
	if e.resv == nil {
		e.resv = map[string]reservation{}
	}
	old := e.resv[m.ID].rel
	e.resv[m.ID] = reservation{rel: rel, c: c}
	if c.resv == nil {
		c.resv = map[string]struct{}{}
	}
	c.resv[m.ID] = struct{}{}
	e.mu.Unlock()
	if old != nil {
		old()
	}
	return &ctlReply{Action: "allow"}
}

// release gives a request's reservation back.
func (e *Engine) release(id string) {
	e.mu.Lock()
	r, ok := e.resv[id]
	delete(e.resv, id)
	if ok {
		delete(r.c.resv, id)
	}
	e.mu.Unlock()
	if ok {
		r.rel()
	}
}

// rawTCP answers mitmdump's choice to relay a connection's bytes raw
// (neither TLS nor HTTP): as on the Go engine, allowed on ports other than
// 80 and 443 only; on those the connection is refused and closed, so the
// bytes never reach upstream past the DLP.
func (e *Engine) rawTCP(m *ctlMsg) *ctlReply {
	c := e.conn(m.Peer)
	if c == nil {
		return deny(403, "not a connection vibedom handed over")
	}
	if c.t.Port != 80 && c.t.Port != 443 && m.DPort != 80 && m.DPort != 443 {
		return &ctlReply{Action: "allow"}
	}
	reason := fmt.Sprintf("neither TLS nor HTTP on port %d", c.t.Port)
	c.refused.Store(&reason)
	c.guest.Close()
	c.mc.Close()
	return deny(403, reason)
}
