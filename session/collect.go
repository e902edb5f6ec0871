package session

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/overlay"
)

// maxCollectFile is the largest file whose content is collected; larger
// ones are reported as not carried (overlay.BuildOptions.MaxFileSize's
// default, which the patch builder applies).
const maxCollectFile = 256 << 20

// guestExec runs a command in the guest (guestlink.Client does).
type guestExec interface {
	Exec(ctx context.Context, cmd string, o guestlink.ExecOptions) (guestlink.ExitStatus, error)
}

// collectLimits bound what the host accepts from the guest's collection
// stream, and how long it waits for it.
type collectLimits struct {
	// MaxFile is the largest file whose content is asked for.
	MaxFile int64
	// MaxTotal bounds the sum of the sizes of the files asked for: the
	// scratch disk's size, which holds them all in the guest.
	MaxTotal int64
	// Idle is how long the host waits, while it has nothing to read, for
	// the guest's next byte (of the stream, or of the heartbeat the
	// collector writes on standard error while it works) before it gives
	// up with ErrCollectStalled. Zero means defaultCollectIdle. Time the
	// host spends building the patch does not count.
	Idle time.Duration
	// SpoolDir holds the spool file of the bodies read (the session
	// folder); "" is the temporary folder.
	SpoolDir string
}

// collectGCPercent is the garbage collector's GOGC while collecting (see
// BenchmarkCollectMillion).
const collectGCPercent = 25

// defaultCollectIdle is collectLimits.Idle's default: a guest that sent
// nothing, not even a heartbeat, for this long is stuck.
const defaultCollectIdle = 2 * time.Minute

// Errors that end a collection before its end; the scratch disk is kept.
var (
	// ErrCollectStalled: the guest sent nothing for collectLimits.Idle.
	ErrCollectStalled = errors.New("the guest stopped sending the changes")
	// ErrCollectAborted: the user aborted the collection (a second Ctrl-C).
	ErrCollectAborted = errors.New("collection aborted")
)

// collect runs proto.CollectCommand in the guest and reads its stream: the
// change set, validated, is handed with a Source of the files' content to
// build, which must read what it needs and return; then collect checks that
// the stream ended as announced and the command succeeded. The Source is an
// overlay.VerifiedSource: build must not put a patch in place before its
// Verify returned nil (overlay.WriteSessionPatch does so). Everything from
// the guest is bounded and checked before use (see streamSource); nothing
// is written here, only by build. A cancel of ctx with a cause (see
// context.WithCancelCause) ends the collection with that cause.
func collect(ctx context.Context, g guestExec, lim collectLimits, build func(*overlay.ChangeSet, overlay.Source) error) error {
	if lim.Idle <= 0 {
		lim.Idle = defaultCollectIdle
	}
	// A change set of up to a million entries is decoded, checked and
	// turned into a patch here, all of it garbage soon after: collect the
	// garbage early rather than let the heap grow to twice what is live.
	defer debug.SetGCPercent(debug.SetGCPercent(collectGCPercent))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pr, pw := io.Pipe()
	wd := newWatchdog(lim.Idle, func() {
		cancel(fmt.Errorf("%w: nothing came for %s", ErrCollectStalled, lim.Idle))
	})
	defer wd.stop()
	errOut := &heartbeatBuffer{limitedBuffer: limitedBuffer{buf: &bytes.Buffer{}, max: 64 << 10}, wd: wd}
	type result struct {
		st  guestlink.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := g.Exec(ctx, proto.CollectCommand+" "+strconv.FormatInt(lim.MaxFile, 10), guestlink.ExecOptions{Stdout: pw, Stderr: errOut})
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
		done <- result{st, err}
	}()
	go func() {
		// A stalled or aborted collection must not wait for a guest that
		// does not answer: the reader gives up at once.
		<-ctx.Done()
		if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
			pr.CloseWithError(c)
		}
	}()
	err := readCollection(&watchedReader{r: pr, wd: wd}, lim, build)
	if err != nil {
		// Stop the guest's writer; its status says more when it failed first.
		pr.CloseWithError(err)
		cancel(nil)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		// The guest does not even answer the channel's end.
		r.err = context.Cause(ctx)
	}
	if c := context.Cause(ctx); c != nil && (errors.Is(c, ErrCollectStalled) || errors.Is(c, ErrCollectAborted)) {
		if err == nil {
			// The stream was whole and verified (the patch is in place);
			// only the command's end did not come.
			return nil
		}
		return c
	}
	if errors.Is(r.err, io.EOF) && !r.st.Success() {
		// The command ran and failed: its own words come first.
		gerr := fmt.Errorf("the guest could not collect the changes (%s): %s", r.st, sanitizeLine(errOut.text()))
		if err != nil {
			// One line: the guest's words, then what the host saw.
			return fmt.Errorf("%w (then: %w)", gerr, err)
		}
		return gerr
	}
	if err != nil {
		return err
	}
	if !errors.Is(r.err, io.EOF) {
		return fmt.Errorf("collect the changes: %w", r.err)
	}
	return nil
}

// watchdog calls fire once when the host has waited for the guest (see
// watchedReader) for idle with nothing coming, stream or heartbeat.
type watchdog struct {
	mu      sync.Mutex
	waiting bool
	last    time.Time
	idle    time.Duration
	fire    func()
	done    chan struct{}
	once    sync.Once
}

func newWatchdog(idle time.Duration, fire func()) *watchdog {
	w := &watchdog{idle: idle, fire: fire, last: time.Now(), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *watchdog) run() {
	t := time.NewTicker(max(w.idle/8, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case now := <-t.C:
			w.mu.Lock()
			stalled := w.waiting && now.Sub(w.last) >= w.idle
			w.mu.Unlock()
			if stalled {
				w.fire()
				return
			}
		}
	}
}

// activity records progress; waiting says whether the host now waits for
// the guest.
func (w *watchdog) activity(waiting bool) {
	w.mu.Lock()
	w.last, w.waiting = time.Now(), waiting
	w.mu.Unlock()
}

// beat records progress without changing whether the host waits.
func (w *watchdog) beat() {
	w.mu.Lock()
	w.last = time.Now()
	w.mu.Unlock()
}

func (w *watchdog) stop() { w.once.Do(func() { close(w.done) }) }

// watchedReader tells the watchdog when the host waits for the stream.
type watchedReader struct {
	r  io.Reader
	wd *watchdog
}

func (r *watchedReader) Read(p []byte) (int, error) {
	r.wd.activity(true)
	n, err := r.r.Read(p)
	r.wd.activity(false)
	return n, err
}

// heartbeatBuffer is the collector's standard error: every write is a sign
// of life for the watchdog; the heartbeat bytes (NUL) are not kept.
type heartbeatBuffer struct {
	limitedBuffer
	wd *watchdog
	mu sync.Mutex
}

func (h *heartbeatBuffer) Write(p []byte) (int, error) {
	h.wd.beat()
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.limitedBuffer.Write(bytes.ReplaceAll(p, []byte{0}, nil)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (h *heartbeatBuffer) text() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.buf.String()
}

// readCollection reads one collection stream from r (see collect).
func readCollection(r io.Reader, lim collectLimits, build func(*overlay.ChangeSet, overlay.Source) error) error {
	cr, err := proto.NewCollectReader(r, proto.CollectLimits{MaxPath: overlay.MaxPathLen, MaxChangeSet: maxChangeSet, MaxFile: lim.MaxFile})
	if err != nil {
		return err
	}
	f, err := cr.Next()
	if err != nil {
		return err
	}
	if f.Kind != proto.FrameChangeSet {
		return fmt.Errorf("%w: the first frame is not the change set", proto.ErrCollectStream)
	}
	// The change set goes to the spool first (the file bodies follow it
	// there), counting its entries on the way, then is decoded from there
	// into a slice of the right size: growing one by appending would hold
	// twice a million entries for a moment.
	spool, err := os.CreateTemp(lim.SpoolDir, ".collect-spool-*")
	if err != nil {
		return fmt.Errorf("make the collection spool: %w", err)
	}
	os.Remove(spool.Name())
	defer spool.Close()
	var counter entryCounter
	n, err := io.Copy(io.MultiWriter(spool, &counter), cr.Body())
	if err != nil {
		return err
	}
	cs, err := decodeChangeSet(io.NewSectionReader(spool, 0, n), counter.entries)
	if err != nil {
		return err
	}
	// The builder may ask for a file again (it drops content past its
	// memory bound and re-reads it when writing the patch): bodies read once
	// are kept in the spool too, after the change set, at most the scratch
	// disk's size in all.
	src := &streamSource{cr: cr, want: make(map[string]*overlay.Change), spool: spool, spoolSize: n, spooled: map[string][2]int64{}}
	var total int64
	for i := range cs.Changes {
		c := &cs.Changes[i]
		if c.Type != overlay.TypeFile || (c.Op != overlay.OpAdd && c.Op != overlay.OpModify) || c.Size > lim.MaxFile {
			continue
		}
		if total += c.Size; total > lim.MaxTotal {
			return fmt.Errorf("%w: the changed files add up to more than the %d bytes of the scratch disk", overlay.ErrInvalidChangeSet, lim.MaxTotal)
		}
		src.want[c.Path] = c
	}
	if err := build(cs, src); err != nil {
		return err
	}
	return src.Verify()
}

// decodeChangeSet decodes the change set frame's body as
// overlay.ParseChangeSet does (unknown fields and trailing data refused,
// at most overlay.MaxChanges entries, then Validate), straight from the
// stream and one entry at a time: neither the JSON (tens of MB for a
// million entries) nor a copy of it is held while decoding. hint, when
// positive, is the number of entries expected (the slice is made that big
// once rather than grown).
func decodeChangeSet(body io.Reader, hint int) (*overlay.ChangeSet, error) {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	fail := func(err error) (*overlay.ChangeSet, error) {
		if errors.Is(err, proto.ErrCollectStream) || errors.Is(err, overlay.ErrInvalidChangeSet) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: decode: %v", overlay.ErrInvalidChangeSet, err)
	}
	var cs overlay.ChangeSet
	if err := expectDelim(dec, '{'); err != nil {
		return fail(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fail(err)
		}
		switch tok {
		case "version":
			if err := dec.Decode(&cs.Version); err != nil {
				return fail(err)
			}
		case "changes":
			tok, err := dec.Token()
			if err != nil {
				return fail(err)
			}
			if tok == nil { // null: no changes
				continue
			}
			if tok != json.Delim('[') {
				return fail(fmt.Errorf("changes: want [, found %v", tok))
			}
			if hint > 0 {
				cs.Changes = make([]overlay.Change, 0, min(hint, overlay.MaxChanges))
			}
			for dec.More() {
				if len(cs.Changes) >= overlay.MaxChanges {
					return fail(fmt.Errorf("%w: more than the %d entries allowed", overlay.ErrInvalidChangeSet, overlay.MaxChanges))
				}
				var c overlay.Change
				if err := dec.Decode(&c); err != nil {
					return fail(err)
				}
				cs.Changes = append(cs.Changes, c)
			}
			if err := expectDelim(dec, ']'); err != nil {
				return fail(err)
			}
		default:
			return fail(fmt.Errorf("unknown field %v", tok))
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return fail(err)
	}
	// The rest of the body (white space at most) and its hash.
	rest := io.MultiReader(dec.Buffered(), body)
	buf := make([]byte, 32<<10)
	for {
		n, err := rest.Read(buf)
		if len(bytes.TrimSpace(buf[:n])) > 0 {
			return nil, fmt.Errorf("%w: trailing data after the JSON object", overlay.ErrInvalidChangeSet)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if err := cs.Validate(); err != nil {
		return nil, err
	}
	return &cs, nil
}

// entryCounter counts the objects two levels into a JSON document (the
// entries of the change set's "changes" array), for decodeChangeSet's
// hint. It is a hint only: a hostile document miscounts, nothing more.
type entryCounter struct {
	depth   int
	inStr   bool
	escaped bool
	entries int
}

func (c *entryCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		switch {
		case c.inStr:
			switch {
			case c.escaped:
				c.escaped = false
			case b == '\\':
				c.escaped = true
			case b == '"':
				c.inStr = false
			}
		case b == '"':
			c.inStr = true
		case b == '{' || b == '[':
			c.depth++
			if b == '{' && c.depth == 3 {
				c.entries++
			}
		case b == '}' || b == ']':
			c.depth--
		}
	}
	return len(p), nil
}

// expectDelim reads the next token, which must be d.
func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != d {
		return fmt.Errorf("want %v, found %v", d, tok)
	}
	return nil
}

// streamSource hands the patch builder the files of a collection stream. It
// reads the stream forward only: the builder asks for paths in the change
// set's order, which is the stream's. A frame is accepted only for a path
// the change set lists as an added or modified file within the limits, in
// strictly increasing order (no duplicates), with the listed size (checked
// before its body is read) and, at its end, the listed SHA-256 as well as
// its own trailer's. Frames the builder does not ask for are read and
// checked, then dropped.
type streamSource struct {
	cr    *proto.CollectReader
	want  map[string]*overlay.Change
	cur   *proto.Frame // read but not yet consumed
	last  string       // path of the last file frame
	files int64        // file frames seen
	ended bool
	end   int64 // the end frame's count
	// verified: the stream's end was read and checked.
	verified bool
	// spool keeps each body the builder read whole, so it can ask again;
	// spooled maps a path to its offset and size there.
	spool     *os.File
	spoolSize int64
	spooled   map[string][2]int64
}

var _ overlay.VerifiedSource = (*streamSource)(nil)

// next reads the next frame header and checks it; at the end frame it
// returns nil.
func (s *streamSource) next() (*proto.Frame, error) {
	if s.ended {
		return nil, nil
	}
	f, err := s.cr.Next()
	if err != nil {
		return nil, err
	}
	switch f.Kind {
	case proto.FrameEnd:
		var b [8]byte
		if _, err := io.ReadFull(s.cr.Body(), b[:]); err != nil {
			return nil, err
		}
		if _, err := io.Copy(io.Discard, s.cr.Body()); err != nil {
			return nil, err
		}
		s.ended, s.end = true, int64(binary.BigEndian.Uint64(b[:]))
		return nil, nil
	case proto.FrameFile:
	default:
		return nil, fmt.Errorf("%w: a frame of kind %q among the files", proto.ErrCollectStream, f.Kind)
	}
	if err := overlay.ValidatePath(f.Path); err != nil {
		return nil, fmt.Errorf("%w: %v", proto.ErrCollectStream, err)
	}
	if s.files > 0 && f.Path <= s.last {
		return nil, fmt.Errorf("%w: %s sent out of order or twice", proto.ErrCollectStream, overlay.DisplayPath(f.Path))
	}
	c := s.want[f.Path]
	if c == nil {
		return nil, fmt.Errorf("%w: %s was sent but is not a changed file of the change set", proto.ErrCollectStream, overlay.DisplayPath(f.Path))
	}
	if f.Size != c.Size {
		return nil, fmt.Errorf("%w: %s sent as %d bytes, listed as %d", proto.ErrCollectStream, overlay.DisplayPath(f.Path), f.Size, c.Size)
	}
	s.last = f.Path
	s.files++
	return &f, nil
}

// Open returns the content of path from the stream.
func (s *streamSource) Open(path string) (io.ReadCloser, error) {
	c := s.want[path]
	if c == nil {
		return nil, fmt.Errorf("%s is not a changed file the guest sends", overlay.DisplayPath(path))
	}
	if at, ok := s.spooled[path]; ok {
		// Read again: the builder checks size and hash once more.
		return io.NopCloser(io.NewSectionReader(s.spool, at[0], at[1])), nil
	}
	for {
		if s.cur == nil {
			f, err := s.next()
			if err != nil {
				return nil, err
			}
			if f == nil {
				return nil, fmt.Errorf("%w: the guest did not send %s", proto.ErrCollectStream, overlay.DisplayPath(path))
			}
			s.cur = f
		}
		switch {
		case s.cur.Path < path:
			s.cur = nil // Next skips its body
			continue
		case s.cur.Path > path:
			return nil, fmt.Errorf("%w: the guest did not send %s", proto.ErrCollectStream, overlay.DisplayPath(path))
		}
		s.cur = nil
		return &fileBody{b: s.cr.Body(), c: c, s: s, at: s.spoolSize}, nil
	}
}

// Verify reads the rest of the stream to its end frame, checking every
// frame, and checks the count and that nothing follows. Once it returned
// nil it does so again.
func (s *streamSource) Verify() error {
	if s.verified {
		return nil
	}
	s.cur = nil
	for !s.ended {
		if _, err := s.next(); err != nil {
			return err
		}
	}
	if s.end != s.files {
		return fmt.Errorf("%w: the end frame counts %d files, %d were sent", proto.ErrCollectStream, s.end, s.files)
	}
	if err := s.cr.End(); err != nil {
		return err
	}
	s.verified = true
	return nil
}

// fileBody is one file's content; at its end it checks the change set's
// hash besides the frame's own.
type fileBody struct {
	b  *proto.FrameBody
	c  *overlay.Change
	s  *streamSource
	at int64 // where the body starts in the spool
	n  int64 // bytes spooled so far
}

func (f *fileBody) Read(p []byte) (int, error) {
	n, err := f.b.Read(p)
	if n > 0 {
		if _, werr := f.s.spool.WriteAt(p[:n], f.at+f.n); werr != nil {
			return n, fmt.Errorf("spool %s: %w", overlay.DisplayPath(f.c.Path), werr)
		}
		f.n += int64(n)
	}
	if err == io.EOF {
		if sum := f.b.Sum(); hex.EncodeToString(sum[:]) != f.c.SHA256 {
			return n, fmt.Errorf("%w: %s: the content sent does not match the change set's SHA-256", overlay.ErrContentMismatch, overlay.DisplayPath(f.c.Path))
		}
		if f.n == f.c.Size {
			f.s.spooled[f.c.Path] = [2]int64{f.at, f.n}
			f.s.spoolSize = f.at + f.n
		}
	}
	return n, err
}

// Close leaves the rest of the body to the next frame read, which checks it.
func (f *fileBody) Close() error { return nil }
