package alpinetest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// deb is a Debian binary package read from its .deb file.
type deb struct {
	file    string
	control map[string]string // Package, Version, Architecture, Description (first line)
	files   []File            // data.tar's entries, names relative ("usr/bin/git"), "./" dropped
}

// maxDeb bounds a .deb file, and maxDebData its unpacked data.
const (
	maxDeb     = 512 << 20
	maxDebData = 2 << 30
)

// readDeb reads a .deb: an ar archive of debian-binary, control.tar.* and
// data.tar.* (gzip, xz or zstd).
func readDeb(file string) (*deb, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if len(b) > maxDeb {
		return nil, fmt.Errorf("%s: larger than %d MiB", file, maxDeb>>20)
	}
	if !bytes.HasPrefix(b, []byte("!<arch>\n")) {
		return nil, fmt.Errorf("%s: not a Debian package (no ar header)", file)
	}
	d := &deb{file: file}
	off := 8
	for off < len(b) {
		if off+60 > len(b) {
			return nil, fmt.Errorf("%s: truncated ar member header at %d", file, off)
		}
		h := b[off : off+60]
		if string(h[58:60]) != "`\n" {
			return nil, fmt.Errorf("%s: bad ar member header at %d", file, off)
		}
		name := strings.TrimRight(strings.TrimSpace(string(h[0:16])), "/")
		size, err := strconv.Atoi(strings.TrimSpace(string(h[48:58])))
		if err != nil || size < 0 || off+60+size > len(b) {
			return nil, fmt.Errorf("%s: bad ar member size for %q", file, name)
		}
		body := b[off+60 : off+60+size]
		off += 60 + size + size%2
		switch {
		case strings.HasPrefix(name, "control.tar"):
			r, err := decompress(name, body)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, name, err)
			}
			files, err := readTar(r, 1<<20)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, name, err)
			}
			for _, f := range files {
				if f.Name == "control" {
					d.control = parseControl(f.Body)
				}
			}
		case strings.HasPrefix(name, "data.tar"):
			r, err := decompress(name, body)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, name, err)
			}
			if d.files, err = readTar(r, maxDebData); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, name, err)
			}
		}
	}
	if d.control["Package"] == "" || d.control["Version"] == "" {
		return nil, fmt.Errorf("%s: no control file with Package and Version", file)
	}
	if d.files == nil {
		return nil, fmt.Errorf("%s: no data.tar member", file)
	}
	return d, nil
}

func decompress(name string, b []byte) (io.Reader, error) {
	switch path.Ext(name) {
	case ".gz":
		return gzip.NewReader(bytes.NewReader(b))
	case ".xz":
		return xz.NewReader(bytes.NewReader(b))
	case ".zst":
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		return zr.IOReadCloser(), nil
	case ".tar":
		return bytes.NewReader(b), nil
	}
	return nil, fmt.Errorf("compression %q not supported", path.Ext(name))
}

// readTar reads every entry of a tar stream into memory (names cleaned of
// "./"; the root entry dropped), at most max bytes of content in all.
func readTar(r io.Reader, max int64) ([]File, error) {
	tr := tar.NewReader(r)
	var out []File
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(h.Name, "./")
		if name == "" || name == "." {
			continue
		}
		if strings.HasPrefix(name, "/") || strings.Contains("/"+name+"/", "/../") {
			return nil, fmt.Errorf("unsafe entry %q", h.Name)
		}
		f := File{Name: name, Type: h.Typeflag, Mode: h.Mode & 0o7777, Link: h.Linkname}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			f.Type = tar.TypeReg
			total += h.Size
			if total > max {
				return nil, fmt.Errorf("more than %d MiB of content", max>>20)
			}
			if f.Body, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		case tar.TypeLink:
			f.Link = strings.TrimPrefix(h.Linkname, "./")
		case tar.TypeDir, tar.TypeSymlink:
		default:
			return nil, fmt.Errorf("entry %q: tar type %q not supported", h.Name, h.Typeflag)
		}
		out = append(out, f)
	}
}

// parseControl reads the fields of a Debian control file; a multi-line
// field keeps its first line.
func parseControl(b []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// alpineVersion turns a Debian version into an Alpine one: no epoch, the
// leading dotted number of the upstream version, "-r0"
// ("1:2.39.5-0+deb12u3" -> "2.39.5-r0", "20250419~deb12u2" -> "20250419-r0").
func alpineVersion(debVersion string) (string, error) {
	v := debVersion
	if _, after, ok := strings.Cut(v, ":"); ok {
		v = after
	}
	end := 0
	for end < len(v) && (v[end] >= '0' && v[end] <= '9' || v[end] == '.') {
		end++
	}
	num := strings.Trim(v[:end], ".")
	if num == "" || strings.Contains(num, "..") {
		return "", fmt.Errorf("Debian version %q has no leading number", debVersion)
	}
	return num + "-r0", nil
}
