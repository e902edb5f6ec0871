package alpine

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// pkgInfo is what vibedom reads of .PKGINFO.
type pkgInfo struct {
	name, version, arch, datahash string
}

func parsePKGINFO(file string, b []byte) (pkgInfo, error) {
	var pi pkgInfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), maxPKGINFO)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(l, " = ")
		if !ok {
			continue
		}
		switch k {
		case "pkgname":
			pi.name = v
		case "pkgver":
			pi.version = v
		case "arch":
			pi.arch = v
		case "datahash":
			pi.datahash = v
		}
	}
	if err := sc.Err(); err != nil {
		return pi, fmt.Errorf("%s: %w: .PKGINFO: %v", file, ErrFormat, err)
	}
	return pi, nil
}

// walkPackage reads the apk at path and checks it against p: size, the
// index checksum over the control member, the package signature, the
// .PKGINFO name, version and arch, and the datahash over the data member.
// data, when not nil, sees the data member's tar stream as it is read;
// the datahash is only known at its end, so callers that must not act on
// unverified bytes check the file first with data == nil (VerifyFile).
func walkPackage(path string, p *Package, keys *Keyring, arch string, data func(*tar.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	name := p.File()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != p.Size {
		return fmt.Errorf("%s: %w: %d bytes, the index says %d", name, ErrChecksum, st.Size(), p.Size)
	}
	want, err := p.controlSHA1()
	if err != nil {
		return err
	}
	s := newAPKStream(name, io.LimitReader(f, p.Size))
	sigs, err := s.signature()
	if err != nil {
		return err
	}
	got, sum1, sum256, err := s.files("control", maxControl, maxPKGINFO, ".PKGINFO")
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(sum1, want) != 1 {
		return fmt.Errorf("%s: %w: control checksum differs from the index's %s", name, ErrChecksum, p.Checksum)
	}
	if err := keys.verify(name, arch, sigs, sum1, sum256); err != nil {
		return err
	}
	raw, ok := got[".PKGINFO"]
	if !ok {
		return fmt.Errorf("%s: %w: no .PKGINFO", name, ErrFormat)
	}
	pi, err := parsePKGINFO(name, raw)
	if err != nil {
		return err
	}
	if pi.name != p.Name || pi.version != p.Version {
		return fmt.Errorf("%s: %w: .PKGINFO names %s-%s", name, ErrChecksum, pi.name, pi.version)
	}
	// A noarch package's index record carries the repository's arch;
	// its .PKGINFO says noarch.
	if (pi.arch != arch && pi.arch != "noarch") || (p.Arch != arch && p.Arch != "noarch") {
		return fmt.Errorf("%s: %w: built for %s, wanted %s", name, ErrChecksum, pi.arch, arch)
	}
	wantData, err := hex.DecodeString(pi.datahash)
	if err != nil || len(wantData) != 32 {
		return fmt.Errorf("%s: %w: .PKGINFO has no sha256 datahash", name, ErrFormat)
	}
	tr, err := s.member("data", maxDataTotal)
	if err != nil {
		return err
	}
	if data != nil {
		if err := data(tr); err != nil {
			return err
		}
	}
	_, dsum, err := s.finish("data")
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(dsum, wantData) != 1 {
		return fmt.Errorf("%s: %w: data does not match .PKGINFO datahash", name, ErrChecksum)
	}
	if !s.mr.atEOF() {
		return fmt.Errorf("%s: %w: data after the data member", name, ErrFormat)
	}
	return nil
}

// VerifyFile checks the apk at path against its locked entry in a
// repository of arch: size, index checksum, signature (keys; nil means
// ReleaseKeys), .PKGINFO and datahash.
func VerifyFile(path, arch string, p LockedPackage, keys *Keyring) error {
	if keys == nil {
		keys = ReleaseKeys()
	}
	return walkPackage(path, p.pkg(), keys, arch, nil)
}
