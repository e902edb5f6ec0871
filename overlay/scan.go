package overlay

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"
)

// ErrUnsupportedOverlay means the upper dir uses an overlay feature whose
// data does not live in the upper dir (metacopy, redirect_dir). Mount the
// overlay with redirect_dir=off,metacopy=off.
var ErrUnsupportedOverlay = errors.New("unsupported overlay feature (mount with redirect_dir=off,metacopy=off)")

// upperKind is what an upper-dir entry means to the overlay.
type upperKind int

const (
	upperNormal upperKind = iota
	upperWhiteout
)

// overlayFS is what the scan needs from the platform: whiteout and opaque
// detection (xattrs, device numbers). See scan_linux.go.
type overlayFS interface {
	kind(path string, fi fs.FileInfo) (upperKind, error)
	opaque(path string) (bool, error)
	// xattrs returns the extended attributes of path other than the
	// overlay's own, by name (nil when the platform has none).
	xattrs(path string) (map[string]string, error)
}

// ScanChanges walks the overlay upper dir against lower and returns the
// change set. It must run where the overlay's whiteouts and opaque xattrs are
// visible (in the guest, as root). It reads but never follows symlinks, and
// never writes. Metadata-only copy-ups (touch, chown, an append of nothing)
// are not changes; owners and times are not compared. Special files and
// names that are not valid UTF-8 or hold control characters are reported as
// OpSkip.
func ScanChanges(lower, upper string) (*ChangeSet, error) {
	return scanWith(platformOverlay{}, lower, upper, nil)
}

// Base is the version of a workspace file the agent's copy started from:
// the SHA-256 (lowercase hex) and permission bits of the lower file the
// guest last saw opened before the overlay copied the path up.
type Base struct {
	SHA256 string
	Mode   uint32
}

// ScanChangesFrom is ScanChanges with the bases the guest recorded (keyed
// by slash path): a modify of a file with a base carries it (see
// Change.BaseSHA256), and a copied-up file whose content and mode equal its
// base is not a change, whatever the lower holds now (the user may have
// changed the workspace file since).
func ScanChangesFrom(lower, upper string, bases map[string]Base) (*ChangeSet, error) {
	return scanWith(platformOverlay{}, lower, upper, bases)
}

func scanWith(ofs overlayFS, lower, upper string, bases map[string]Base) (*ChangeSet, error) {
	s := &scanner{ofs: ofs, lower: lower, upper: upper, bases: bases, buf1: make([]byte, 1<<20), buf2: make([]byte, 1<<20)}
	fi, err := os.Lstat(upper)
	if err != nil {
		return nil, fmt.Errorf("scan overlay upper dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("scan overlay upper dir %s: not a directory", upper)
	}
	if _, err := os.Lstat(lower); err != nil {
		return nil, fmt.Errorf("scan overlay lower dir: %w", err)
	}
	op, err := ofs.opaque(upper)
	if err != nil {
		return nil, err
	}
	if err := s.dir("", true, op); err != nil {
		return nil, err
	}
	cs := &ChangeSet{Version: ChangeSetVersion, Changes: s.out}
	cs.Sort()
	return cs, nil
}

type scanner struct {
	ofs          overlayFS
	lower, upper string
	bases        map[string]Base
	out          []Change
	buf1, buf2   []byte
}

func (s *scanner) up(rel string) string  { return filepath.Join(s.upper, filepath.FromSlash(rel)) }
func (s *scanner) low(rel string) string { return filepath.Join(s.lower, filepath.FromSlash(rel)) }

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// usableName reports whether a name can travel in the change set: valid
// UTF-8 without control characters.
func usableName(name string) bool {
	if !utf8.ValidString(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

func (s *scanner) skip(rel, reason string) {
	d := strings.ToValidUTF8(DisplayPath(rel), "?")
	if len(d) > maxSkipPath {
		d = strings.ToValidUTF8(d[:maxSkipPath], "") + "…"
	}
	s.out = append(s.out, Change{Path: d, Op: OpSkip, Type: TypeSpecial, Reason: reason})
}

// maxSkipPath bounds the display path of a skip entry (ChangeSet.Validate
// allows four times MaxPathLen).
const maxSkipPath = 2 * MaxPathLen

// errChanged marks a scan error that is not one entry's alone: the tree
// changed under the scan. It fails the whole scan.
var errChanged = errors.New("changed while reading")

// entryProblem turns the error of scanning one entry into the reason it is
// not carried, or reports that the whole scan must fail (an unsupported
// overlay, a tree that changed under the scan). The reason holds the
// system's words only, not the path (which the skip entry has).
func entryProblem(err error) (string, bool) {
	if errors.Is(err, ErrUnsupportedOverlay) || errors.Is(err, errChanged) {
		return "", false
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	msg := err.Error()
	if len(msg) > 200 || !usableName(msg) {
		msg = "unreadable"
	}
	return "could not be read in the guest (" + msg + ")", true
}

// lstatLower returns the lower entry at rel, or nil when there is none (or a
// parent is not a directory).
func (s *scanner) lstatLower(rel string) (fs.FileInfo, error) {
	fi, err := os.Lstat(s.low(rel))
	if err == nil {
		return fi, nil
	}
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	return nil, fmt.Errorf("scan lower %s: %w", DisplayPath(rel), err)
}

// dir compares the upper directory rel with the lower one. lowerDir says
// whether lower has a directory at rel; opaque whether the upper hides it.
func (s *scanner) dir(rel string, lowerDir, opaque bool) error {
	ents, err := os.ReadDir(s.up(rel))
	if err != nil {
		return fmt.Errorf("scan upper %s: %w", DisplayPath(rel), err)
	}
	inUpper := make(map[string]bool, len(ents))
	for _, e := range ents {
		p := join(rel, e.Name())
		if err := s.dirEntry(p, e, lowerDir, opaque, inUpper); err != nil {
			why, ok := entryProblem(err)
			if !ok {
				return err
			}
			s.skip(p, why)
		}
	}
	if lowerDir && opaque {
		// The upper dir replaced the lower one: what lower had and upper
		// lacks is gone.
		lents, err := os.ReadDir(s.low(rel))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("scan lower %s: %w", DisplayPath(rel), err)
		}
		for _, le := range lents {
			if inUpper[le.Name()] {
				continue
			}
			p := join(rel, le.Name())
			lfi, err := le.Info()
			if err != nil {
				return fmt.Errorf("scan lower %s: %w", DisplayPath(p), err)
			}
			if err := s.deleteTree(p, lfi); err != nil {
				return err
			}
		}
	}
	return nil
}

// dirEntry scans one entry of an upper directory (see dir). Its error is
// that entry's alone unless entryProblem says otherwise.
func (s *scanner) dirEntry(p string, e fs.DirEntry, lowerDir, opaque bool, inUpper map[string]bool) error {
	name := e.Name()
	ufi, err := e.Info()
	if err != nil {
		return fmt.Errorf("scan upper %s: %w", DisplayPath(p), err)
	}
	k, err := s.ofs.kind(s.up(p), ufi)
	if err != nil {
		return err
	}
	if k != upperWhiteout {
		inUpper[name] = true
	}
	if !usableName(name) {
		if k != upperWhiteout {
			s.skip(p, "name is not valid UTF-8 or holds control characters")
		}
		return nil
	}
	if len(p) > MaxPathLen {
		if k == upperWhiteout {
			s.skip(p, fmt.Sprintf("deleted, but the path is longer than %d bytes", MaxPathLen))
		} else {
			s.skip(p, fmt.Sprintf("path is longer than %d bytes (with everything under it)", MaxPathLen))
		}
		return nil
	}
	var lfi fs.FileInfo
	if lowerDir {
		if lfi, err = s.lstatLower(p); err != nil {
			return err
		}
	}
	if k == upperWhiteout {
		if lfi != nil && !opaque {
			return s.deleteTree(p, lfi)
		}
		return nil
	}
	if err := s.entry(p, ufi, lfi); err != nil {
		return err
	}
	return s.xattrChanges(p, typeOf(ufi), lfi)
}

// xattrChanges reports the extended attributes of the upper entry at p
// that lower's entry (lfi, nil if none) does not have with the same value:
// a patch carries none of them.
func (s *scanner) xattrChanges(p string, t FileType, lfi fs.FileInfo) error {
	if t == TypeSpecial {
		return nil
	}
	ux, err := s.ofs.xattrs(s.up(p))
	if err != nil || len(ux) == 0 {
		return err
	}
	var lx map[string]string
	if lfi != nil {
		if lx, err = s.ofs.xattrs(s.low(p)); err != nil {
			lx = nil
		}
	}
	var names []string
	for n, v := range ux {
		if lv, ok := lx[n]; !ok || lv != v {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	list := ""
	for _, n := range names {
		if !usableName(n) {
			n = strconv.Quote(n)
		}
		if len(list)+len(n) > 900 {
			list += ", …"
			break
		}
		if list != "" {
			list += ", "
		}
		list += n
	}
	s.skip(p, "extended attributes are not carried: "+list)
	return nil
}

func typeOf(fi fs.FileInfo) FileType {
	switch m := fi.Mode(); {
	case m.IsRegular():
		return TypeFile
	case m.IsDir():
		return TypeDir
	case m&fs.ModeSymlink != 0:
		return TypeSymlink
	}
	return TypeSpecial
}

func permOf(fi fs.FileInfo) uint32 {
	m := fi.Mode()
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return p
}

// entry compares one upper entry (not a whiteout) with lower's (nil if none).
func (s *scanner) entry(p string, ufi, lfi fs.FileInfo) error {
	ut := typeOf(ufi)
	if ut == TypeSpecial {
		if lfi != nil && typeOf(lfi) != TypeSpecial {
			if err := s.deleteTree(p, lfi); err != nil {
				return err
			}
		}
		s.skip(p, "special file ("+ufi.Mode().Type().String()+") is not carried")
		return nil
	}
	same := lfi != nil && typeOf(lfi) == ut
	if lfi != nil && !same {
		if err := s.deleteTree(p, lfi); err != nil {
			return err
		}
	}
	switch ut {
	case TypeDir:
		op, err := s.ofs.opaque(s.up(p))
		if err != nil {
			return err
		}
		if !same {
			s.out = append(s.out, Change{Path: p, Op: OpAdd, Type: TypeDir, Mode: permOf(ufi)})
		} else if permOf(ufi) != permOf(lfi) {
			s.out = append(s.out, Change{Path: p, Op: OpModify, Type: TypeDir, Mode: permOf(ufi), OldMode: permOf(lfi)})
		}
		return s.dir(p, same, op)
	case TypeSymlink:
		t, err := os.Readlink(s.up(p))
		if err != nil {
			return fmt.Errorf("scan upper %s: %w", DisplayPath(p), err)
		}
		if ValidateTarget(t) != nil {
			s.skip(p, "symlink target is not valid UTF-8 or too long")
			return nil
		}
		if same {
			lt, err := os.Readlink(s.low(p))
			if err != nil {
				return fmt.Errorf("scan lower %s: %w", DisplayPath(p), err)
			}
			if lt == t {
				return nil
			}
			s.out = append(s.out, Change{Path: p, Op: OpModify, Type: TypeSymlink, Mode: 0o777, OldMode: 0o777, Target: t})
			return nil
		}
		s.out = append(s.out, Change{Path: p, Op: OpAdd, Type: TypeSymlink, Mode: 0o777, Target: t})
		return nil
	}
	// Regular file.
	sum, equal, err := s.compareFile(p, ufi, lfi, same)
	if err != nil {
		return err
	}
	c := Change{Path: p, Op: OpAdd, Type: TypeFile, Mode: permOf(ufi), Size: ufi.Size(), SHA256: sum}
	if same {
		b, based := s.bases[p]
		if (equal && permOf(ufi) == permOf(lfi)) || (based && b.SHA256 == sum && b.Mode == permOf(ufi)) {
			return nil // a copy-up that changed nothing
		}
		c.Op, c.OldMode = OpModify, permOf(lfi)
		if based && validSHA256(b.SHA256) && b.Mode <= 0o7777 {
			c.BaseSHA256, c.BaseMode = b.SHA256, b.Mode
		}
	}
	s.out = append(s.out, c)
	return nil
}

// compareFile hashes the upper file and, when lower has a regular file of
// the same size, compares the two byte for byte in the same pass.
func (s *scanner) compareFile(p string, ufi, lfi fs.FileInfo, sameType bool) (string, bool, error) {
	uf, err := os.Open(s.up(p))
	if err != nil {
		return "", false, fmt.Errorf("scan upper %s: %w", DisplayPath(p), err)
	}
	defer uf.Close()
	h := sha256.New()
	var lf *os.File
	if sameType && lfi.Size() == ufi.Size() {
		if lf, err = os.Open(s.low(p)); err != nil {
			return "", false, fmt.Errorf("scan lower %s: %w", DisplayPath(p), err)
		}
		defer lf.Close()
	}
	equal := lf != nil
	var n int64
	for {
		k, rerr := io.ReadFull(uf, s.buf1)
		if k > 0 {
			h.Write(s.buf1[:k])
			n += int64(k)
			if equal {
				m, _ := io.ReadFull(lf, s.buf2[:k])
				if m != k || !bytes.Equal(s.buf1[:k], s.buf2[:k]) {
					equal = false
				}
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return "", false, fmt.Errorf("scan upper %s: %w", DisplayPath(p), rerr)
		}
	}
	if n != ufi.Size() {
		return "", false, fmt.Errorf("scan upper %s: %w (%d, then %d bytes); stop the agent before listing changes", DisplayPath(p), errChanged, ufi.Size(), n)
	}
	if equal {
		// Lower must end where upper did.
		if k, _ := lf.Read(s.buf2[:1]); k != 0 {
			equal = false
		}
	}
	return hex.EncodeToString(h.Sum(nil)), equal, nil
}

// deleteTree records the deletion of the lower entry at p and, for a
// directory, of everything under it.
func (s *scanner) deleteTree(p string, lfi fs.FileInfo) error {
	if len(p) > MaxPathLen {
		s.skip(p, fmt.Sprintf("deleted, but the path is longer than %d bytes", MaxPathLen))
		return nil
	}
	if !usableName(filepath.Base(filepath.FromSlash(p))) {
		s.skip(p, "deleted, but the name is not valid UTF-8 or holds control characters")
		return nil
	}
	t := typeOf(lfi)
	if t == TypeDir {
		ents, err := os.ReadDir(s.low(p))
		if err != nil {
			return fmt.Errorf("scan lower %s: %w", DisplayPath(p), err)
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				return fmt.Errorf("scan lower %s: %w", DisplayPath(join(p, e.Name())), err)
			}
			if err := s.deleteTree(join(p, e.Name()), fi); err != nil {
				return err
			}
		}
	}
	s.out = append(s.out, Change{Path: p, Op: OpDelete, Type: t})
	return nil
}

// allOpaque treats every upper directory as opaque and nothing as a
// whiteout: scanning with it compares two plain trees.
type allOpaque struct{}

func (allOpaque) kind(string, fs.FileInfo) (upperKind, error) { return upperNormal, nil }
func (allOpaque) opaque(string) (bool, error)                 { return true, nil }
func (allOpaque) xattrs(string) (map[string]string, error)    { return nil, nil }

// DiffTrees returns the change set that turns the plain directory tree
// oldDir into newDir, as ScanChanges would for an overlay whose upper dir
// held all of newDir, opaque. It is for hosts without an overlay (tests,
// tools); it follows no symlinks.
func DiffTrees(oldDir, newDir string) (*ChangeSet, error) {
	return scanWith(allOpaque{}, oldDir, newDir, nil)
}
