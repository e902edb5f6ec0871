// Package progress tells a user how a download run goes: the Progress
// interface the fetchers report to (Alpine packages in image/alpine, agent
// tarballs in agents), a Reader that reports every byte read, Nop, and a
// text renderer (one redrawn bar on a terminal, one line a file elsewhere).
//
// It is a leaf shared by both fetchers (it imports nothing of the project)
// so the contract and the counting reader are written once. It does not
// download, retry or verify anything, and it writes only to the writer it
// is given.
package progress

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress is told about a download run. Its methods may be called from
// several goroutines at once (image/alpine fetches in parallel).
type Progress interface {
	// Begin announces the run: how many files, how many bytes.
	Begin(files int, bytes int64)
	// Advance reports n more bytes of a file (negative when a download
	// restarts from zero); a cached file counts with its full size.
	Advance(file string, n int64)
	// End reports a file done, err nil on success.
	End(file string, err error)
	// Close ends the run.
	Close()
}

// Nop is a Progress that reports nothing.
type Nop struct{}

func (Nop) Begin(int, int64)      {}
func (Nop) Advance(string, int64) {}
func (Nop) End(string, error)     {}
func (Nop) Close()                {}

// Reader returns r, reporting every byte read from it to p as an Advance
// of file.
func Reader(r io.Reader, file string, p Progress) io.Reader {
	return &reader{r: r, name: file, pr: p}
}

type reader struct {
	r    io.Reader
	name string
	pr   Progress
}

func (p *reader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.pr.Advance(p.name, int64(n))
	}
	return n, err
}

// NewText renders progress to w: on a terminal (tty) one redrawn line
// with a bar, bytes, rate and ETA; otherwise one plain line per file and
// a summary.
func NewText(w io.Writer, tty bool) Progress {
	return &textProgress{w: w, tty: tty, now: time.Now}
}

type textProgress struct {
	mu          sync.Mutex
	w           io.Writer
	tty         bool
	now         func() time.Time
	start, last time.Time
	files, done int
	total, got  int64
}

func (t *textProgress) Begin(files int, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.files, t.total, t.start = files, bytes, t.now()
}

func (t *textProgress) Advance(_ string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.got += n
	if t.tty && t.now().Sub(t.last) >= 100*time.Millisecond {
		t.last = t.now()
		t.draw()
	}
}

func (t *textProgress) End(file string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done++
	switch {
	case t.tty:
		t.draw()
	case err != nil:
		fmt.Fprintf(t.w, "failed %s: %v\n", file, err)
	default:
		fmt.Fprintf(t.w, "[%d/%d] %s\n", t.done, t.files, file)
	}
}

func (t *textProgress) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tty {
		t.draw()
		fmt.Fprintln(t.w)
	}
	fmt.Fprintf(t.w, "%d packages, %s in %s\n", t.done, human(t.got), t.now().Sub(t.start).Round(time.Millisecond))
}

// draw writes the bar line; t.mu is held.
func (t *textProgress) draw() {
	const width = 30
	frac := 0.0
	if t.total > 0 {
		frac = float64(t.got) / float64(t.total)
	}
	frac = min(max(frac, 0), 1)
	fill := int(frac * width)
	el := t.now().Sub(t.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(t.got) / el
	}
	eta := "--:--"
	if rate > 0 && t.total >= t.got {
		s := int(float64(t.total-t.got) / rate)
		eta = fmt.Sprintf("%d:%02d", s/60, s%60)
	}
	fmt.Fprintf(t.w, "\r[%s%s] %d/%d  %s/%s  %s/s  ETA %s ",
		strings.Repeat("=", fill), strings.Repeat(" ", width-fill), t.done, t.files,
		human(t.got), human(t.total), human(int64(rate)), eta)
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
