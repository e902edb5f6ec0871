package mitm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Limits of one engine (one session). A hostile guest cannot take the host
// process past them however many connections, streams and stalled bodies
// it opens; docs/network.md explains what each one bounds.
const (
	// DefaultMemoryBudget is the memory one session's requests may hold
	// at once (EngineConfig.MemoryBudget when 0).
	DefaultMemoryBudget = 512 << 20
	// RequestCharge is what every request in flight is charged: its
	// share of connection and copy buffers, headers and state.
	RequestCharge = 128 << 10
	// bodyShare is the part of the budget bodies may take; the rest stays
	// for requests without a body, so a guest stalling large bodies still
	// gets its other requests served.
	bodyShareNum, bodyShareDen = 3, 4
	// DefaultBodyBufferLimit is the largest body a RequestFilter reads
	// whole before sending it (the DLP's; larger ones are streamed).
	DefaultBodyBufferLimit = 4 << 20
	// StreamedBodyCharge is what a streamed body (unknown or large length)
	// is charged: the filter's windows and pipe buffers.
	StreamedBodyCharge = 256 << 10
	// DefaultBodyIdleTimeout is how long a request body may send nothing
	// before the request is abandoned.
	DefaultBodyIdleTimeout = 30 * time.Second
	// MaxStreamsPerConn bounds an HTTP/2 guest connection's concurrent
	// streams.
	MaxStreamsPerConn = 100
	// DefaultMaxUpstreamConns bounds a session's open upstream connections
	// (spliced ones included); MaxConnsPerHost bounds them per host and
	// port for each transport.
	DefaultMaxUpstreamConns = 512
	MaxConnsPerHost         = 32
)

// errBudget is returned when a session's memory budget cannot cover a
// request.
var errBudget = errors.New("the session's memory budget for requests in flight is used up")

// Budget is a semaphore of bytes. Acquisitions never wait: a request that
// does not fit is refused (503) at once, so a hostile guest can only ever
// slow its own session.
type Budget struct {
	total int64
	mu    sync.Mutex
	used  int64
	// counters, for tests and Stats
	peak    atomic.Int64
	refused atomic.Int64
}

func newBudget(total int64) *Budget { return &Budget{total: total} }

// Take charges n bytes if the total stays within limit (total, or the
// bodies' share of it: body); it returns a release function, to be called
// once the bytes are no longer held, or an error that wraps errBudget.
func (b *Budget) Take(n int64, body bool) (func(), error) {
	limit := b.total
	if body {
		limit = b.total / bodyShareDen * bodyShareNum
	}
	b.mu.Lock()
	if b.used+n > limit {
		b.mu.Unlock()
		b.refused.Add(1)
		return nil, fmt.Errorf("%w (%d MiB); retry when other requests have finished", errBudget, b.total>>20)
	}
	b.used += n
	if b.used > b.peak.Load() {
		b.peak.Store(b.used)
	}
	b.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.used -= n
			b.mu.Unlock()
		})
	}, nil
}

// inUse is the bytes charged now.
func (b *Budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// bodyCharge is what a request body is charged: twice its length when the
// filter may read it whole (the buffer and the scrubbed copy), a streaming
// window otherwise.
func bodyCharge(r *http.Request, bufferLimit int64) int64 {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return 0
	}
	if r.ContentLength > 0 && r.ContentLength <= bufferLimit {
		return 2 * r.ContentLength
	}
	return StreamedBodyCharge
}

// idleBody is a request body whose every read must make progress within
// idle: it moves the guest connection's read deadline ahead of each read.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("the request body sent nothing for %v: %w", b.idle, err)
		}
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.rc.SetReadDeadline(time.Time{})
	return b.ReadCloser.Close()
}

// EngineStats is a snapshot of a GoEngine's resource counters (Stats).
type EngineStats struct {
	// MemoryInUse and MemoryPeak are the bytes charged to the memory
	// budget now and at most; BudgetRefusals counts requests refused
	// with 503 because it was used up.
	MemoryInUse, MemoryPeak, BudgetRefusals int64
	// UpstreamConns and UpstreamPeak are the upstream connections open
	// now and at most.
	UpstreamConns, UpstreamPeak int64
}

// Stats returns the engine's resource counters.
func (e *GoEngine) Stats() EngineStats {
	return EngineStats{
		MemoryInUse: e.budget.inUse(), MemoryPeak: e.budget.peak.Load(), BudgetRefusals: e.budget.refused.Load(),
		UpstreamConns: e.slots.Open.Load(), UpstreamPeak: e.slots.Peak.Load(),
	}
}
