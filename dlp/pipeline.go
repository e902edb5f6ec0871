package dlp

import (
	"io"
	"sync"
	"sync/atomic"
)

// A body's whole segments (a JSON string, the text between two strings,
// a form value: anything that fits one window) are scanned in a pipeline
// on two cores. The caller walks the body and runs the recognizers but
// the anchor pass on each segment as it ends, then copies the segment
// into a batch; a worker searches a batch's known values (and their
// views) and runs the anchor pass while the caller walks on. The caller
// settles the segments in order once their batch is back, so the output
// and the findings are the same as when everything runs in turn. A batch
// carries 32 KiB of text or more, so a hand-over (a thread woken) comes
// with ~100 µs of work. Nothing waits for a worker that has not started:
// a caller that needs a batch takes it back and scans it itself, and
// while it waits for one a worker is scanning it takes the newest one
// not started (so the two even out, and every core busy with other
// bodies costs no wait).

const (
	// batchMax is the decoded text of a batch handed to a worker.
	batchMax = 32 << 10
	// pipeMin is how much decoded text a body scans in turn before its
	// segments are pipelined (a small body is done before the copies
	// would pay).
	pipeMin = 16 << 10
	// firstBatch is the text of a body's first batch: the first
	// hand-over comes after 64 KiB. (A 64 KiB body handed over half way
	// took 10-20 % longer at the median on a loaded machine: its caller
	// waited for a worker the kernel had not run.)
	firstBatch = 48 << 10
	// maxQueued is how many batches may wait for a worker or for their
	// settling before the caller settles the oldest.
	maxQueued = 3
)

// pipe is the pipeline of one layer.
type pipe struct {
	e   *Engine
	pol *Policy
	rep *Report
	// out is the layer's output: the bytes between segments, and the
	// settled output once nothing is pending. A pending segment's output
	// goes in at its outAt.
	out  *[]byte
	seen int // decoded bytes scanned in turn before pipelining
	// handed: a batch went to a worker (later ones are smaller).
	handed bool
	cur    *batch
	queue  []*batch // handed over, oldest first
	free   []*batch
	// ready is settled output not yet written to dst; err is the first
	// error writing it.
	ready []byte
	dst   io.Writer
	err   error
	views viewSet
	ms    []match
	spans []match
	sc    scanner // not on the heap for each segment
}

// pjob is one segment in a batch: its text, raw bytes and escapes are
// copied into the batch's buffers.
type pjob struct {
	where  string
	ph     phCtx
	mapped bool
	full   bool
	n      int
	d0     int // decoded text at dec[d0:d0+n]
	r0, r1 int // raw bytes, when mapped
	e0, e1 int // escapes
	m0, m1 int // the caller's matches in rms
	k0, k1 int // the worker's matches (known, then anchors) in wms
	hold   int
	outAt  int
}

// Batch states.
const (
	bFilling int32 = iota
	bQueued        // handed over, not started
	bWorker        // a worker is scanning it
	bDone          // the worker is done
	bCaller        // the caller took it back (and scanned it)
)

type batch struct {
	e     *Engine
	pol   *Policy
	state atomic.Int32
	wg    sync.WaitGroup
	// anchors: the worker runs the anchor pass too.
	anchors  bool
	jobs     []pjob
	dec, raw []byte
	esc      []escape
	rms, wms []match
	bytes    int
	panicked any
	sc       scanner
	pemOpen  bool
}

var pipePool sync.Pool

// newPipe returns a pipeline for a layer writing to *out and then dst,
// or nil when the policy searches no known values (there is then little
// to split).
func newPipe(e *Engine, pol *Policy, rep *Report, out *[]byte, dst io.Writer) *pipe {
	if !pol.active(CatSecret) || e.inTurn {
		return nil
	}
	p, _ := pipePool.Get().(*pipe)
	if p == nil {
		p = &pipe{}
	}
	p.e, p.pol, p.rep, p.out, p.dst, p.seen, p.err, p.handed = e, pol, rep, out, dst, 0, nil, false
	return p
}

// release returns an idle pipeline to the pool.
func (p *pipe) release() {
	if p.busy() {
		return // an abandoned body: left to the collector
	}
	p.e, p.pol, p.rep, p.out, p.dst, p.err = nil, nil, nil, nil, nil, nil
	p.sc = scanner{}
	if cap(p.ready) > 1<<20 {
		p.ready = nil
	}
	pipePool.Put(p)
}

func (p *pipe) busy() bool { return p.cur != nil || len(p.queue) > 0 }

// take scans the whole segment g (final, never processed) for the
// recognizers and queues it for its known values and settling; false
// leaves it to be processed in turn.
func (p *pipe) take(g *segment) bool {
	n := len(g.dec)
	if g.redactedTo >= 0 || g.pemOpen {
		return false // the rest of a segment some window of which settled
	}
	if !p.busy() && p.seen < pipeMin {
		p.seen += n
		return false
	}
	b := p.cur
	if b == nil {
		b = p.newBatch()
		p.cur = b
	}
	m0 := len(b.rms)
	sc := &p.sc
	*sc = scanner{e: p.e, pol: p.pol, buf: g.dec, n: n, final: true, hold: n, pemOpen: &g.pemOpen,
		full: n >= p.e.window, out: b.rms, noAnchors: b.anchors}
	sc.run()
	if g.keyed && p.pol.active(CatPassword) && secretValue(g.dec) {
		sc.add(0, n, CatPassword)
	}
	b.rms = sc.out
	sc.out, sc.buf = nil, nil
	j := pjob{where: g.where, ph: g.ph, mapped: g.mapped, full: sc.full, n: n, d0: len(b.dec),
		m0: m0, m1: len(b.rms), hold: sc.hold, outAt: len(*p.out)}
	b.dec = append(b.dec, g.dec...)
	if g.mapped {
		j.r0 = len(b.raw)
		b.raw = append(b.raw, g.raw...)
		j.r1 = len(b.raw)
		j.e0 = len(b.esc)
		b.esc = append(b.esc, g.esc...)
		j.e1 = len(b.esc)
	}
	b.jobs = append(b.jobs, j)
	b.bytes += n
	g.dec, g.raw, g.esc = g.dec[:0], g.raw[:0], g.esc[:0]
	g.look, g.mapped = 0, false
	if b.bytes >= batchMax && (p.handed || b.bytes >= firstBatch) {
		p.submit(true)
	}
	return true
}

func (p *pipe) newBatch() *batch {
	var b *batch
	if k := len(p.free); k > 0 {
		b, p.free = p.free[k-1], p.free[:k-1]
	} else {
		// Sized for a batch and one more window, so that a pipeline
		// does not grow them through every size.
		b = &batch{dec: make([]byte, 0, batchMax+64<<10), raw: make([]byte, 0, batchMax+80<<10),
			esc: make([]escape, 0, 4096), rms: make([]match, 0, 256), wms: make([]match, 0, 256)}
	}
	b.e, b.pol = p.e, p.pol
	b.jobs, b.dec, b.raw, b.esc, b.rms, b.wms = b.jobs[:0], b.dec[:0], b.raw[:0], b.esc[:0], b.rms[:0], b.wms[:0]
	b.bytes = 0
	b.state.Store(bFilling)
	// The anchor pass goes with the known values: the caller walks the
	// body and runs the other recognizers, about 40 % of the work, and
	// takes batches back to even it out.
	b.anchors = p.pol.anyOf(p.e.anchors.cats)
	return b
}

// submit queues the current batch, handing it to a worker when send.
func (p *pipe) submit(send bool) {
	b := p.cur
	p.cur = nil
	b.wg.Add(1)
	b.state.Store(bQueued)
	testPipeBatches.Add(1)
	p.queue = append(p.queue, b)
	if send {
		p.handed = true
		select {
		case knownWorkers().batches <- b:
		default: // no room: the caller takes it back when it needs it
		}
	}
	if len(p.queue) > maxQueued {
		p.settle(1)
	}
}

// work is a worker's turn at b (stale hand-overs of a batch the caller
// took back, or of an earlier use of it, are skipped).
func (b *batch) work(views *viewSet) {
	if !b.state.CompareAndSwap(bQueued, bWorker) {
		return
	}
	defer func() {
		b.panicked = recover() // raised again where the caller settles
		b.state.Store(bDone)
		b.wg.Done()
	}()
	b.scan(views)
}

// scan searches the known values of each segment of b, and runs the
// anchor pass when b.anchors.
func (b *batch) scan(views *viewSet) {
	k := b.e.known
	for i := range b.jobs {
		j := &b.jobs[i]
		dec := b.dec[j.d0 : j.d0+j.n : j.d0+j.n]
		j.k0 = len(b.wms)
		ms := k.scan(dec, 0, j.n, b.wms)
		ms = k.scanViews(dec, 0, j.n, ms, views)
		if b.anchors {
			b.pemOpen = false
			sc := &b.sc
			*sc = scanner{e: b.e, pol: b.pol, buf: dec, n: j.n, final: true, hold: j.hold, pemOpen: &b.pemOpen,
				full: j.full, out: ms}
			sc.anchorPass()
			ms, j.hold = sc.out, sc.hold
			*sc = scanner{}
		}
		b.wms = ms
		j.k1 = len(ms)
	}
}

// settle settles the batches at the head of the queue: count of them,
// waiting for them if need be, or (count < 0) those already back.
func (p *pipe) settle(count int) {
	out := *p.out
	pos := 0
	for len(p.queue) > 0 && count != 0 {
		b := p.queue[0]
		if !b.finished() {
			if count < 0 {
				break
			}
			// While a worker scans b, scan the newest batch it has
			// not started (it takes the oldest first), one at a time.
			for !b.finished() && !p.tryTake(b) {
				i := len(p.queue) - 1
				for i > 0 && !p.tryTake(p.queue[i]) {
					i--
				}
				if i == 0 {
					break
				}
			}
		}
		b.wg.Wait()
		if v := b.panicked; v != nil {
			b.panicked = nil
			panic(v)
		}
		for i := range b.jobs {
			j := &b.jobs[i]
			p.ready = append(p.ready, out[pos:j.outAt]...)
			pos = j.outAt
			p.settleJob(b, j)
			if len(p.ready) >= 32<<10 {
				p.write()
			}
		}
		copy(p.queue, p.queue[1:])
		p.queue[len(p.queue)-1] = nil
		p.queue = p.queue[:len(p.queue)-1]
		p.recycle(b)
		count--
	}
	if pos == 0 {
		return
	}
	*p.out = out[:copy(out, out[pos:])]
	for _, b := range p.queue {
		for i := range b.jobs {
			b.jobs[i].outAt -= pos
		}
	}
	if b := p.cur; b != nil {
		for i := range b.jobs {
			b.jobs[i].outAt -= pos
		}
	}
}

// finished reports whether b's scan is done (on the caller's side).
func (b *batch) finished() bool {
	s := b.state.Load()
	return s == bDone || s == bCaller
}

// tryTake scans b on the caller if no worker has started it.
func (p *pipe) tryTake(b *batch) bool {
	if !b.state.CompareAndSwap(bQueued, bCaller) {
		return false
	}
	b.scan(&p.views)
	b.wg.Done()
	return true
}

// settleJob redacts one segment's matches into p.ready.
func (p *pipe) settleJob(b *batch, j *pjob) {
	ms := append(p.ms[:0], b.wms[j.k0:j.k1]...)
	ms = append(ms, b.rms[j.m0:j.m1]...)
	g := segment{e: p.e, pol: p.pol, rep: p.rep, where: j.where, ph: j.ph, out: &p.ready, redactedTo: -1,
		dec: b.dec[j.d0 : j.d0+j.n : j.d0+j.n], mapped: j.mapped, spans: p.spans}
	if j.mapped {
		g.raw, g.esc = b.raw[j.r0:j.r1:j.r1], b.esc[j.e0:j.e1:j.e1]
	}
	g.settle(ms, j.hold, true)
	p.ms, p.spans = ms[:0], g.spans[:0]
}

func (p *pipe) recycle(b *batch) {
	if cap(b.dec) > 1<<20 || cap(b.raw) > 4<<20 || cap(b.esc) > maxScratch || cap(b.rms) > maxScratch || cap(b.wms) > maxScratch {
		return
	}
	p.free = append(p.free, b)
}

// write writes the settled output (which comes before *p.out).
func (p *pipe) write() {
	if len(p.ready) > 0 && p.err == nil {
		_, p.err = p.dst.Write(p.ready)
	}
	p.ready = p.ready[:0]
}

// flush settles and writes what is back; it reports whether *p.out may be
// written too (nothing is pending before its end).
func (p *pipe) flush() (bool, error) {
	if p.busy() {
		p.settle(-1)
	}
	p.write()
	return !p.busy(), p.err
}

// drain settles and writes everything pending: what is left in *p.out
// comes after it.
func (p *pipe) drain() {
	if !p.busy() {
		return
	}
	if p.cur != nil {
		p.submit(false)
	}
	p.settle(len(p.queue))
	p.write()
}

// testPipeBatches counts the batches queued (tests check that a body
// went through the pipeline).
var testPipeBatches atomic.Int64
