package initramfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// cpio "newc" format (the one the Linux kernel unpacks as an initramfs): a
// 110-byte ASCII header of the magic "070701" and thirteen 8-digit hex
// fields, the NUL-terminated name, padding to a multiple of 4, the data,
// padding to a multiple of 4. The archive ends with an entry named
// "TRAILER!!!".
const (
	cpioMagic      = "070701"
	cpioHeaderSize = 110
	cpioTrailer    = "TRAILER!!!"

	// maxNameSize bounds a member name when reading (PATH_MAX).
	maxNameSize = 4096
)

// Unix file type and permission bits as cpio stores them.
const (
	sIFMT   = 0o170000
	sIFREG  = 0o100000
	sIFDIR  = 0o040000
	sIFLNK  = 0o120000
	sIFCHR  = 0o020000
	sIFBLK  = 0o060000
	sIFIFO  = 0o010000
	sIFSOCK = 0o140000
	sISUID  = 0o4000
	sISGID  = 0o2000
	sISVTX  = 0o1000
)

// ErrBadArchive means a cpio archive could not be parsed.
var ErrBadArchive = errors.New("malformed cpio archive")

// Entry is one member of a cpio archive: a regular file, a directory or a
// symbolic link. Device nodes are not written (the guest uses devtmpfs);
// ReadArchive reports them with their Mode but no data.
type Entry struct {
	// Name is the member's path inside the archive, relative to the root
	// and without a leading slash ("bin/busybox").
	Name string
	// Mode holds the type (0, fs.ModeDir or fs.ModeSymlink) and the
	// permission bits, including fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky.
	Mode fs.FileMode
	// UID and GID own the member.
	UID, GID int
	// Data is a regular file's content or a symlink's target. When Source is
	// set, Data is ignored and the content is read from Source instead.
	Data []byte
	// Source, for regular files, names a host file whose content is copied
	// into the archive when it is written. Its size must not change between
	// Archive.Add and writing.
	Source string

	size int64 // content size, set by Archive.Add for Source entries
}

// Writer writes cpio newc members in the order given. Most callers want
// Archive, which sorts members and adds missing parent directories.
type Writer struct {
	w      *bufio.Writer
	ino    uint32
	closed bool
	err    error
}

// NewWriter returns a Writer writing to w. Close must be called to write the
// trailer and flush.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriterSize(w, 256<<10), ino: 1}
}

// unixMode converts a Go file mode to the mode word cpio stores, or reports
// a type cpio members of an initramfs may not have.
func unixMode(m fs.FileMode) (uint32, error) {
	u := uint32(m.Perm())
	switch m.Type() {
	case 0:
		u |= sIFREG
	case fs.ModeDir:
		u |= sIFDIR
	case fs.ModeSymlink:
		u |= sIFLNK
	default:
		return 0, fmt.Errorf("unsupported file type %v", m.Type())
	}
	if m&fs.ModeSetuid != 0 {
		u |= sISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= sISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= sISVTX
	}
	return u, nil
}

// goMode converts a cpio mode word to a Go file mode.
func goMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	switch u & sIFMT {
	case sIFDIR:
		m |= fs.ModeDir
	case sIFLNK:
		m |= fs.ModeSymlink
	case sIFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case sIFBLK:
		m |= fs.ModeDevice
	case sIFIFO:
		m |= fs.ModeNamedPipe
	case sIFSOCK:
		m |= fs.ModeSocket
	}
	if u&sISUID != 0 {
		m |= fs.ModeSetuid
	}
	if u&sISGID != 0 {
		m |= fs.ModeSetgid
	}
	if u&sISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// CleanName checks an archive member name and returns it without a leading slash.
// Names must be clean, relative once the slash is dropped, and may not
// contain "..", NUL or newline.
func CleanName(name string) (string, error) {
	n := strings.TrimPrefix(name, "/")
	if n == "" || n == "." || path.Clean(n) != n || strings.HasPrefix(n, "../") || n == ".." ||
		strings.ContainsAny(n, "\x00\n") || n == cpioTrailer {
		return "", fmt.Errorf("bad archive member name %q", name)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("bad archive member name %q", name)
		}
	}
	return n, nil
}

func (w *Writer) header(name string, mode uint32, uid, gid, nlink int, size int64) {
	if w.err != nil {
		return
	}
	if size > 0xffffffff {
		w.err = fmt.Errorf("member %q: %d bytes is more than cpio newc can hold", name, size)
		return
	}
	var b [cpioHeaderSize]byte
	copy(b[:], cpioMagic)
	fields := [13]uint32{
		w.ino, mode, uint32(uid), uint32(gid), uint32(nlink),
		0, // mtime: fixed, so archives are reproducible
		uint32(size),
		0, 0, 0, 0, // dev and rdev major/minor
		uint32(len(name) + 1),
		0, // check (only used by the crc format)
	}
	for i, f := range fields {
		hex8(b[6+8*i:], f)
	}
	w.ino++
	_, w.err = w.w.Write(b[:])
	if w.err == nil {
		_, w.err = w.w.WriteString(name)
	}
	if w.err == nil {
		w.err = w.w.WriteByte(0)
	}
	w.pad(cpioHeaderSize + len(name) + 1)
}

func hex8(dst []byte, v uint32) {
	const digits = "0123456789ABCDEF"
	for i := 7; i >= 0; i-- {
		dst[i] = digits[v&0xf]
		v >>= 4
	}
}

// pad writes the zero bytes that align n written bytes to 4.
func (w *Writer) pad(n int) {
	if w.err != nil {
		return
	}
	if r := n % 4; r != 0 {
		_, w.err = w.w.Write(make([]byte, 4-r))
	}
}

// WriteEntry writes one member. Parents are not added; the kernel needs
// them to come first.
func (w *Writer) WriteEntry(e *Entry) error {
	if w.closed {
		return errors.New("cpio writer is closed")
	}
	if w.err != nil {
		return w.err
	}
	name, err := CleanName(e.Name)
	if err != nil {
		return err
	}
	mode, err := unixMode(e.Mode)
	if err != nil {
		return fmt.Errorf("member %q: %w", name, err)
	}
	switch e.Mode.Type() {
	case fs.ModeDir:
		w.header(name, mode, e.UID, e.GID, 2, 0)
	case fs.ModeSymlink:
		w.header(name, mode, e.UID, e.GID, 1, int64(len(e.Data)))
		if w.err == nil {
			_, w.err = w.w.Write(e.Data)
		}
		w.pad(len(e.Data))
	default:
		if e.Source == "" {
			w.header(name, mode, e.UID, e.GID, 1, int64(len(e.Data)))
			if w.err == nil {
				_, w.err = w.w.Write(e.Data)
			}
			w.pad(len(e.Data))
			break
		}
		w.copyFile(name, mode, e)
	}
	return w.err
}

func (w *Writer) copyFile(name string, mode uint32, e *Entry) {
	f, err := os.Open(e.Source)
	if err != nil {
		w.err = fmt.Errorf("member %q: %w", name, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		w.err = fmt.Errorf("member %q: %w", name, err)
		return
	}
	if !fi.Mode().IsRegular() {
		w.err = fmt.Errorf("member %q: source %s is not a regular file", name, e.Source)
		return
	}
	size := fi.Size()
	w.header(name, mode, e.UID, e.GID, 1, size)
	if w.err != nil {
		return
	}
	n, err := io.Copy(w.w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("source %s shrank while it was archived", e.Source)
	}
	if err != nil {
		w.err = fmt.Errorf("member %q: %w", name, err)
		return
	}
	w.pad(int(size % 4))
}

// Close writes the trailer, pads the archive to a multiple of 4 bytes and
// flushes. It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	w.ino = 0
	w.header(cpioTrailer, 0, 0, 0, 1, 0)
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}

// Archive collects members and writes them in a deterministic order: sorted
// by name, every parent directory before its children. Adding a member
// whose name is already present replaces it. Missing parent directories are
// written as root-owned 0755 directories.
type Archive struct {
	entries map[string]*Entry
}

// Add adds (or replaces) a member. For Source entries the source is stat'ed
// now; it must be a regular file.
func (a *Archive) Add(e Entry) error {
	name, err := CleanName(e.Name)
	if err != nil {
		return err
	}
	e.Name = name
	if _, err := unixMode(e.Mode); err != nil {
		return fmt.Errorf("member %q: %w", name, err)
	}
	if e.Source != "" {
		if e.Mode.Type() != 0 {
			return fmt.Errorf("member %q: only regular files may have a source file", name)
		}
		fi, err := os.Stat(e.Source)
		if err != nil {
			return fmt.Errorf("member %q: %w", name, err)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("member %q: source %s is not a regular file", name, e.Source)
		}
		e.size = fi.Size()
		e.Data = nil
	}
	if a.entries == nil {
		a.entries = map[string]*Entry{}
	}
	a.entries[name] = &e
	return nil
}

// Dir adds a root-owned directory with the given permissions.
func (a *Archive) Dir(name string, perm fs.FileMode) error {
	return a.Add(Entry{Name: name, Mode: fs.ModeDir | perm})
}

// File adds a root-owned regular file holding data.
func (a *Archive) File(name string, perm fs.FileMode, data []byte) error {
	return a.Add(Entry{Name: name, Mode: perm, Data: data})
}

// Symlink adds a root-owned symbolic link to target.
func (a *Archive) Symlink(name, target string) error {
	return a.Add(Entry{Name: name, Mode: fs.ModeSymlink | 0o777, Data: []byte(target)})
}

// Len reports the number of members added (parents added implicitly when
// writing are not counted).
func (a *Archive) Len() int { return len(a.entries) }

// sorted returns every member, implicit parents included, in write order.
func (a *Archive) sorted() ([]*Entry, error) {
	all := make(map[string]*Entry, len(a.entries)+16)
	for n, e := range a.entries {
		all[n] = e
	}
	for n := range a.entries {
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			if p, ok := all[d]; ok {
				if !p.Mode.IsDir() {
					return nil, fmt.Errorf("member %q: parent %q is not a directory", n, d)
				}
				continue
			}
			all[d] = &Entry{Name: d, Mode: fs.ModeDir | 0o755}
		}
	}
	out := make([]*Entry, 0, len(all))
	for _, e := range all {
		out = append(out, e)
	}
	// Comparing names component by component puts "a/b" before "a-c/…"
	// consistently and every directory before its contents.
	slices.SortFunc(out, func(x, y *Entry) int { return comparePaths(x.Name, y.Name) })
	return out, nil
}

func comparePaths(a, b string) int {
	for {
		ai, bi := strings.IndexByte(a, '/'), strings.IndexByte(b, '/')
		ah, bh := a, b
		if ai >= 0 {
			ah = a[:ai]
		}
		if bi >= 0 {
			bh = b[:bi]
		}
		if c := strings.Compare(ah, bh); c != 0 {
			return c
		}
		switch {
		case ai < 0 && bi < 0:
			return 0
		case ai < 0:
			return -1
		case bi < 0:
			return 1
		}
		a, b = a[ai+1:], b[bi+1:]
	}
}

// Size reports how many bytes WriteTo will write.
func (a *Archive) Size() (int64, error) {
	es, err := a.sorted()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range es {
		n += align4(int64(cpioHeaderSize + len(e.Name) + 1))
		switch {
		case e.Mode.IsDir():
		case e.Source != "":
			n += align4(e.size)
		default:
			n += align4(int64(len(e.Data)))
		}
	}
	return n + align4(int64(cpioHeaderSize+len(cpioTrailer)+1)), nil
}

func align4(n int64) int64 { return (n + 3) &^ 3 }

// WriteTo writes the whole archive, trailer included, to w.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	es, err := a.sorted()
	if err != nil {
		return 0, err
	}
	cw := &countWriter{w: w}
	cpw := NewWriter(cw)
	for _, e := range es {
		if err := cpw.WriteEntry(e); err != nil {
			return cw.n, err
		}
	}
	err = cpw.Close()
	return cw.n, err
}

// Bytes returns the whole archive in memory.
func (a *Archive) Bytes() ([]byte, error) {
	var b bytes.Buffer
	_, err := a.WriteTo(&b)
	return b.Bytes(), err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadArchive parses one or more concatenated newc archives, as the kernel
// unpacks an initramfs: members in order (a later member of the same name
// is reported again; the caller decides what overriding means), zero
// padding between archives skipped. Member data is held in memory. It is
// meant for tests and inspection tools and is safe on untrusted input: names
// are bounded, and a size that runs past the end of the input fails without
// allocating it.
func ReadArchive(r io.Reader) ([]Entry, error) {
	br := bufio.NewReader(r)
	var out []Entry
	var off int64
	inArchive := false
	for {
		// Between archives the kernel skips zero bytes in 4-byte steps.
		if !inArchive {
			for {
				b, err := br.Peek(4)
				if len(b) == 0 && err == io.EOF {
					return out, nil
				}
				if err != nil && len(b) < 4 {
					if allZero(b) {
						return out, nil
					}
					return out, fmt.Errorf("%w: %d stray bytes at offset %d", ErrBadArchive, len(b), off)
				}
				if !allZero(b) {
					break
				}
				br.Discard(4)
				off += 4
			}
			inArchive = true
		}
		var h [cpioHeaderSize]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return out, fmt.Errorf("%w: header at offset %d: %v", ErrBadArchive, off, err)
		}
		if string(h[:6]) != cpioMagic {
			return out, fmt.Errorf("%w: bad magic %q at offset %d", ErrBadArchive, h[:6], off)
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				return out, fmt.Errorf("%w: header field %d at offset %d: %v", ErrBadArchive, i, off, err)
			}
			f[i] = uint32(v)
		}
		mode, uid, gid, size, namesize := f[1], f[2], f[3], int64(f[6]), int(f[11])
		if namesize < 1 || namesize > maxNameSize {
			return out, fmt.Errorf("%w: name size %d at offset %d", ErrBadArchive, namesize, off)
		}
		nb := make([]byte, int(align4(int64(cpioHeaderSize+namesize)))-cpioHeaderSize)
		if _, err := io.ReadFull(br, nb); err != nil {
			return out, fmt.Errorf("%w: name at offset %d: %v", ErrBadArchive, off, err)
		}
		if nb[namesize-1] != 0 {
			return out, fmt.Errorf("%w: name at offset %d is not NUL-terminated", ErrBadArchive, off)
		}
		name := string(nb[:namesize-1])
		off += cpioHeaderSize + int64(len(nb))
		var data bytes.Buffer
		if n, err := io.CopyN(&data, br, size); err != nil {
			return out, fmt.Errorf("%w: data of %q: %d of %d bytes: %v", ErrBadArchive, name, n, size, err)
		}
		if p := align4(size) - size; p > 0 {
			if _, err := br.Discard(int(p)); err != nil {
				return out, fmt.Errorf("%w: padding of %q: %v", ErrBadArchive, name, err)
			}
		}
		off += align4(size)
		if name == cpioTrailer {
			inArchive = false
			continue
		}
		out = append(out, Entry{
			Name: name,
			Mode: goMode(mode),
			UID:  int(uid),
			GID:  int(gid),
			Data: data.Bytes(),
		})
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
