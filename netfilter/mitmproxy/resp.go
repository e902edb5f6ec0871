package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"

	"io"
	"net/http"
	"net/url"
	"sort"
	"sync"
)

// The mitmproxy engine's responses pass the Go engine's response scrubber
// (FilterResponse, ScrubResponseHeader): the addon asks about every
// response header block and trailer block ("rhead", "rtrail"), and a
// provider's response body (the one a credential was swapped into the
// request of) is streamed through this side chunk by chunk ("rbody"), so
// it is decoded and scrubbed of every DLP form of the key, event by event
// for an event stream, exactly as on the Go engine.

// respCharge is what a provider's response streamed through the scrubber
// is charged to the session's memory budget: the scrubber's windows and an
// event stream's longest event, held back at most twice.
const respCharge = mitm.StreamedBodyCharge + 2*mitm.MaxHeldEvent

// respHead answers the addon's "rhead": a response's header block (final,
// 1xx or 101) scrubbed; for a provider's response with a body, a stream is
// opened that the body is then fed through.
func (e *Engine) respHead(m *ctlMsg) *ctlReply {
	e.mu.Lock()
	f := e.flows[m.ID]
	e.mu.Unlock()
	if f == nil {
		return deny(403, "not a request vibedom let through")
	}
	h := http.Header{}
	for _, kv := range m.Headers {
		h.Add(kv[0], kv[1])
	}
	out := &ctlReply{Action: "allow"}
	resp := &http.Response{StatusCode: m.Status, Header: h, ContentLength: -1, Trailer: http.Header{},
		Request: &http.Request{Method: m.Method, URL: &url.URL{Scheme: "https", Host: egress.HostPort(f.ev.Name, f.ev.Port)}}}
	rf, ok := e.filter.(mitm.ResponseFilter)
	noBody := m.Status < 200 || m.Status == http.StatusNoContent || m.Status == http.StatusNotModified || m.Method == http.MethodHead
	if sc, scoped := e.filter.(mitm.ResponseBodyScope); !ok || noBody || (scoped && !sc.RewritesBody(resp)) {
		if hs, ok := e.filter.(mitm.ResponseHeaderScrubber); ok {
			hs.ScrubResponseHeader(h)
		}
		out.Headers = headerFields(h)
		return out
	}
	rel, err := e.front.Budget().Take(respCharge, true)
	if err != nil {
		return deny(http.StatusServiceUnavailable, err.Error())
	}
	s := newRespStream(rel)
	resp.Body = s
	rf.FilterResponse(resp)
	e.mu.Lock()
	if e.flows[m.ID] != f || f.stream != nil {
		e.mu.Unlock()
		s.close()
		return deny(502, "the request ended")
	}
	f.stream = s
	e.mu.Unlock()
	go s.run(resp.Body)
	out.Headers = headerFields(h)
	out.Stream = true
	return out
}

// respTrailers answers "rtrail": a trailer block scrubbed.
func (e *Engine) respTrailers(m *ctlMsg) *ctlReply {
	h := http.Header{}
	for _, kv := range m.Headers {
		h.Add(kv[0], kv[1])
	}
	if hs, ok := e.filter.(mitm.ResponseHeaderScrubber); ok {
		hs.ScrubResponseHeader(h)
	}
	return &ctlReply{Action: "allow", Headers: headerFields(h)}
}

// respBody answers "rbody": the next piece of a provider's response body
// (End: the last) in, what the scrubber lets out by then back (raw after
// the line). An error (the key spelled out across an event stream, a body
// that cannot be decoded) refuses the rest of the response.
func (e *Engine) respBody(m *ctlMsg) *ctlReply {
	e.mu.Lock()
	var s *respStream
	if f := e.flows[m.ID]; f != nil {
		s = f.stream
	}
	e.mu.Unlock()
	if s == nil {
		return deny(403, "no response stream vibedom opened")
	}
	var in []byte
	if m.body != nil {
		var err error
		if in, err = io.ReadAll(m.body); err != nil {
			return deny(502, "reading the response body: "+err.Error())
		}
	}
	out, err := s.feed(in, m.End)
	if err != nil {
		return deny(502, err.Error())
	}
	return &ctlReply{Action: "allow", raw: out, BodyLen: int64(len(out))}
}

// headerFields lists h in a stable order.
func headerFields(h http.Header) [][2]string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out [][2]string
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

// respStream is a response body fed in pieces to a scrubber that reads
// it: feed hands a piece in and returns what the scrubber wrote out by the
// time it waits for the next (an event stream's events go out as soon as
// they are whole).
type respStream struct {
	mu      sync.Mutex
	cond    sync.Cond
	in      []byte
	eof     bool
	waiting bool // the scrubber waits for input
	out     []byte
	done    bool
	err     error
	rel     func()
	closed  bool
}

func newRespStream(rel func()) *respStream {
	s := &respStream{rel: rel}
	s.cond.L = &s.mu
	return s
}

// Read is the upstream body, as the scrubber reads it.
func (s *respStream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.in) == 0 && !s.eof {
		s.waiting = true
		s.cond.Broadcast()
		s.cond.Wait()
	}
	s.waiting = false
	if len(s.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.in)
	s.in = s.in[n:]
	return n, nil
}

// Close is the scrubber's closing of its source.
func (s *respStream) Close() error { return nil }

// run reads the scrubbed body into out until it ends.
func (s *respStream) run(body io.ReadCloser) {
	defer body.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		s.mu.Lock()
		if !s.closed {
			s.out = append(s.out, buf[:n]...)
		}
		if err != nil {
			s.done = true
			if err != io.EOF {
				s.err = err
			}
		}
		s.cond.Broadcast()
		stop := s.done
		s.mu.Unlock()
		if stop {
			return
		}
	}
}

// feed hands p in (end: the body is over) and returns what the scrubber
// let out by the time it waits for more, or its error.
func (s *respStream) feed(p []byte, end bool) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, io.ErrClosedPipe
	}
	s.in = append(s.in, p...)
	if end {
		s.eof = true
	}
	s.waiting = false
	s.cond.Broadcast()
	for !s.done && !(s.waiting && len(s.in) == 0 && !end) {
		s.cond.Wait()
	}
	out := s.out
	s.out = nil
	if s.err != nil {
		return nil, s.err
	}
	return out, nil
}

// close ends the stream (the flow is over): the scrubber sees the end of
// its input, what it still writes is dropped, and the charge goes back.
func (s *respStream) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed, s.eof, s.in, s.out = true, true, nil, nil
	s.cond.Broadcast()
	s.mu.Unlock()
	s.rel()
}
