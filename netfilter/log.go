package netfilter

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibedom/vibedom/dlp"
)

// Log file names inside a session's log directory.
const (
	NetworkLogFile = "network.jsonl"
	AlertsLogFile  = "alerts.jsonl"
)

// logQueue is how many events may wait for the writer before Record starts
// dropping them.
const logQueue = 8192

// EventSinkFunc adapts a function to EventSink. The function must be safe
// for concurrent use and return quickly.
type EventSinkFunc func(Event)

// Record implements EventSink.
func (f EventSinkFunc) Record(e Event) { f(e) }

// discardEvents is the EventSink used when none is configured.
type discardEvents struct{}

func (discardEvents) Record(Event) {}

// IsAlert reports whether e belongs in alerts.jsonl: a denial, or an event
// whose request was changed by a filter.
func IsAlert(e Event) bool {
	return e.Decision == "deny" || e.Decision == "scrub" || len(e.Findings) > 0
}

// droppedLine is the line written when events were dropped because the
// queue was full. It has the Event fields plus the count.
type droppedLine struct {
	Event
	Dropped int64 `json:"dropped"`
}

// LogWriter is the EventSink that writes JSON lines: every event to
// network.jsonl, alerts (IsAlert) to alerts.jsonl as well. Record never
// blocks: events go through a bounded queue, and when it is full they are
// counted and dropped; the count is written as a "dropped" line at the next
// chance and at Close. Files are opened for appending and created 0600.
type LogWriter struct {
	mu      sync.RWMutex // guards closed against Record's send
	closed  bool
	ch      chan Event
	done    chan struct{}
	dropped atomic.Int64 // not yet reported
	total   atomic.Int64 // ever dropped

	redact atomic.Pointer[Redactor]

	net, alerts   io.WriteCloser
	netW, alertsW *bufio.Writer
	werr          error
	closeOnce     sync.Once
	closeErr      error
}

var _ EventSink = (*LogWriter)(nil)

// NewLogWriter opens (appending, creating 0600) the two log files and starts
// the writer. Close it to flush.
func NewLogWriter(networkPath, alertsPath string) (*LogWriter, error) {
	nf, err := os.OpenFile(networkPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open network log %q: %w", networkPath, err)
	}
	af, err := os.OpenFile(alertsPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		nf.Close()
		return nil, fmt.Errorf("open alerts log %q: %w", alertsPath, err)
	}
	return newLogWriter(nf, af, logQueue), nil
}

func newLogWriter(nw, aw io.WriteCloser, queue int) *LogWriter {
	w := &LogWriter{
		ch:      make(chan Event, queue),
		done:    make(chan struct{}),
		net:     nw,
		alerts:  aw,
		netW:    bufio.NewWriterSize(nw, 64<<10),
		alertsW: bufio.NewWriterSize(aw, 16<<10),
	}
	go w.run()
	return w
}

// Record queues e. It sets e.Time when zero. It never blocks; after Close,
// or when the queue is full, the event is counted as dropped.
func (w *LogWriter) Record(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.total.Add(1)
		return
	}
	select {
	case w.ch <- e:
	default:
		w.dropped.Add(1)
		w.total.Add(1)
	}
}

// Dropped is how many events were dropped so far.
func (w *LogWriter) Dropped() int64 { return w.total.Load() }

func (w *LogWriter) run() {
	defer close(w.done)
	for e := range w.ch {
		w.write(e)
		// Drain what is queued, then flush so lines reach the files promptly.
		for more := true; more; {
			select {
			case e, ok := <-w.ch:
				if !ok {
					more = false
					w.flush()
					return
				}
				w.write(e)
			default:
				more = false
			}
		}
		w.flush()
	}
	w.flush()
}

// SetRedactor makes every string of every later line go through r before
// it is written (nil: none). Strings in a refused request come from the
// guest: a secret it puts in a host name, SNI, CONNECT target or path must
// not land in the logs in clear.
func (w *LogWriter) SetRedactor(r Redactor) {
	if r == nil {
		w.redact.Store(nil)
		return
	}
	w.redact.Store(&r)
}

func (w *LogWriter) write(e Event) {
	w.reportDrops()
	if r := w.redact.Load(); r != nil {
		e = redactEvent(*r, e)
	}
	w.writeLine(e, e)
}

func (w *LogWriter) reportDrops() {
	n := w.dropped.Swap(0)
	if n == 0 {
		return
	}
	line := droppedLine{
		Event: Event{
			Time:     time.Now().UTC(),
			Kind:     "dropped",
			Decision: "error",
			Reason:   fmt.Sprintf("event queue full: %d events were not logged", n),
		},
		Dropped: n,
	}
	// A gap in the record is itself worth an alert.
	w.writeLine(line, Event{Decision: "deny"})
}

func (w *LogWriter) writeLine(v any, e Event) {
	if ev, ok := v.(Event); ok {
		ev.Time = ev.Time.UTC()
		v = ev
	}
	b, err := json.Marshal(v)
	if err != nil {
		w.fail(fmt.Errorf("encode event: %w", err))
		return
	}
	b = append(b, '\n')
	if _, err := w.netW.Write(b); err != nil {
		w.fail(fmt.Errorf("write network log: %w", err))
	}
	if IsAlert(e) {
		if _, err := w.alertsW.Write(b); err != nil {
			w.fail(fmt.Errorf("write alerts log: %w", err))
		}
	}
}

// fail keeps the first write error for Close to return.
func (w *LogWriter) fail(err error) {
	if w.werr == nil {
		w.werr = err
	}
}

func (w *LogWriter) flush() {
	w.reportDrops()
	if err := w.netW.Flush(); err != nil {
		w.fail(fmt.Errorf("flush network log: %w", err))
	}
	if err := w.alertsW.Flush(); err != nil {
		w.fail(fmt.Errorf("flush alerts log: %w", err))
	}
}

// Close stops accepting events, writes every queued one and the drop count,
// and closes the files. It returns the first write errors, if any. It is
// safe to call more than once.
func (w *LogWriter) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		close(w.ch)
		w.mu.Unlock()
		<-w.done
		w.closeErr = errors.Join(w.werr, syncFile(w.net), w.net.Close(), syncFile(w.alerts), w.alerts.Close())
	})
	return w.closeErr
}

func syncFile(w io.Writer) error {
	if f, ok := w.(interface{ Sync() error }); ok {
		return f.Sync()
	}
	return nil
}

// Redactor replaces the secrets in a string logged from the guest's
// traffic, returning s itself when there is none. It must be safe for
// concurrent use.
type Redactor func(s string) string

// redactEvent runs every free-text field of e through r. Kind, Decision,
// Time and numbers are the host's own.
func redactEvent(r Redactor, e Event) Event {
	for _, f := range []*string{&e.Name, &e.Src, &e.Dst, &e.Method, &e.URL, &e.Rule, &e.Reason} {
		if *f != "" {
			*f = r(*f)
		}
	}
	if len(e.Findings) > 0 {
		fs := slices.Clone(e.Findings)
		for i := range fs {
			fs[i].Prefix, fs[i].Where, fs[i].Source = r(fs[i].Prefix), r(fs[i].Where), r(fs[i].Source)
		}
		e.Findings = fs
	}
	return e
}

// RedactedKnown replaces a whole logged string that holds a known value in
// a form the engine's scan does not see (a DNS name is lower-cased).
const RedactedKnown = "[REDACTED:known value in a logged string]"

// LogRedactor is the Redactor of a session's logs: known values in every
// form the engine knows (raw, base64, hex, URL and JSON escapes), the
// credential recognizers (tokens, keys, JWTs, URL passwords), and known
// values in any letter case (the whole string is then replaced). PII is
// kept: a log line's addresses and paths are what the user reads it for.
func LogRedactor(e *dlp.Engine) Redactor {
	pol := e.PolicyForClass(dlp.ClassPublic)
	for _, c := range dlp.Categories() {
		switch c {
		case dlp.CatSecret, dlp.CatPrivateKey, dlp.CatCloudKey, dlp.CatToken, dlp.CatJWT, dlp.CatCredentials, dlp.CatPassword:
			pol = pol.With(c, dlp.Redact)
		default:
			pol = pol.With(c, dlp.Pass)
		}
	}
	return func(s string) string {
		if s == "" {
			return s
		}
		out := string(e.ScrubText(&pol, []byte(s), "log", &dlp.Report{}))
		if e.ContainsKnownFold(out) {
			return RedactedKnown
		}
		return out
	}
}

// RedactHandler is a slog.Handler that runs the message and every string
// (and error or Stringer) attribute through a Redactor before handing the
// record on: the session log's choke point, as LogWriter is the network
// log's. Until SetRedactor is called, records pass unchanged.
type RedactHandler struct {
	next slog.Handler
	r    *atomic.Pointer[Redactor]
}

// NewRedactHandler wraps next.
func NewRedactHandler(next slog.Handler) *RedactHandler {
	return &RedactHandler{next: next, r: new(atomic.Pointer[Redactor])}
}

// SetRedactor sets the Redactor of h and of every handler derived from it
// (WithAttrs, WithGroup) from now on.
func (h *RedactHandler) SetRedactor(r Redactor) {
	if r == nil {
		h.r.Store(nil)
		return
	}
	h.r.Store(&r)
}

// Enabled implements slog.Handler.
func (h *RedactHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

// Handle implements slog.Handler.
func (h *RedactHandler) Handle(ctx context.Context, rec slog.Record) error {
	rp := h.r.Load()
	if rp == nil {
		return h.next.Handle(ctx, rec)
	}
	r := *rp
	out := slog.NewRecord(rec.Time, rec.Level, r(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(r, a))
		return true
	})
	return h.next.Handle(ctx, out)
}

// WithAttrs implements slog.Handler. Attributes given now are redacted now
// when a Redactor is set (those of the session's start carry no guest data).
func (h *RedactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	if rp := h.r.Load(); rp != nil {
		as = slices.Clone(as)
		for i := range as {
			as[i] = redactAttr(*rp, as[i])
		}
	}
	return &RedactHandler{next: h.next.WithAttrs(as), r: h.r}
}

// WithGroup implements slog.Handler.
func (h *RedactHandler) WithGroup(name string) slog.Handler {
	return &RedactHandler{next: h.next.WithGroup(name), r: h.r}
}

func redactAttr(r Redactor, a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, r(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]any, len(g))
		for i, x := range g {
			out[i] = redactAttr(r, x)
		}
		return slog.Group(a.Key, out...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, r(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, r(x.String()))
		case []byte:
			return slog.String(a.Key, r(string(x)))
		default:
			return slog.String(a.Key, r(fmt.Sprint(x)))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
