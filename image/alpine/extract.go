package alpine

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// EntryType is the kind of a package entry.
type EntryType int

const (
	TypeFile EntryType = iota
	TypeDir
	TypeSymlink
	TypeHardlink
)

// Entry is one file of a package's data, as Extract hands it out.
type Entry struct {
	// Path is clean, relative to the root, never "..", absolute or empty.
	Path string
	Type EntryType
	// Mode holds the permission and setuid/setgid/sticky bits.
	Mode fs.FileMode
	UID  int
	GID  int
	// Size is the length of a regular file's content.
	Size    int64
	ModTime time.Time
	// Xattrs are extended attributes the package sets (PAX
	// SCHILY.xattr.*), e.g. security.capability on ping; nil when none.
	Xattrs map[string]string
	// Linkname is a symlink's target as written (it may be absolute: it
	// is resolved inside the image, never on the host), or a hard link's
	// clean relative path to an earlier entry of the same package.
	Linkname string
}

// EntryWriter receives a package's entries in archive order. For a
// TypeFile entry r yields exactly e.Size bytes; otherwise r is empty.
type EntryWriter interface {
	WriteEntry(e Entry, r io.Reader) error
}

// Extract verifies the cached apk at path completely (as VerifyFile),
// then reads it again and hands each data entry to w. It writes nothing to
// the host itself. Refused, as ErrUnsafePath naming the entry: paths that
// are absolute or leave the root, paths through a symlink of the same
// package, hard links to anything but an earlier regular file, device
// nodes and FIFOs, entries over the size bounds.
func Extract(path, arch string, p LockedPackage, keys *Keyring, w EntryWriter) error {
	if keys == nil {
		keys = ReleaseKeys()
	}
	pkg := p.pkg()
	if err := walkPackage(path, pkg, keys, arch, nil); err != nil {
		return err
	}
	name := pkg.File()
	return walkPackage(path, pkg, keys, arch, func(tr *tar.Reader) error {
		return walkData(name, tr, w)
	})
}

func walkData(name string, tr *tar.Reader, w EntryWriter) error {
	symlinks := map[string]bool{}
	files := map[string]bool{}
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w: data: %v", name, ErrFormat, err)
		}
		if n >= maxEntries {
			return fmt.Errorf("%s: %w: more than %d entries", name, ErrFormat, maxEntries)
		}
		if h.Typeflag == tar.TypeDir && path.Clean(h.Name) == "." {
			continue // the root directory itself
		}
		p, err := cleanEntryPath(h.Name)
		if err != nil {
			return fmt.Errorf("%s: %w: %q: %v", name, ErrUnsafePath, h.Name, err)
		}
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if symlinks[d] {
				return fmt.Errorf("%s: %w: %q lies under symlink %q", name, ErrUnsafePath, h.Name, d)
			}
		}
		e := Entry{Path: p, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime}
		// tar mode bits: 04000 setuid, 02000 setgid, 01000 sticky.
		e.Mode = fs.FileMode(h.Mode & 0o777)
		if h.Mode&0o4000 != 0 {
			e.Mode |= fs.ModeSetuid
		}
		if h.Mode&0o2000 != 0 {
			e.Mode |= fs.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			e.Mode |= fs.ModeSticky
		}
		for k, v := range h.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && name != "" {
				if e.Xattrs == nil {
					e.Xattrs = map[string]string{}
				}
				e.Xattrs[name] = v
			}
		}
		var body io.Reader = strings.NewReader("")
		switch h.Typeflag {
		case tar.TypeReg:
			if h.Size < 0 || h.Size > maxEntrySize || total+h.Size > maxDataTotal {
				return fmt.Errorf("%s: %w: %q is %d bytes, over vibedom's bound", name, ErrUnsafePath, h.Name, h.Size)
			}
			total += h.Size
			e.Type, e.Size, body = TypeFile, h.Size, tr
			files[p] = true
		case tar.TypeDir:
			e.Type = TypeDir
		case tar.TypeSymlink:
			if h.Linkname == "" || len(h.Linkname) > maxPathLength || strings.ContainsRune(h.Linkname, 0) {
				return fmt.Errorf("%s: %w: symlink %q has target %q", name, ErrUnsafePath, h.Name, h.Linkname)
			}
			e.Type, e.Linkname = TypeSymlink, h.Linkname
			symlinks[p] = true
		case tar.TypeLink:
			t, err := cleanEntryPath(h.Linkname)
			if err != nil || !files[t] {
				return fmt.Errorf("%s: %w: hard link %q -> %q is not to an earlier file of the package", name, ErrUnsafePath, h.Name, h.Linkname)
			}
			e.Type, e.Linkname = TypeHardlink, t
		default:
			return fmt.Errorf("%s: %w: %q has tar type %q (devices and FIFOs are refused)", name, ErrUnsafePath, h.Name, h.Typeflag)
		}
		if err := w.WriteEntry(e, body); err != nil {
			return fmt.Errorf("%s: %s: %w", name, p, err)
		}
	}
}

// cleanEntryPath returns a tar name as a clean relative path, or an
// error for anything that is absolute, empty or leaves the root.
func cleanEntryPath(n string) (string, error) {
	if n == "" || len(n) > maxPathLength || strings.ContainsRune(n, 0) {
		return "", fmt.Errorf("not a plain path")
	}
	if strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("absolute")
	}
	for _, part := range strings.Split(strings.TrimSuffix(n, "/"), "/") {
		if part == ".." {
			return "", fmt.Errorf("contains ..")
		}
	}
	c := path.Clean(n)
	if c == "." || c == "" {
		return "", fmt.Errorf("names the root")
	}
	return c, nil
}
