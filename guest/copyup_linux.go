package guest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/overlay"
)

// maxBaseHash is the largest file hashed when it is opened: the opener
// waits for the hash. A larger file's base is recorded as unknown.
const maxBaseHash = 64 << 20

// recordBases watches every open in the overlay at workDir and, for a
// regular file the overlay has not copied up yet, appends to out the
// content hash and mode of the lower version being opened (basesFile's
// format). The open waits until that is recorded: an open for writing
// copies the file up right after, so the last record before a path
// appears in upperDir is the version the agent's copy started from (for a
// write in place), or the version it last read (for a new file renamed
// over the path). Everything else about the open is allowed unchanged; a
// failure to record only leaves the base unknown.
//
// It uses fanotify permission events (FAN_OPEN_PERM on the mount), which
// need CONFIG_FANOTIFY_ACCESS_PERMISSIONS; without them it returns an error
// and the change set carries no bases (the host then calls every file both
// sides changed a conflict). It runs until stop is called (the guest
// agent never does); pending opens then go on.
func recordBases(log *slog.Logger, workDir, upperDir, out string) (stop func(), err error) {
	// The descriptors events carry are opened O_NONBLOCK: an O_RDONLY open
	// of a FIFO would otherwise wait for a writer whose own open waits for
	// this recorder.
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE|unix.O_CLOEXEC|unix.O_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("fanotify (the kernel needs CONFIG_FANOTIFY_ACCESS_PERMISSIONS): %w", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_MOUNT, unix.FAN_OPEN_PERM, unix.AT_FDCWD, workDir); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fanotify mark %s: %w", workDir, err)
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", out, err)
	}
	// Non-blocking, so the runtime's poller waits for events and Close
	// ends that wait.
	group := os.NewFile(uintptr(fd), "fanotify")
	r := &baseRecorder{group: group, out: f, workDir: workDir, upperDir: upperDir, seen: map[string]statKey{}, buf: make([]byte, 1<<20), log: log}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.loop()
	}()
	return func() {
		r.stopped.Store(true)
		// Closing the group ends the read and lets pending opens go.
		group.Close()
		<-done
		f.Close()
	}, nil
}

type statKey struct {
	ino, size, mtime, mtimeNs, ctime, ctimeNs int64
	mode                                      uint32
}

type baseRecorder struct {
	group             *os.File
	out               *os.File
	workDir, upperDir string
	seen              map[string]statKey
	buf               []byte
	log               *slog.Logger
	stopped           atomic.Bool
}

func (r *baseRecorder) loop() {
	events := make([]byte, 64<<10)
	metaLen := int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	for {
		n, err := r.group.Read(events)
		if err != nil || n <= 0 {
			if !r.stopped.Load() {
				r.log.Warn("copy-up bases: reading fanotify events stopped; later bases are unknown", "err", err)
			}
			return
		}
		for off := 0; off+metaLen <= n; {
			m := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&events[off]))
			if m.Vers != unix.FANOTIFY_METADATA_VERSION || int(m.Event_len) < metaLen {
				r.log.Warn("copy-up bases: unknown fanotify event format; stopped", "version", m.Vers)
				return
			}
			if m.Fd >= 0 {
				r.event(int(m.Fd), m.Mask)
			}
			off += int(m.Event_len)
		}
	}
}

// event records one open and always lets it go on.
func (r *baseRecorder) event(efd int, mask uint64) {
	defer func() {
		if v := recover(); v != nil {
			r.log.Warn("copy-up bases: recording crashed", "err", fmt.Sprint(v))
		}
		if mask&unix.FAN_OPEN_PERM != 0 {
			resp := unix.FanotifyResponse{Fd: int32(efd), Response: unix.FAN_ALLOW}
			_, _ = r.group.Write((*[unsafe.Sizeof(resp)]byte)(unsafe.Pointer(&resp))[:])
		}
		unix.Close(efd)
	}()
	r.record(efd)
}

func keyOf(st *unix.Stat_t) statKey {
	return statKey{int64(st.Ino), st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, st.Mode}
}

func (r *baseRecorder) record(efd int) {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(efd))
	if err != nil {
		return
	}
	rel, ok := strings.CutPrefix(target, r.workDir+"/")
	if !ok || overlay.ValidatePath(rel) != nil {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(efd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	if _, err := os.Lstat(filepath.Join(r.upperDir, filepath.FromSlash(rel))); err == nil || !(errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)) {
		return // copied up already (or created in the overlay): the agent's own
	}
	key := keyOf(&st)
	if r.seen[rel] == key {
		return // this version is recorded
	}
	r.seen[rel] = key
	rec := baseRecord{Path: rel, Mode: st.Mode & 0o7777}
	if st.Size <= maxBaseHash {
		if sum, ok := r.hash(efd, st.Size); ok {
			var after unix.Stat_t
			if unix.Fstat(efd, &after) == nil && keyOf(&after) == key {
				rec.SHA256 = sum
			}
		}
	}
	if rec.SHA256 == "" {
		delete(r.seen, rel)
	}
	line, _ := json.Marshal(rec)
	if _, err := r.out.Write(append(line, '\n')); err != nil {
		r.log.Warn("copy-up bases: record", "err", err)
	}
}

// hash reads the whole file at efd (size bytes, from offset 0).
func (r *baseRecorder) hash(efd int, size int64) (string, bool) {
	h := sha256.New()
	var off int64
	for {
		n, err := unix.Pread(efd, r.buf, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return "", false
		}
		if n == 0 {
			break
		}
		h.Write(r.buf[:n])
		off += int64(n)
	}
	if off != size {
		return "", false
	}
	return hex.EncodeToString(h.Sum(nil)), true
}
