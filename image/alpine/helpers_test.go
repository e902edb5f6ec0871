package alpine

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Test keys are made at run time; none is stored in the repository.
var (
	keyOnce          sync.Once
	testKey, evilKey *rsa.PrivateKey
)

const testKeyName = "test@vibedom-1.rsa.pub"

func keys(t testing.TB) (*rsa.PrivateKey, *rsa.PrivateKey) {
	keyOnce.Do(func() {
		var err error
		if testKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if evilKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
	})
	return testKey, evilKey
}

// testRing trusts the test key under testKeyName for every arch.
func testRing(t testing.TB) *Keyring {
	k, _ := keys(t)
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	r := NewKeyring()
	if err := r.Add(testKeyName, "", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})); err != nil {
		t.Fatal(err)
	}
	return r
}

type tent struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	pax        map[string]string
}

// gzTar writes entries as one gzip member; end adds tar's end blocks.
func gzTar(t testing.TB, ents []tent, end bool) []byte {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range ents {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Format: tar.FormatPAX, PAXRecords: e.pax}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	b := raw.Bytes()
	if end {
		tw.Close()
		b = raw.Bytes()
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

// signMember returns a signature member over member's bytes.
func signMember(t testing.TB, k *rsa.PrivateKey, keyName string, sha256sig bool, member []byte) []byte {
	var sig []byte
	var err error
	name := ".SIGN.RSA." + keyName
	if sha256sig {
		d := sha256.Sum256(member)
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, d[:])
		name = ".SIGN.RSA256." + keyName
	} else {
		d := sha1.Sum(member)
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA1, d[:])
	}
	if err != nil {
		t.Fatal(err)
	}
	return gzTar(t, []tent{{name: name, body: string(sig)}}, false)
}

// apkSpec describes a test package.
type apkSpec struct {
	name, version, arch string
	depends, provides   []string
	files               []tent
	// pkginfoArch overrides .PKGINFO's arch (a wrong-arch package).
	pkginfoArch string
	// key signs the package; nil means the test key.
	key *rsa.PrivateKey
}

// buildAPK returns a valid apk v2 file and its index record.
func buildAPK(t testing.TB, s apkSpec) ([]byte, *Package) {
	k, _ := keys(t)
	if s.key != nil {
		k = s.key
	}
	files := s.files
	if files == nil {
		files = []tent{{name: "usr/", typ: tar.TypeDir, mode: 0o755}, {name: "usr/share/" + s.name, body: "hello from " + s.name}}
	}
	data := gzTar(t, files, true)
	ds := sha256.Sum256(data)
	arch := s.arch
	if s.pkginfoArch != "" {
		arch = s.pkginfoArch
	}
	var info strings.Builder
	fmt.Fprintf(&info, "# test\npkgname = %s\npkgver = %s\narch = %s\nsize = 1\n", s.name, s.version, arch)
	for _, d := range s.depends {
		fmt.Fprintf(&info, "depend = %s\n", d)
	}
	for _, p := range s.provides {
		fmt.Fprintf(&info, "provides = %s\n", p)
	}
	fmt.Fprintf(&info, "datahash = %s\n", hex.EncodeToString(ds[:]))
	ctl := gzTar(t, []tent{{name: ".PKGINFO", body: info.String()}}, false)
	sig := signMember(t, k, testKeyName, false, ctl)
	cs := sha1.Sum(ctl)
	apk := append(append(append([]byte{}, sig...), ctl...), data...)
	return apk, &Package{
		Name: s.name, Version: s.version, Arch: s.arch, Size: int64(len(apk)),
		Checksum: "Q1" + base64.StdEncoding.EncodeToString(cs[:]),
		Depends:  s.depends, Provides: s.provides,
	}
}

// indexText renders records as APKINDEX text.
func indexText(pkgs []*Package) string {
	var b strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&b, "C:%s\nP:%s\nV:%s\nA:%s\nS:%d\nI:%d\n", p.Checksum, p.Name, p.Version, p.Arch, p.Size, p.Size*2)
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

// buildIndex returns a signed APKINDEX.tar.gz.
func buildIndex(t testing.TB, k *rsa.PrivateKey, keyName string, pkgs []*Package, desc string) []byte {
	sorted := append([]*Package(nil), pkgs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	idx := gzTar(t, []tent{{name: "DESCRIPTION", body: desc}, {name: "APKINDEX", body: indexText(sorted)}}, true)
	return append(signMember(t, k, keyName, true, idx), idx...)
}

// memFS is an EntryWriter that keeps entries in memory.
type memFS struct {
	entries []Entry
	content map[string]string
}

func (m *memFS) WriteEntry(e Entry, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if int64(len(b)) != e.Size {
		return fmt.Errorf("got %d bytes for %s, entry says %d", len(b), e.Path, e.Size)
	}
	if m.content == nil {
		m.content = map[string]string{}
	}
	m.entries = append(m.entries, e)
	m.content[e.Path] = string(b)
	return nil
}
