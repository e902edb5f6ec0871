package netfilter

import (
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/egress"

	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Log file names inside a session's log directory.
const (
	NetworkLogFile = "network.jsonl"
	AlertsLogFile  = "alerts.jsonl"
)

// logQueue is how many events may wait for the writer before Record starts
// dropping them.
const logQueue = 8192

// Limits of a LogWriter. Each kind and decision ("request"/"allow",
// "dns"/"deny" …) has a token bucket of logBurst lines refilled at logRate
// a second; each file has a hard cap in bytes, of which the last
// logCapReserve are kept for the lines that count what was dropped. A
// guest that floods requests costs a few lines a second and a bounded
// file, never a full disk; every dropped line is counted.
const (
	logBurst      = 256
	logRate       = 64.0
	maxNetworkLog = 64 << 20
	maxAlertsLog  = 16 << 20
	logCapReserve = 64 << 10
)

type logLimits struct {
	burst, rate       float64 // burst 0: no rate limit
	netCap, alertsCap int64   // 0: no cap
}

var defaultLogLimits = logLimits{burst: logBurst, rate: logRate, netCap: maxNetworkLog, alertsCap: maxAlertsLog}

// Causes of a "dropped" line.
const (
	DropQueue = "queue" // the writer fell behind
	DropRate  = "rate"  // a kind's rate limit
	DropCap   = "cap"   // a file reached its size cap
)

// droppedLine is a line that says lines were not written. It has the Event
// fields (Kind "dropped", Decision "error") plus the count, the cause and,
// for a rate limit, the kind/decision that was limited. A line with
// Dropped 0 says limiting starts.
type droppedLine struct {
	egress.Event
	Dropped int64  `json:"dropped"`
	Cause   string `json:"cause"`
	Of      string `json:"of,omitempty"`
}

func newDroppedLine(n int64, cause, of, reason string) *droppedLine {
	return &droppedLine{
		Event:   egress.Event{Time: time.Now().UTC(), Kind: "dropped", Decision: "error", Reason: reason},
		Dropped: n, Cause: cause, Of: of,
	}
}

// logItem is one queued line: an event, or a dropped line (alert: it goes
// to alerts.jsonl too).
type logItem struct {
	e     egress.Event
	meta  *droppedLine
	alert bool
}

// logBucket is the rate limit of one kind/decision.
type logBucket struct {
	tokens  float64
	last    time.Time
	dropped int64 // in the current run of drops
	alert   bool
}

// LogWriter is the EventSink that writes JSON lines: every event to
// network.jsonl, alerts (IsAlert) to alerts.jsonl as well. Record never
// blocks: events go through a bounded queue, and when it is full they are
// counted and dropped; the count is written as a "dropped" line at the next
// chance and at Close. Each kind/decision is rate-limited and each file
// capped (see logBurst); what they drop is counted the same way. Files are
// opened for appending and created 0600.
type LogWriter struct {
	mu      sync.RWMutex // guards closed against Record's send
	closed  bool
	ch      chan logItem
	done    chan struct{}
	dropped atomic.Int64 // queue drops not yet reported
	total   atomic.Int64 // ever dropped, for any cause

	lim     logLimits
	now     func() time.Time
	lmu     sync.Mutex
	buckets map[string]*logBucket

	redact atomic.Pointer[logredact.Redactor]

	net, alerts   io.WriteCloser
	netW, alertsW *bufio.Writer
	netN, alertsN int64 // bytes in each file
	capDrop       [2]int64
	werr          error
	closeOnce     sync.Once
	closeErr      error
}

var _ egress.EventSink = (*LogWriter)(nil)

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
	w := newLogWriterLimits(nf, af, logQueue, defaultLogLimits, time.Now)
	return w, nil
}

func newLogWriter(nw, aw io.WriteCloser, queue int) *LogWriter {
	return newLogWriterLimits(nw, aw, queue, defaultLogLimits, time.Now)
}

func newLogWriterLimits(nw, aw io.WriteCloser, queue int, lim logLimits, now func() time.Time) *LogWriter {
	w := &LogWriter{
		ch:      make(chan logItem, queue),
		done:    make(chan struct{}),
		lim:     lim,
		now:     now,
		buckets: map[string]*logBucket{},
		net:     nw,
		alerts:  aw,
		netW:    bufio.NewWriterSize(nw, 64<<10),
		alertsW: bufio.NewWriterSize(aw, 16<<10),
		netN:    fileSize(nw),
		alertsN: fileSize(aw),
	}
	go w.run()
	return w
}

func fileSize(w io.Writer) int64 {
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			return fi.Size()
		}
	}
	return 0
}

// Record queues e. It sets e.Time when zero. It never blocks; after Close,
// when the queue is full or when e's kind is over its rate, the event is
// counted as dropped.
func (w *LogWriter) Record(e egress.Event) {
	if e.Time.IsZero() {
		e.Time = w.now()
	}
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		w.total.Add(1)
		return
	}
	pre, ok := w.admit(e)
	if pre != nil {
		w.enqueue(logItem{meta: pre, alert: egress.IsAlert(e)})
	}
	if ok {
		w.enqueue(logItem{e: e})
	}
}

// enqueue sends it without blocking; a full queue drops it (a dropped
// line's count then goes into the queue count).
func (w *LogWriter) enqueue(it logItem) {
	select {
	case w.ch <- it:
	default:
		n := int64(1)
		if it.meta != nil {
			n = it.meta.Dropped
		} else {
			w.total.Add(1)
		}
		w.dropped.Add(n)
	}
}

// admit takes a token from e's bucket. It returns whether e may be written
// and the dropped line to write first, if any: the start of a run of drops,
// or the count of one that just ended.
func (w *LogWriter) admit(e egress.Event) (*droppedLine, bool) {
	if w.lim.burst <= 0 {
		return nil, true
	}
	key := e.Kind + "/" + e.Decision
	now := w.now()
	w.lmu.Lock()
	defer w.lmu.Unlock()
	b := w.buckets[key]
	if b == nil {
		b = &logBucket{tokens: w.lim.burst, last: now}
		w.buckets[key] = b
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(w.lim.burst, b.tokens+dt*w.lim.rate)
	}
	b.last = now
	if b.tokens < 1 {
		b.dropped++
		b.alert = b.alert || egress.IsAlert(e)
		w.total.Add(1)
		if b.dropped == 1 {
			return newDroppedLine(0, DropRate, key, fmt.Sprintf("rate limit: %q lines over %g a second are dropped and counted from now on", key, w.lim.rate)), false
		}
		return nil, false
	}
	b.tokens--
	if b.dropped == 0 {
		return nil, true
	}
	n := b.dropped
	b.dropped, b.alert = 0, false
	return newDroppedLine(n, DropRate, key, fmt.Sprintf("rate limit: %d %q lines were dropped", n, key)), true
}

// Dropped is how many events were dropped so far, for any cause.
func (w *LogWriter) Dropped() int64 { return w.total.Load() }

func (w *LogWriter) run() {
	defer close(w.done)
	for it := range w.ch {
		w.write(it)
		// Drain what is queued, then flush so lines reach the files promptly.
		for more := true; more; {
			select {
			case it, ok := <-w.ch:
				if !ok {
					more = false
					w.flush()
					return
				}
				w.write(it)
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
func (w *LogWriter) SetRedactor(r logredact.Redactor) {
	if r == nil {
		w.redact.Store(nil)
		return
	}
	w.redact.Store(&r)
}

func (w *LogWriter) write(it logItem) {
	w.reportDrops()
	if it.meta != nil {
		w.writeLine(it.meta, it.alert, true)
		return
	}
	e := it.e
	if r := w.redact.Load(); r != nil {
		e = redactEvent(*r, e)
	}
	e.Time = e.Time.UTC()
	w.writeLine(e, egress.IsAlert(e), false)
}

func (w *LogWriter) reportDrops() {
	n := w.dropped.Swap(0)
	if n == 0 {
		return
	}
	// A gap in the record is itself worth an alert.
	w.writeLine(newDroppedLine(n, DropQueue, "", fmt.Sprintf("event queue full: %d events were not logged", n)), true, true)
}

// writeLine writes v to network.jsonl, and to alerts.jsonl when alert.
// An ordinary line that would take a file into its reserve is dropped and
// counted; a dropped line (meta) may use the reserve.
func (w *LogWriter) writeLine(v any, alert, meta bool) {
	b, err := json.Marshal(v)
	if err != nil {
		w.fail(fmt.Errorf("encode event: %w", err))
		return
	}
	b = append(b, '\n')
	w.put(0, w.netW, &w.netN, w.lim.netCap, b, meta)
	if alert {
		w.put(1, w.alertsW, &w.alertsN, w.lim.alertsCap, b, meta)
	}
}

func (w *LogWriter) put(i int, bw *bufio.Writer, n *int64, limit int64, b []byte, meta bool) {
	name := [2]string{"network", "alerts"}[i]
	if limit > 0 {
		room := limit - logCapReserve
		if meta {
			room = limit
		}
		if *n+int64(len(b)) > room {
			if meta {
				return // the reserve is used up: nothing more can be said
			}
			if i == 0 {
				w.total.Add(1) // an event counts once, by network.jsonl
			}
			if w.capDrop[i]++; w.capDrop[i] == 1 {
				w.put(i, bw, n, limit, w.capLine(i, 0), true)
			}
			return
		}
	}
	if _, err := bw.Write(b); err != nil {
		w.fail(fmt.Errorf("write %s log: %w", name, err))
		return
	}
	*n += int64(len(b))
}

// capLine is the dropped line of file i's cap: n 0 says it starts.
func (w *LogWriter) capLine(i int, n int64) []byte {
	file := [2]string{NetworkLogFile, AlertsLogFile}[i]
	reason := fmt.Sprintf("%s reached its cap of %d bytes: later lines are dropped and counted", file, [2]int64{w.lim.netCap, w.lim.alertsCap}[i])
	if n > 0 {
		reason = fmt.Sprintf("%s reached its cap: %d lines were dropped", file, n)
	}
	b, _ := json.Marshal(newDroppedLine(n, DropCap, file, reason))
	return append(b, '\n')
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

// finish writes the counts of rate-limit runs still open and of the caps.
// It runs after the writer goroutine ended.
func (w *LogWriter) finish() {
	w.lmu.Lock()
	var open []*droppedLine
	var alerts []bool
	for key, b := range w.buckets {
		if b.dropped > 0 {
			open = append(open, newDroppedLine(b.dropped, DropRate, key, fmt.Sprintf("rate limit: %d %q lines were dropped", b.dropped, key)))
			alerts = append(alerts, b.alert)
			b.dropped = 0
		}
	}
	w.lmu.Unlock()
	for i, d := range open {
		w.writeLine(d, alerts[i], true)
	}
	if n := w.capDrop[0]; n > 0 {
		w.put(0, w.netW, &w.netN, w.lim.netCap, w.capLine(0, n), true)
	}
	if n := w.capDrop[1]; n > 0 {
		w.put(1, w.alertsW, &w.alertsN, w.lim.alertsCap, w.capLine(1, n), true)
	}
	w.flush()
}

// Close stops accepting events, writes every queued one and the drop
// counts, and closes the files. It returns the first write errors, if any.
// It is safe to call more than once.
func (w *LogWriter) Close() error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		close(w.ch)
		w.mu.Unlock()
		<-w.done
		w.finish()
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

// redactEvent runs every free-text field of e through r. Kind, Decision,
// Time and numbers are the host's own.
func redactEvent(r logredact.Redactor, e egress.Event) egress.Event {
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
