package agents

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// ErrUnsafeEntry: a tarball entry would land outside the package
// directory, is a kind of file an agent package has no use for, or breaks
// a size bound. Nothing is installed.
var ErrUnsafeEntry = errors.New("unsafe tarball entry")

// maxEntries bounds a package's entries (codex has 45).
const maxEntries = 20000

// pkgDir is the directory an installed package's files go to, inside the
// agent's directory; npm's own top directory ("package/") is renamed to it.
const pkgDir = "package"

// unpacked is what extracting a tarball found.
type unpacked struct {
	binarySHA256 string
	binarySize   int64
	total        int64 // bytes of regular files unpacked
}

// extract unpacks the gzip tarball r into root (an empty directory),
// stripping the tarball's one top-level directory and putting its
// contents under root/package. Only regular files, directories and
// symlinks that resolve inside the package are created; file modes keep
// only the owner-execute bit's meaning (0644 or 0755). binary (relative
// to the package) must be a regular file; its SHA-256 is returned.
func extract(r io.Reader, root *os.Root, p Pin, maxUnpacked int64) (unpacked, error) {
	if err := root.Mkdir(pkgDir, 0o755); err != nil {
		return unpacked{}, err
	}
	return extractTo(r, root, pkgDir, p, maxUnpacked)
}

// extractTo is extract into dir (a directory inside root that exists);
// p.Binary "" checks no binary.
func extractTo(r io.Reader, root *os.Root, dir string, p Pin, maxUnpacked int64) (unpacked, error) {
	var res unpacked
	bad := func(name, why string) error {
		return fmt.Errorf("%w: %s: %q %s; nothing installed", ErrUnsafeEntry, p, name, why)
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return res, fmt.Errorf("%s: not a gzip tarball: %w", p, err)
	}
	tr := tar.NewReader(zr)
	top := ""
	symlinks := map[string]string{} // fold(path in the package) -> target
	seen := map[string]string{}     // fold(path) -> path
	var total int64
	found := false
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fmt.Errorf("%s: reading the tarball: %w", p, err)
		}
		if n >= maxEntries {
			return res, bad(h.Name, fmt.Sprintf("is past the %d-entry bound", maxEntries))
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name := h.Name
		if strings.HasPrefix(name, "/") || strings.Contains(name, "\\") || strings.ContainsRune(name, 0) {
			return res, bad(name, "is an absolute or malformed path")
		}
		for _, el := range strings.Split(name, "/") {
			if el == ".." {
				return res, bad(name, "leaves the package (..)")
			}
		}
		clean := path.Clean(name)
		first, rest, _ := strings.Cut(clean, "/")
		if top == "" {
			top = first
		}
		if first != top || first == "." {
			return res, bad(name, fmt.Sprintf("is outside the tarball's top directory %q", top))
		}
		if rest == "" {
			if h.Typeflag != tar.TypeDir {
				return res, bad(name, "is the top directory but not a directory")
			}
			continue
		}
		// No entry may go through a symlink of the package, nor name a
		// path that a Mac's file system (case- and normalisation-
		// insensitive) takes for another entry's: there "D/x" goes
		// through a symlink "d".
		for d := path.Dir(rest); d != "."; d = path.Dir(d) {
			if _, ok := symlinks[fold(d)]; ok {
				return res, bad(name, "goes through the package's symlink "+d)
			}
			if prev, ok := seen[fold(d)]; ok && prev != d {
				return res, bad(name, fmt.Sprintf("is under %q on a case-insensitive file system", prev))
			}
			seen[fold(d)] = d
		}
		if prev, ok := seen[fold(rest)]; ok {
			if prev != rest {
				return res, bad(name, fmt.Sprintf("is %q on a case-insensitive file system", prev))
			}
			if h.Typeflag != tar.TypeDir {
				return res, bad(name, "appears twice")
			}
		}
		seen[fold(rest)] = rest
		dst := dir + "/" + rest
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(dst, 0o755); err != nil {
				return res, fmt.Errorf("%s: %w", p, err)
			}
		case tar.TypeReg, tar.TypeRegA:
			if h.Size < 0 || h.Size > maxUnpacked-total {
				return res, bad(name, fmt.Sprintf("takes the package past %d MiB unpacked", maxUnpacked>>20))
			}
			total += h.Size
			if err := root.MkdirAll(path.Dir(dst), 0o755); err != nil {
				return res, fmt.Errorf("%s: %w", p, err)
			}
			mode := fs.FileMode(0o644)
			if h.Mode&0o100 != 0 {
				mode = 0o755
			}
			f, err := root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
			if err != nil {
				return res, fmt.Errorf("%s: %w", p, err)
			}
			var sum hash.Hash
			w := io.Writer(f)
			if rest == p.Binary && p.Binary != "" {
				sum = sha256.New()
				w = io.MultiWriter(f, sum)
			}
			n, err := io.Copy(w, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return res, fmt.Errorf("%s: unpacking %q: %w", p, name, err)
			}
			if n != h.Size {
				return res, fmt.Errorf("%s: %q is cut short", p, name)
			}
			if sum != nil {
				if mode&0o100 == 0 {
					return res, fmt.Errorf("%s: the agent's binary %s is not executable in the package", p, p.Binary)
				}
				found = true
				res.binarySHA256, res.binarySize = hex.EncodeToString(sum.Sum(nil)), n
			}
		case tar.TypeSymlink:
			t := h.Linkname
			if t == "" || strings.HasPrefix(t, "/") || strings.ContainsRune(t, 0) {
				return res, bad(name, fmt.Sprintf("is a symlink to %q, not a relative path", t))
			}
			if !linkInside(rest, t, symlinks) {
				return res, bad(name, fmt.Sprintf("is a symlink to %q, outside the package", t))
			}
			if rest == p.Binary {
				return res, bad(name, "is the agent's binary but a symlink")
			}
			if err := root.MkdirAll(path.Dir(dst), 0o755); err != nil {
				return res, fmt.Errorf("%s: %w", p, err)
			}
			if err := root.Symlink(t, dst); err != nil {
				return res, fmt.Errorf("%s: %w", p, err)
			}
			symlinks[fold(rest)] = t
		case tar.TypeLink:
			return res, bad(name, "is a hard link (npm packages have none)")
		default:
			return res, bad(name, fmt.Sprintf("is a special file (type %q)", h.Typeflag))
		}
	}
	// Trailing bytes after the tar end would not be hashed into a binary,
	// but the gzip stream must still be whole.
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return res, fmt.Errorf("%s: reading the tarball: %w", p, err)
	}
	// Again with every symlink known: one made later may turn an
	// earlier link's ".." into a way out.
	for l, t := range symlinks {
		if !linkInside(l, t, symlinks) {
			return res, bad(top+"/"+l, fmt.Sprintf("is a symlink to %q, outside the package", t))
		}
	}
	res.total = total
	if !found && p.Binary != "" {
		return res, fmt.Errorf("%s: the package has no binary at %s; nothing installed", p, p.Binary)
	}
	return res, nil
}

// linkInside reports whether the symlink at link (a path in the package)
// with target t stays inside the package when resolved lexically, without
// stepping through another symlink of the package on the way (a symlink
// may only be the last element, and then its own check covers it).
func linkInside(link, t string, symlinks map[string]string) bool {
	var stack []string
	if d := path.Dir(link); d != "." {
		stack = strings.Split(d, "/")
	}
	els := strings.Split(t, "/")
	for i, el := range els {
		switch el {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return false
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, el)
		if _, ok := symlinks[fold(strings.Join(stack, "/"))]; ok && i < len(els)-1 {
			return false
		}
	}
	return true
}

// fold is the name a case- and normalisation-insensitive file system
// (APFS, HFS+) takes p for: NFD, case folded, with the invisible format
// characters HFS+ ignores dropped.
func fold(p string) string {
	var b strings.Builder
	for _, r := range norm.NFD.String(p) {
		if unicode.Is(unicode.Cf, r) {
			continue
		}
		b.WriteRune(unicode.ToLower(unicode.ToUpper(r)))
	}
	return b.String()
}
