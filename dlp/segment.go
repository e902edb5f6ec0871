package dlp

import (
	"runtime"
	"slices"
	"sort"
	"sync"
)

// phCtx says how a placeholder is written into the raw output.
type phCtx uint8

const (
	// phPlain writes [REDACTED:CAT].
	phPlain phCtx = iota
	// phJSONValue writes "[REDACTED:CAT]": a redaction outside a JSON
	// string (a card number written as a number) becomes a string.
	phJSONValue
	// phURL writes the placeholder percent-encoded.
	phURL
)

func appendPlaceholder(out []byte, c Category, ctx phCtx) []byte {
	switch ctx {
	case phJSONValue:
		out = append(out, `"[REDACTED:`...)
		out = append(out, c.String()...)
		return append(out, `]"`...)
	case phURL:
		out = append(out, "%5BREDACTED%3A"...)
		out = append(out, c.String()...)
		return append(out, "%5D"...)
	}
	out = append(out, "[REDACTED:"...)
	out = append(out, c.String()...)
	return append(out, ']')
}

// escape records that decoded bytes dec[d:d+dl] came from raw[r:r+rl].
type escape struct {
	d, r, dl, rl int32
}

// lookbehind is how many emitted decoded bytes a segment keeps as context
// for the next window's boundary checks.
const lookbehind = 64

// segment scrubs one run of text that matches never cross: a whole plain
// body, one JSON string, one form value, one header. Its input is decoded
// text, fed in pieces, each either identical to its raw form or an escape
// (decoded bytes standing for different raw bytes). Its output is the raw
// text with each redacted span replaced by a placeholder; raw bytes of
// untouched spans are copied unchanged. It holds at most a window of text
// plus the engine's holdBack.
type segment struct {
	e     *Engine
	pol   *Policy
	rep   *Report
	where string
	ph    phCtx
	// keyed: the segment is the value of a secret-named key; a secret-like
	// whole value is redacted as a password.
	keyed bool

	dec  []byte // decoded text; dec[:look] is emitted context
	look int
	// raw holds the raw bytes of dec[look:] when mapped; otherwise raw is
	// dec[look:] itself.
	raw    []byte
	mapped bool
	esc    []escape
	// pemOpen: a private-key block is being redacted across windows.
	pemOpen bool
	out     *[]byte
	// redactedTo is where the last redaction ended (in dec), -1 if it is
	// not in the window: a redaction continuing it (a private key across
	// windows) adds no second placeholder.
	redactedTo int
	ms         []match
	rms        []match // the recognizers' matches while ms takes known ones
	spans      []match
	wg         sync.WaitGroup
	panicked   any
	views      *viewSet
	total      int // decoded bytes fed since reset
	// pp is the body's pipeline (nil outside a layer): whole segments
	// are scanned there and settled in order.
	pp *pipe
}

func (g *segment) reset(where string, ph phCtx, keyed bool) {
	g.where, g.ph, g.keyed = where, ph, keyed
	g.dec, g.raw, g.esc = g.dec[:0], g.raw[:0], g.esc[:0]
	g.look, g.mapped, g.pemOpen, g.total = 0, false, false, 0
	g.redactedTo = -1
}

func (g *segment) pending() int { return len(g.dec) - g.look }

// write feeds text whose raw form is the same bytes.
func (g *segment) write(p []byte) {
	for len(p) > 0 {
		room := g.e.window - g.pending()
		if room <= 0 {
			g.process(false)
			continue
		}
		k := min(room, len(p))
		g.dec = append(g.dec, p[:k]...)
		if g.mapped {
			g.raw = append(g.raw, p[:k]...)
		}
		g.total += k
		p = p[k:]
	}
}

// writeEsc feeds decoded bytes d that stand for the raw bytes r.
func (g *segment) writeEsc(d, r []byte) {
	if g.pending() >= g.e.window {
		g.process(false)
	}
	if !g.mapped {
		if g.raw == nil {
			g.raw = getBuf()
		}
		g.raw = append(g.raw[:0], g.dec[g.look:]...)
		g.mapped = true
	}
	g.esc = append(g.esc, escape{d: int32(len(g.dec)), r: int32(len(g.raw)), dl: int32(len(d)), rl: int32(len(r))})
	g.dec = append(g.dec, d...)
	g.raw = append(g.raw, r...)
	g.total += len(d)
}

// writeEsc1 is writeEsc for one decoded byte (a JSON short escape).
func (g *segment) writeEsc1(d byte, r []byte) {
	if g.pending() >= g.e.window || !g.mapped {
		g.writeEsc([]byte{d}, r)
		return
	}
	g.esc = append(g.esc, escape{d: int32(len(g.dec)), r: int32(len(g.raw)), dl: 1, rl: int32(len(r))})
	g.dec = append(g.dec, d)
	g.raw = append(g.raw, r...)
	g.total++
}

// finish scrubs and emits everything pending; the segment ends.
func (g *segment) finish() {
	g.process(true)
}

// rawPos maps decoded position d (look <= d <= len(dec)) to a raw offset.
// A position inside an escape snaps to its start, or to its end when
// isEnd; the snapped decoded position is returned too.
func (g *segment) rawPos(d int, isEnd bool) (int, int) {
	if !g.mapped {
		return d - g.look, d
	}
	i := sort.Search(len(g.esc), func(i int) bool { return int(g.esc[i].d) > d }) - 1
	if i < 0 {
		return d - g.look, d
	}
	e := g.esc[i]
	ed, er, edl, erl := int(e.d), int(e.r), int(e.dl), int(e.rl)
	switch {
	case d == ed:
		return er, d
	case d < ed+edl && isEnd:
		return er + erl, ed + edl
	case d < ed+edl:
		return er, ed
	}
	return er + erl + (d - ed - edl), d
}

func (g *segment) emitRaw(a, b int) {
	if a >= b {
		return
	}
	if g.mapped {
		*g.out = append(*g.out, g.raw[a:b]...)
	} else {
		*g.out = append(*g.out, g.dec[g.look+a:g.look+b]...)
	}
}

// process scans the pending text, emits what is settled and keeps the
// rest (everything, when final).
func (g *segment) process(final bool) {
	e, pol := g.e, g.pol
	n := len(g.dec)
	if n == g.look && !final {
		return
	}
	if g.pp != nil {
		if final && g.look == 0 && g.pp.take(g) {
			return // scanned in the pipeline, settled in order later
		}
		// A window of a long segment: what the pipeline holds settles
		// first.
		g.pp.drain()
	}
	sc := scanner{e: e, pol: pol, buf: g.dec, from: g.look, n: n, final: final, hold: n, pemOpen: &g.pemOpen, out: g.ms[:0],
		full: n-g.look >= e.window}
	if pol.active(CatSecret) {
		if g.views == nil {
			g.views = &viewSet{}
		}
		if n-g.look >= parallelMin && handOff(g, n) {
			// Known values (and their views) on another core while
			// this one runs the recognizers: the two read the window
			// only and take about the same time. Known matches come
			// first, as when run in turn, so the result is the same.
			sc.out = g.rms[:0]
			sc.run()
			g.wg.Wait()
			if p := g.panicked; p != nil {
				// Where the caller can recover it, as if run here.
				g.panicked = nil
				panic(p)
			}
			g.rms = sc.out
			sc.out = append(g.ms, sc.out...)
		} else {
			g.ms = g.ms[:0]
			g.scanKnown(n)
			sc.out = g.ms
			sc.run()
		}
	} else {
		sc.run()
	}
	if final && g.keyed && g.look == 0 && pol.active(CatPassword) && secretValue(g.dec[:n]) {
		sc.add(0, n, CatPassword)
	}
	g.ms = sc.out[:0]
	g.settle(sc.out, sc.hold, final)
}

// settle redacts the matches ms of the scanned window dec[look:] (hold:
// the scan's earliest position not to emit yet), emits what is settled
// to *g.out and keeps the rest (nothing, when final).
func (g *segment) settle(ms []match, hold int, final bool) {
	e, pol := g.e, g.pol
	n := len(g.dec)
	cut := n
	if !final {
		cut = max(g.look, n-e.holdBack)
	}
	cut = min(cut, hold)
	slices.SortFunc(ms, func(a, b match) int {
		if a.start != b.start {
			return int(a.start - b.start)
		}
		return int(b.end - a.end)
	})

	// Settle the matches that start before the cut; a redaction carries
	// the emit point to its end.
	emitTo := cut
	spans := g.spans[:0]
	var logged []match
	for _, m := range ms {
		if int(m.start) >= emitTo {
			break
		}
		a := pol.act[m.cat]
		if a == Pass {
			continue
		}
		if v := g.valueOf(m); e.allowedValue(v) || (m.cat != CatSecret && placeholderValue(m.cat, v)) {
			continue
		}
		if a == Log {
			if !m.cont && !slices.ContainsFunc(logged, func(o match) bool { return o.start == m.start && o.end == m.end }) {
				logged = append(logged, m)
			}
			continue
		}
		emitTo = max(emitTo, int(m.end))
		if k := len(spans); k > 0 && m.start < spans[k-1].end {
			last := &spans[k-1]
			last.end = max(last.end, m.end)
			last.cont = last.cont || (m.cont && m.start == last.start)
			if m.cat < last.cat {
				last.cat, last.secret, last.form = m.cat, m.secret, m.form
			}
			continue
		}
		spans = append(spans, m)
	}
	g.spans = spans[:0]
	for _, m := range logged {
		f := newFinding(m.cat, Log, g.where, g.valueOf(m))
		g.describe(&f, m)
		g.rep.add(f)
	}

	rp := 0
	for _, s := range spans {
		rs, _ := g.rawPos(int(s.start), false)
		re, _ := g.rawPos(int(s.end), true)
		g.emitRaw(rp, rs)
		rp = max(rp, re)
		cont := s.cont && int(s.start) == g.redactedTo && rs == 0
		g.redactedTo = int(s.end)
		if cont {
			continue // the rest of the previous window's redaction
		}
		*g.out = appendPlaceholder(*g.out, s.cat, g.ph)
		f := newFinding(s.cat, Redact, g.where, g.valueOf(s))
		g.describe(&f, s)
		g.rep.add(f)
	}
	endRaw, emitted := g.rawPos(emitTo, true)
	g.emitRaw(rp, endRaw)

	if final {
		g.dec, g.raw, g.esc = g.dec[:0], g.raw[:0], g.esc[:0]
		g.look, g.mapped = 0, false
		return
	}
	// Keep a little emitted context and the unsettled rest.
	keep := max(0, emitted-lookbehind)
	if g.mapped {
		g.raw = append(g.raw[:0], g.raw[endRaw:]...)
		k := 0
		for _, x := range g.esc {
			if int(x.d) >= emitted {
				x.d -= int32(keep)
				x.r -= int32(endRaw)
				g.esc[k] = x
				k++
			}
		}
		g.esc = g.esc[:k]
		if k == 0 {
			g.mapped = false
			g.raw = g.raw[:0]
		}
	}
	g.dec = append(g.dec[:0], g.dec[keep:]...)
	g.look = emitted - keep
	if g.redactedTo -= keep; g.redactedTo < g.look {
		g.redactedTo = -1
	}
}

// parallelMin is the smallest window whose known values are searched on
// another goroutine (handing over costs a few microseconds).
const parallelMin = 32 << 10

// knownJob is a window whose known values a worker searches.
type knownJob struct {
	g *segment
	n int
}

// knownWorkers are goroutines, one per core but one, that search known
// values while the caller runs the recognizers: a window's (known) or a
// pipeline's batch (batches). They live as long as the process (a few
// idle goroutines); a job is handed over without allocating.
var knownWorkers = sync.OnceValue(func() workers {
	w := workers{known: make(chan knownJob)}
	if runtime.GOMAXPROCS(0) > 1 {
		w.batches = make(chan *batch, 16) // nil: nobody to hand batches to
	}
	for range runtime.GOMAXPROCS(0) - 1 {
		go func() {
			var views viewSet
			for {
				select {
				case j := <-w.known:
					j.g.runKnown(j.n)
				case b := <-w.batches:
					b.work(&views)
				}
			}
		}()
	}
	return w
})

type workers struct {
	known   chan knownJob
	batches chan *batch
}

// handOff gives g's known-value search to an idle worker, or reports
// false when none is idle (many bodies at once keep every core busy: the
// caller searches itself).
func handOff(g *segment, n int) bool {
	g.wg.Add(1)
	select {
	case knownWorkers().known <- knownJob{g, n}:
		return true
	default:
		g.wg.Done()
		return false
	}
}

// runKnown is scanKnown on a worker: a panic is kept for the caller.
func (g *segment) runKnown(n int) {
	defer g.wg.Done()
	defer func() { g.panicked = recover() }()
	g.scanKnown(n)
}

// scanKnown finds the known values (raw and in views) in dec[look:n] and
// puts them in g.ms.
func (g *segment) scanKnown(n int) {
	k := g.e.known
	ms := k.scan(g.dec, g.look, n, g.ms[:0])
	g.ms = k.scanViews(g.dec, g.look, n, ms, g.views)
}

// valueOf is what a match stands for: a known secret's plaintext, else
// the decoded text.
func (g *segment) valueOf(m match) string {
	if m.cat == CatSecret && m.secret >= 0 {
		return g.e.known.secrets[m.secret].Value
	}
	return string(g.dec[m.start:m.end])
}

func (g *segment) describe(f *Finding, m match) {
	if m.cat == CatSecret && m.secret >= 0 {
		f.Form = m.form.String()
		f.Source = g.e.known.secrets[m.secret].Source
	}
}
