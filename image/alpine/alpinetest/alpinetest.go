// Package alpinetest builds Alpine apk v2 packages, signed indexes and
// on-disk mirrors for tests: the other side of package alpine's reader.
// Keys are made at run time; nothing here is trusted by production code,
// which only ever verifies with alpine.ReleaseKeys(). A test hands the
// Key's Ring to alpine through Options.Keys, Extract or VerifyFile.
package alpinetest

import (
	"archive/tar"
	"bytes"
	stdgzip "compress/gzip"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/vibedom/vibedom/image/alpine"
)

// Key is a signing key made at run time.
type Key struct {
	// Name is the Alpine key file name signatures carry
	// (".SIGN.RSA256.<Name>"), e.g. "test@vibedom-1.rsa.pub".
	Name    string
	Private *rsa.PrivateKey
	// PublicPEM is the public key as Alpine ships it (PKIX, PEM).
	PublicPEM []byte
	// Ring trusts this key, under Name, for every arch.
	Ring *alpine.Keyring
}

// NewKey makes a 2048-bit RSA key named name.
func NewKey(name string) (*Key, error) {
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return KeyFrom(name, priv)
}

// KeyFrom wraps an existing private key under name (a test signing with
// one key under another's name uses it).
func KeyFrom(name string, priv *rsa.PrivateKey) (*Key, error) {
	der, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return nil, err
	}
	k := &Key{Name: name, Private: priv, PublicPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), Ring: alpine.NewKeyring()}
	if err := k.Ring.Add(name, "", k.PublicPEM); err != nil {
		return nil, err
	}
	return k, nil
}

// As returns the same private key under another name (a forged name).
func (k *Key) As(name string) *Key {
	c, err := KeyFrom(name, k.Private)
	if err != nil {
		panic(err) // the key already marshalled once
	}
	return c
}

// File is one tar entry.
type File struct {
	Name string
	// Type is a tar type flag; 0 means tar.TypeReg.
	Type byte
	// Mode is the permission bits (with setuid etc.); 0 means 0644 for
	// files, 0755 for directories, 0777 for symlinks.
	Mode     int64
	UID, GID int
	Body     []byte
	// Link is a symlink's target or a hard link's earlier entry.
	Link string
	// PAX records, e.g. "SCHILY.xattr.security.capability".
	PAX map[string]string
}

// epoch is every entry's mtime, so builds are reproducible.
var epoch = time.Unix(1700000000, 0).UTC()

// GzipTar writes files as one gzip member holding a tar stream; end adds
// tar's two zero end blocks (data and index members have them, signature
// and control members do not, as abuild writes them).
func GzipTar(files []File, end bool) ([]byte, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		typ := f.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := f.Mode
		if mode == 0 {
			switch typ {
			case tar.TypeDir:
				mode = 0o755
			case tar.TypeSymlink:
				mode = 0o777
			default:
				mode = 0o644
			}
		}
		h := &tar.Header{Name: f.Name, Linkname: f.Link, Typeflag: typ, Mode: mode, Uid: f.UID, Gid: f.GID,
			ModTime: epoch, Format: tar.FormatPAX, PAXRecords: f.PAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(f.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
		if _, err := tw.Write(f.Body); err != nil {
			return nil, fmt.Errorf("tar %s: %w", f.Name, err)
		}
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	if end {
		if err := tw.Close(); err != nil {
			return nil, err
		}
	}
	var out bytes.Buffer
	// klauspost's gzip: the same format, faster; package alpine reads it
	// with the standard library's, so the two implementations check each
	// other.
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Sign returns a signature member over member's bytes: ".SIGN.RSA256.<Name>"
// (SHA-256, as indexes are signed) or ".SIGN.RSA.<Name>" (SHA-1, as
// packages are).
func (k *Key) Sign(member []byte, useSHA256 bool) ([]byte, error) {
	var sig []byte
	var err error
	name := ".SIGN.RSA." + k.Name
	if useSHA256 {
		d := sha256.Sum256(member)
		sig, err = rsa.SignPKCS1v15(rand.Reader, k.Private, crypto.SHA256, d[:])
		name = ".SIGN.RSA256." + k.Name
	} else {
		d := sha1.Sum(member)
		sig, err = rsa.SignPKCS1v15(rand.Reader, k.Private, crypto.SHA1, d[:])
	}
	if err != nil {
		return nil, err
	}
	return GzipTar([]File{{Name: name, Body: sig}}, false)
}

// Spec describes a package to build.
type Spec struct {
	Name, Version, Arch string
	Description         string
	// Depends are D: entries ("so:libc.so.6", "/bin/sh", "name>=1", "!x").
	Depends []string
	// Provides are p: entries ("so:libz.so.1=1.3", "cmd:git=2.45-r0").
	Provides []string
	// Priority is k: (provider_priority).
	Priority int
	// Files is the data member; nil means one placeholder file,
	// usr/share/<name> holding "hello from <name>". Use an empty,
	// non-nil slice for a package with no files.
	Files []File
	// PKGINFOArch, when set, is written as .PKGINFO's arch instead of
	// Arch (a package built for another arch than its index says).
	PKGINFOArch string
	// Key signs the package (required).
	Key *Key
}

// BuildAPK returns an apk v2 file (signature, control and data members)
// and the index record that describes it.
func BuildAPK(s Spec) ([]byte, *alpine.Package, error) {
	if s.Key == nil {
		return nil, nil, errors.New("alpinetest: Spec.Key is required")
	}
	u, err := buildUnsigned(s, nil)
	if err != nil {
		return nil, nil, err
	}
	return u.sign(s.Key)
}

// unsigned is a package without its signature member: what the test
// mirror caches, since its key is made anew by every run.
type unsigned struct {
	Control []byte         `json:"-"`
	Data    []byte         `json:"-"`
	Record  alpine.Package // Size is set by sign
}

// sign prepends a signature member by k.
func (u *unsigned) sign(k *Key) ([]byte, *alpine.Package, error) {
	sig, err := k.Sign(u.Control, false)
	if err != nil {
		return nil, nil, err
	}
	apk := make([]byte, 0, len(sig)+len(u.Control)+len(u.Data))
	apk = append(append(append(apk, sig...), u.Control...), u.Data...)
	p := u.Record
	p.Size = int64(len(apk))
	p.Depends = append([]string(nil), p.Depends...)
	p.Provides = append([]string(nil), p.Provides...)
	return apk, &p, nil
}

// buildUnsigned makes the control and data members of s; data, when not
// nil, is a ready data member (installed is then its files' size).
func buildUnsigned(s Spec, data []byte, installedSize ...int64) (*unsigned, error) {
	if s.Name == "" || s.Version == "" || s.Arch == "" {
		return nil, errors.New("alpinetest: Spec needs Name, Version and Arch")
	}
	var installed int64
	if data == nil {
		files := s.Files
		if files == nil {
			files = []File{{Name: "usr/", Type: tar.TypeDir}, {Name: "usr/share/" + s.Name, Body: []byte("hello from " + s.Name)}}
		}
		for _, f := range files {
			installed += int64(len(f.Body))
		}
		var err error
		if data, err = GzipTar(files, true); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
	} else if len(installedSize) > 0 {
		installed = installedSize[0]
	}
	ds := sha256.Sum256(data)
	arch := s.Arch
	if s.PKGINFOArch != "" {
		arch = s.PKGINFOArch
	}
	var info strings.Builder
	fmt.Fprintf(&info, "# Generated by vibedom alpinetest\npkgname = %s\npkgver = %s\n", s.Name, s.Version)
	if s.Description != "" {
		fmt.Fprintf(&info, "pkgdesc = %s\n", s.Description)
	}
	fmt.Fprintf(&info, "arch = %s\nsize = %d\norigin = %s\n", arch, installed, s.Name)
	for _, d := range s.Depends {
		fmt.Fprintf(&info, "depend = %s\n", d)
	}
	for _, p := range s.Provides {
		fmt.Fprintf(&info, "provides = %s\n", p)
	}
	if s.Priority != 0 {
		fmt.Fprintf(&info, "provider_priority = %d\n", s.Priority)
	}
	fmt.Fprintf(&info, "datahash = %s\n", hex.EncodeToString(ds[:]))
	ctl, err := GzipTar([]File{{Name: ".PKGINFO", Body: []byte(info.String())}}, false)
	if err != nil {
		return nil, err
	}
	cs := sha1.Sum(ctl)
	return &unsigned{Control: ctl, Data: data, Record: alpine.Package{
		Name: s.Name, Version: s.Version, Arch: s.Arch, Installed: installed,
		Checksum: "Q1" + base64.StdEncoding.EncodeToString(cs[:]),
		Depends:  s.Depends, Provides: s.Provides, Priority: s.Priority, Origin: s.Name,
		Description: s.Description,
	}}, nil
}

// IndexText renders records as APKINDEX text, in the order given.
func IndexText(pkgs []*alpine.Package) string {
	var b strings.Builder
	for _, p := range pkgs {
		installed := p.Installed
		if installed == 0 {
			installed = p.Size * 2
		}
		fmt.Fprintf(&b, "C:%s\nP:%s\nV:%s\nA:%s\nS:%d\nI:%d\n", p.Checksum, p.Name, p.Version, p.Arch, p.Size, installed)
		if p.Description != "" {
			fmt.Fprintf(&b, "T:%s\n", p.Description)
		}
		if p.Origin != "" {
			fmt.Fprintf(&b, "o:%s\n", p.Origin)
		}
		if len(p.Depends) > 0 {
			fmt.Fprintf(&b, "D:%s\n", strings.Join(p.Depends, " "))
		}
		if len(p.Provides) > 0 {
			fmt.Fprintf(&b, "p:%s\n", strings.Join(p.Provides, " "))
		}
		if p.Priority != 0 {
			fmt.Fprintf(&b, "k:%d\n", p.Priority)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// BuildIndex returns an APKINDEX.tar.gz holding pkgs (sorted by name,
// stable) and desc, signed by k with SHA-256 as Alpine signs indexes.
func BuildIndex(k *Key, pkgs []*alpine.Package, desc string) ([]byte, error) {
	sorted := append([]*alpine.Package(nil), pkgs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	idx, err := GzipTar([]File{{Name: "DESCRIPTION", Body: []byte(desc)}, {Name: "APKINDEX", Body: []byte(IndexText(sorted))}}, true)
	if err != nil {
		return nil, err
	}
	sig, err := k.Sign(idx, true)
	if err != nil {
		return nil, err
	}
	return append(sig, idx...), nil
}

// Members splits an apk or index file into its gzip members, byte-exact
// (a tamper test swaps one).
func Members(file []byte) ([][]byte, error) {
	var out [][]byte
	r := &countReader{b: file}
	for r.off < len(file) {
		start := r.off
		zr, err := stdgzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("member %d at byte %d: %w", len(out)+1, start, err)
		}
		zr.Multistream(false)
		if _, err := io.Copy(io.Discard, zr); err != nil {
			return nil, fmt.Errorf("member %d at byte %d: %w", len(out)+1, start, err)
		}
		out = append(out, file[start:r.off])
	}
	return out, nil
}

// countReader is an io.ByteReader, so gzip reads no byte past a member.
type countReader struct {
	b   []byte
	off int
}

func (c *countReader) Read(p []byte) (int, error) {
	if c.off >= len(c.b) {
		return 0, io.EOF
	}
	n := copy(p, c.b[c.off:])
	c.off += n
	return n, nil
}

func (c *countReader) ReadByte() (byte, error) {
	if c.off >= len(c.b) {
		return 0, io.EOF
	}
	c.off++
	return c.b[c.off-1], nil
}
