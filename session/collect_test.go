package session

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/overlay"
)

// fakeGuest plays a hostile guest: it writes stream to the collect
// command's stdout and exits with code, after writing stderr.
type fakeGuest struct {
	stream []byte
	code   int
	stderr string
	cmd    string
}

func (g *fakeGuest) Exec(ctx context.Context, cmd string, o guestlink.ExecOptions) (guestlink.ExitStatus, error) {
	g.cmd = cmd
	if _, err := o.Stdout.Write(g.stream); err != nil {
		return guestlink.ExitStatus{}, ctx.Err()
	}
	io.WriteString(o.Stderr, g.stderr)
	return guestlink.ExitStatus{Code: g.code}, nil
}

// stream builds a collection stream frame by frame, correct unless told
// otherwise.
type stream struct{ bytes.Buffer }

func newStream() *stream {
	s := &stream{}
	s.WriteString(proto.CollectMagic)
	return s
}

func (s *stream) frame(kind byte, path string, size int64, body []byte, sum []byte) *stream {
	s.WriteByte(kind)
	binary.Write(s, binary.BigEndian, uint16(len(path)))
	s.WriteString(path)
	binary.Write(s, binary.BigEndian, uint64(size))
	s.Write(body)
	if sum == nil {
		h := sha256.Sum256(body)
		sum = h[:]
	}
	s.Write(sum)
	return s
}

func (s *stream) changeSet(cs *overlay.ChangeSet) *stream {
	data, _ := json.Marshal(cs)
	return s.frame(proto.FrameChangeSet, "", int64(len(data)), data, nil)
}

func (s *stream) file(path string, body []byte) *stream {
	return s.frame(proto.FrameFile, path, int64(len(body)), body, nil)
}

func (s *stream) end(n uint64) *stream {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return s.frame(proto.FrameEnd, "", 8, b[:], nil)
}

func fileChange(path string, content []byte) overlay.Change {
	h := sha256.Sum256(content)
	return overlay.Change{Path: path, Op: overlay.OpAdd, Type: overlay.TypeFile, Mode: 0o644, Size: int64(len(content)), SHA256: hex.EncodeToString(h[:])}
}

func changeSet(cs ...overlay.Change) *overlay.ChangeSet {
	return &overlay.ChangeSet{Version: overlay.ChangeSetVersion, Changes: cs}
}

// emptyTree is a baseline with nothing in it.
type emptyTree struct{}

func (emptyTree) Old(string) (overlay.OldEntry, error) { return overlay.OldEntry{}, nil }

// collectPatch runs collect on the fake guest and builds the patch as a
// session does, into a session folder inside a parent folder it returns.
func collectPatch(t *testing.T, g guestExec, lim collectLimits) (*overlay.PatchInfo, string, string, error) {
	t.Helper()
	parent := t.TempDir()
	dir := filepath.Join(parent, "session")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var info *overlay.PatchInfo
	var patch bytes.Buffer
	err := collect(t.Context(), g, lim, func(cs *overlay.ChangeSet, src overlay.Source) error {
		var err error
		info, err = overlay.BuildPatch(t.Context(), cs, src, emptyTree{}, &patch, overlay.BuildOptions{ObjectDir: filepath.Join(dir, "objects"), MaxFileSize: lim.MaxFile})
		return err
	})
	return info, patch.String(), parent, err
}

var testLimits = collectLimits{MaxFile: 1 << 20, MaxTotal: 4 << 20}

func TestCollectStream(t *testing.T) {
	t.Parallel()
	a, b := []byte("alpha\n"), bytes.Repeat([]byte("b"), 100_000)
	big := bytes.Repeat([]byte("x"), 2<<20) // over MaxFile: listed, not sent
	cs := changeSet(fileChange("a.txt", a), fileChange("dir/b.txt", b), fileChange("huge.bin", big),
		overlay.Change{Path: "dir", Op: overlay.OpAdd, Type: overlay.TypeDir, Mode: 0o755})
	g := &fakeGuest{stream: newStream().changeSet(cs).file("a.txt", a).file("dir/b.txt", b).end(2).Bytes()}
	info, patch, _, err := collectPatch(t, g, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if want := proto.CollectCommand + " 1048576"; g.cmd != want {
		t.Errorf("command %q, want %q", g.cmd, want)
	}
	if len(info.Files) != 2 || !strings.Contains(patch, "+alpha\n") {
		t.Errorf("patch files %+v\n%s", info.Files, patch)
	}
	if len(info.NotCarried) != 1 || info.NotCarried[0].Path != "huge.bin" {
		t.Errorf("not carried: %+v, want huge.bin", info.NotCarried)
	}
}

func TestCollectStreamHostile(t *testing.T) {
	t.Parallel()
	a, b := []byte("alpha\n"), []byte("bravo\n")
	cs := changeSet(fileChange("a.txt", a), fileChange("b.txt", b))
	good := func() *stream { return newStream().changeSet(cs) }
	var wrongSum [32]byte
	tooLong := strings.Repeat("d/", overlay.MaxPathLen/2) + "x"
	cases := []struct {
		name   string
		stream []byte
		code   int
		want   string
	}{
		{"empty", nil, 0, "no header"},
		{"wrong magic", []byte("vibedom-collect/9\n"), 0, "wrong header"},
		{"truncated header", good().Bytes()[:len(proto.CollectMagic)+5], 0, "unexpected EOF"},
		{"truncated change set", good().Bytes()[:len(good().Bytes())-40], 0, "unexpected EOF"},
		{"truncated file body", good().file("a.txt", a).Bytes()[:len(good().Bytes())+14], 0, "unexpected EOF"},
		{"no end frame", good().file("a.txt", a).file("b.txt", b).Bytes(), 0, "unexpected EOF"},
		{"missing file", good().file("b.txt", b).end(1).Bytes(), 0, "did not send a.txt"},
		{"file before the change set", newStream().file("a.txt", a).Bytes(), 0, "first frame is not the change set"},
		{"second change set", good().changeSet(cs).Bytes(), 0, "among the files"},
		{"unknown kind", good().frame('Z', "", 1, []byte("z"), nil).Bytes(), 0, "unknown frame kind"},
		{"oversized change set", newStream().frame(proto.FrameChangeSet, "", maxChangeSet+1, nil, nil).Bytes(), 0, "announces"},
		{"oversized file", good().frame(proto.FrameFile, "a.txt", 1<<40, nil, nil).Bytes(), 0, "announces"},
		{"path over the limit", good().frame(proto.FrameFile, tooLong, 1, []byte("x"), nil).Bytes(), 0, "path of"},
		{"lying size", good().frame(proto.FrameFile, "a.txt", 3, []byte("alp"), nil).Bytes(), 0, "sent as 3 bytes, listed as 6"},
		{"lying trailer", good().frame(proto.FrameFile, "a.txt", 6, a, wrongSum[:]).Bytes(), 0, "does not match its hash"},
		{"content differs from the change set", good().file("a.txt", []byte("ALPHA\n")).Bytes(), 0, "does not match the change set"},
		{"duplicate path", good().file("a.txt", a).file("a.txt", a).Bytes(), 0, "out of order or twice"},
		{"out of order", good().file("b.txt", b).file("a.txt", a).end(2).Bytes(), 0, "did not send a.txt"},
		{"path with ..", good().file("../a.txt", a).Bytes(), 0, `".." component`},
		{"absolute path", good().file("/etc/passwd", a).Bytes(), 0, "absolute"},
		{"path with NUL", good().file("a.txt\x00x", a).Bytes(), 0, "control character"},
		{"file not in the change set", good().file("a.tx", a).Bytes(), 0, "not a changed file"},
		{"end count lies", good().file("a.txt", a).file("b.txt", b).end(3).Bytes(), 0, "counts 3 files, 2 were sent"},
		{"end frame of the wrong size", good().file("a.txt", a).file("b.txt", b).frame(proto.FrameEnd, "", 9, make([]byte, 9), nil).Bytes(), 0, "announces 9 bytes"},
		{"data after the end", append(good().file("a.txt", a).file("b.txt", b).end(2).Bytes(), 'x'), 0, "data after the end frame"},
		{"valid stream, failed command", good().file("a.txt", a).file("b.txt", b).end(2).Bytes(), 1, "could not collect the changes (exit status 1): scan failed"},
		{"invalid change set", newStream().frame(proto.FrameChangeSet, "", 2, []byte("{}"), nil).Bytes(), 0, "invalid change set"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := &fakeGuest{stream: tc.stream, code: tc.code, stderr: "scan failed\x1b[2J"}
			_, _, parent, err := collectPatch(t, g, testLimits)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\x1b") {
				t.Errorf("the guest's escape sequence reached the error: %q", err)
			}
			// Nothing is written beside the session folder.
			ents, _ := os.ReadDir(parent)
			if len(ents) != 1 || ents[0].Name() != "session" {
				t.Errorf("written beside the session folder: %v", ents)
			}
		})
	}
}

// TestCollectStreamTotal: a change set whose files add up to more than the
// scratch disk could hold is refused before any content is read.
func TestCollectStreamTotal(t *testing.T) {
	t.Parallel()
	var changes []overlay.Change
	s := newStream()
	for i := range 5 {
		body := bytes.Repeat([]byte{'a' + byte(i)}, 1<<20)
		changes = append(changes, fileChange(string(rune('a'+i))+".bin", body))
	}
	s.changeSet(changeSet(changes...))
	_, _, _, err := collectPatch(t, &fakeGuest{stream: s.Bytes()}, testLimits)
	if err == nil || !strings.Contains(err.Error(), "more than the 4194304 bytes of the scratch disk") {
		t.Errorf("error %v, want the scratch disk's bound", err)
	}
}

// TestCollectStreamStall: a guest that stops mid-stream is ended by the
// context; collect returns instead of hanging.
func TestCollectStreamStall(t *testing.T) {
	t.Parallel()
	a := []byte("alpha\n")
	g := stallGuest{prefix: newStream().changeSet(changeSet(fileChange("a.txt", a))).Bytes()}
	ctx, cancel := context.WithCancel(t.Context())
	err := collect(ctx, g, testLimits, func(cs *overlay.ChangeSet, src overlay.Source) error {
		cancel()
		_, err := src.Open("a.txt")
		return err
	})
	if !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "canceled") {
		t.Errorf("error %v, want the cancellation", err)
	}
}

type stallGuest struct{ prefix []byte }

func (g stallGuest) Exec(ctx context.Context, cmd string, o guestlink.ExecOptions) (guestlink.ExitStatus, error) {
	o.Stdout.Write(g.prefix)
	<-ctx.Done()
	return guestlink.ExitStatus{}, ctx.Err()
}

// TestCollectStreamPastMemoryBound: the patch builder keeps at most 128 MiB
// of fetched content and reads the rest again when it writes the patch
// (overlay's bound against a guest listing one big file under many names).
// The stream is read forward once, so the source serves the second read
// from its spool, and the patch holds every file whole.
func TestCollectStreamPastMemoryBound(t *testing.T) {
	t.Parallel()
	const n, size = 5, 40 << 20 // 200 MiB in all
	var changes []overlay.Change
	bodies := map[string][]byte{}
	for i := range n {
		b := bytes.Repeat([]byte{'a' + byte(i), 0}, size/2) // binary: written as a git binary patch
		p := "f" + string(rune('0'+i)) + ".bin"
		bodies[p] = b
		changes = append(changes, fileChange(p, b))
	}
	st := newStream().changeSet(changeSet(changes...))
	for i := range n {
		p := "f" + string(rune('0'+i)) + ".bin"
		st.file(p, bodies[p])
	}
	g := &fakeGuest{stream: st.end(n).Bytes()}
	info, patch, _, err := collectPatch(t, g, collectLimits{MaxFile: 64 << 20, MaxTotal: 1 << 30})
	if err != nil {
		t.Fatalf("collect past the builder's memory bound: %v", err)
	}
	if len(info.Files) != n || len(info.NotCarried) != 0 {
		t.Errorf("files %d, not carried %+v; want %d files", len(info.Files), info.NotCarried, n)
	}
	if !strings.Contains(patch, "f4.bin") || !strings.Contains(patch, "GIT binary patch") {
		t.Errorf("the patch lacks the last files (%d bytes)", len(patch))
	}
}

// TestCollectIdle: the deadline follows progress. A guest that stops
// sending is given up after Idle with ErrCollectStalled (once a fixed
// 10-minute clock, after which the scratch disk was deleted); a guest that
// sends heartbeats on standard error while it scans for several times Idle
// is waited for, and its heartbeats do not reach an error message.
func TestCollectIdle(t *testing.T) {
	t.Parallel()
	a := []byte("alpha\n")
	cs := changeSet(fileChange("a.txt", a))
	t.Run("stalled", func(t *testing.T) {
		g := stallGuest{prefix: newStream().changeSet(cs).Bytes()}
		lim := testLimits
		lim.Idle = 50 * time.Millisecond
		err := collect(t.Context(), g, lim, func(cs *overlay.ChangeSet, src overlay.Source) error {
			_, err := src.Open("a.txt")
			return err
		})
		if !errors.Is(err, ErrCollectStalled) {
			t.Errorf("error %v, want ErrCollectStalled", err)
		}
	})
	t.Run("heartbeats", func(t *testing.T) {
		lim := testLimits
		lim.Idle = 500 * time.Millisecond
		g := &beatingGuest{beats: 20, every: lim.Idle / 10, stream: newStream().changeSet(cs).file("a.txt", a).end(1).Bytes()}
		info, _, _, err := collectPatch(t, g, lim)
		if err != nil || len(info.Files) != 1 {
			t.Fatalf("a guest that scans with heartbeats for %s (idle %s): %v", g.every*time.Duration(g.beats), lim.Idle, err)
		}
	})
}

// beatingGuest writes a heartbeat on standard error beats times, every
// every (standing for a scan that takes that long), then the stream.
type beatingGuest struct {
	beats  int
	every  time.Duration
	stream []byte
}

func (g *beatingGuest) Exec(ctx context.Context, cmd string, o guestlink.ExecOptions) (guestlink.ExitStatus, error) {
	for range g.beats {
		time.Sleep(g.every) // the scan's work, not a wait for anything
		o.Stderr.Write([]byte{0})
	}
	if _, err := o.Stdout.Write(g.stream); err != nil {
		return guestlink.ExitStatus{}, ctx.Err()
	}
	return guestlink.ExitStatus{}, nil
}

// TestCollectRefusedStreamLeavesNoPatch: a stream refused after the
// builder read every file (a duplicated frame, a lying end count, trailing
// bytes) leaves no changes.patch, no changes.json and no temporary file in
// the session folder: nothing `list` shows or `review` offers. (The patch
// was once put in place before the stream's end was checked.)
func TestCollectRefusedStreamLeavesNoPatch(t *testing.T) {
	t.Parallel()
	a, b := []byte("alpha\n"), []byte("bravo\n")
	cs := changeSet(fileChange("a.txt", a), fileChange("b.txt", b))
	good := func() *stream { return newStream().changeSet(cs).file("a.txt", a).file("b.txt", b) }
	for name, st := range map[string][]byte{
		"duplicate entry": good().file("b.txt", b).end(3).Bytes(),
		"end count lies":  good().end(5).Bytes(),
		"trailing bytes":  append(good().end(2).Bytes(), 'x'),
		"no end frame":    good().Bytes(),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			ws := t.TempDir()
			if _, err := overlay.TakeBaseline(t.Context(), ws, filepath.Join(dir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
				t.Fatal(err)
			}
			err := collect(t.Context(), &fakeGuest{stream: st}, collectLimits{MaxFile: 1 << 20, MaxTotal: 1 << 20, SpoolDir: dir},
				func(cs *overlay.ChangeSet, src overlay.Source) error {
					_, err := overlay.WriteSessionPatch(t.Context(), dir, cs, src, nil)
					return err
				})
			if err == nil {
				t.Fatal("accepted")
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if e.Name() == overlay.PatchFileName || e.Name() == overlay.InfoFileName || strings.Contains(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".collect-spool") {
					t.Errorf("left in the session folder after a refused stream: %s", e.Name())
				}
			}
			if (&Info{Dir: dir}).PatchPending() {
				t.Error("a patch is pending after a refused stream")
			}
		})
	}
}

// TestCollectSpoolInSessionFolder: the spool of the bodies read lives in
// the session folder, not $TMPDIR (a tmpfs /tmp is RAM, and the spool
// grows to the scratch disk's size): collection works with no usable
// $TMPDIR at all.
func TestCollectSpoolInSessionFolder(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	a := []byte("alpha\n")
	g := &fakeGuest{stream: newStream().changeSet(changeSet(fileChange("a.txt", a))).file("a.txt", a).end(1).Bytes()}
	dir := t.TempDir()
	lim := testLimits
	lim.SpoolDir = dir
	err := collect(t.Context(), g, lim, func(cs *overlay.ChangeSet, src overlay.Source) error {
		_, err := overlay.BuildPatch(t.Context(), cs, src, emptyTree{}, io.Discard, overlay.BuildOptions{ObjectDir: filepath.Join(dir, "objects")})
		return err
	})
	if err != nil {
		t.Fatalf("collect with the spool in the session folder: %v", err)
	}
}

// TestCollectInterrupts: the first Ctrl-C while collecting only says what a
// second does; the second aborts the collection with ErrCollectAborted.
// Outside the collection an interrupt asks the session to stop.
func TestCollectInterrupts(t *testing.T) {
	t.Parallel()
	var progress bytes.Buffer
	s := &sess{name: "app-1234", ctl: newHostCtl(), opts: Options{Progress: &progress}}
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	s.collecting = cancel
	s.interrupt()
	if ctx.Err() != nil {
		t.Fatal("the first Ctrl-C aborted the collection")
	}
	if !strings.Contains(progress.String(), "press Ctrl-C again to abort and keep the scratch disk for vibedom recover app-1234") {
		t.Errorf("the first Ctrl-C said %q", progress.String())
	}
	if s.ctl.stopRequested() {
		t.Error("a Ctrl-C while collecting asked for a stop")
	}
	s.interrupt()
	if !errors.Is(context.Cause(ctx), ErrCollectAborted) {
		t.Errorf("after the second Ctrl-C: %v, want ErrCollectAborted", context.Cause(ctx))
	}
	s.collecting = nil
	s.interrupt()
	if !s.ctl.stopRequested() {
		t.Error("a Ctrl-C before collecting did not ask the session to stop")
	}
}

// TestCollectChangeSetTrailing: the change set frame holds one JSON object
// and white space, nothing else.
func TestCollectChangeSetTrailing(t *testing.T) {
	t.Parallel()
	data, _ := json.Marshal(changeSet())
	for name, body := range map[string]string{"brace": string(data) + "}", "object": string(data) + "{}", "junk": string(data) + " x"} {
		t.Run(name, func(t *testing.T) {
			st := newStream().frame(proto.FrameChangeSet, "", int64(len(body)), []byte(body), nil).end(0).Bytes()
			_, _, _, err := collectPatch(t, &fakeGuest{stream: st}, testLimits)
			if !errors.Is(err, overlay.ErrInvalidChangeSet) {
				t.Errorf("error %v, want ErrInvalidChangeSet", err)
			}
		})
	}
	body := string(data) + " \n"
	st := newStream().frame(proto.FrameChangeSet, "", int64(len(body)), []byte(body), nil).end(0).Bytes()
	if _, _, _, err := collectPatch(t, &fakeGuest{stream: st}, testLimits); err != nil {
		t.Errorf("white space after the object: %v", err)
	}
}

// TestCollectFailedCommandLeavesNoPatch: a whole, valid stream after which
// the guest's collector reports failure ends the collection with an error
// and, as for any failed collection, no patch in the session folder.
func TestCollectFailedCommandLeavesNoPatch(t *testing.T) {
	t.Parallel()
	a := []byte("alpha\n")
	st := newStream().changeSet(changeSet(fileChange("a.txt", a))).file("a.txt", a).end(1).Bytes()
	dir := t.TempDir()
	if _, err := overlay.TakeBaseline(t.Context(), t.TempDir(), filepath.Join(dir, overlay.BaselineDir), overlay.BaselineOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &sess{name: "app-1234", dir: dir, ctl: newHostCtl(), log: slog.New(slog.DiscardHandler), opts: Options{ScratchSize: 1 << 20}}
	_, err := s.collectFrom(t.Context(), &fakeGuest{stream: st, code: 1, stderr: "late failure"})
	if err == nil || !strings.Contains(err.Error(), "late failure") {
		t.Fatalf("error %v, want the guest's failure", err)
	}
	if (&Info{Dir: dir}).PatchPending() {
		t.Error("a patch is pending after the collector failed")
	}
	if _, err := os.Stat(filepath.Join(dir, overlay.InfoFileName)); err == nil {
		t.Error("changes.json is left after the collector failed")
	}
}
