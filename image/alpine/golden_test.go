package alpine_test

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/image/alpine"
	"github.com/vibedom/vibedom/image/alpine/alpinetest"
)

// TestGoldenIndexes verifies real Alpine indexes (from apko's testdata:
// v3.16 x86_64 signed by 6165ee59, v3.17 aarch64 signed by 616ae350)
// with the embedded keys, and refuses them under any other key or arch.
func TestGoldenIndexes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		dir, arch, desc string
		min             int
	}{
		{"alpine-316-x86_64", "x86_64", "v3.16.3-13-g4d933a1fa3", 1000},
		{"alpine-317-aarch64", "aarch64", "v3.17.3-216-g54a39ace82a", 1000},
	}
	for _, c := range cases {
		t.Run(c.dir, func(t *testing.T) {
			path := filepath.Join("testdata", c.dir, alpine.IndexFile)
			open := func() *os.File {
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				return f
			}
			idx, err := alpine.ReadIndex(path, "main", c.arch, open(), alpine.ReleaseKeys())
			if err != nil {
				t.Fatal(err)
			}
			if idx.Description != c.desc || len(idx.Packages) < c.min {
				t.Fatalf("description %q, %d packages", idx.Description, len(idx.Packages))
			}
			found := false
			for _, p := range idx.Packages {
				if p.Name == "alpine-baselayout" && len(p.Depends) > 0 {
					found = true
				}
			}
			if !found {
				t.Error("alpine-baselayout record missing or without depends")
			}
			// Any other key under the same name fails.
			_, evil := keys(t)
			_ = evil
			other := testRing(t)
			if _, err := alpine.ReadIndex(path, "main", c.arch, open(), other); !errors.Is(err, alpine.ErrSignature) {
				t.Errorf("with a foreign keyring: %v, want ErrSignature", err)
			}
			swapped := alpine.WithPublicKey(alpine.ReleaseKeys(), &testKey.Private.PublicKey)
			if _, err := alpine.ReadIndex(path, "main", c.arch, open(), swapped); !errors.Is(err, alpine.ErrSignature) {
				t.Errorf("with another key under Alpine's name: %v, want ErrSignature", err)
			}
			wrong := "aarch64"
			if c.arch == wrong {
				wrong = "x86_64"
			}
			if _, err := alpine.ReadIndex(path, "main", wrong, open(), alpine.ReleaseKeys()); !errors.Is(err, alpine.ErrSignature) {
				t.Errorf("as an index for %s: %v, want ErrSignature", wrong, err)
			}
		})
	}
}

// TestGoldenPackage verifies a real Alpine package (alpine-baselayout
// 3.2.0-r23, aarch64): signature by 616ae350, control SHA-1, datahash.
func TestGoldenPackage(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "alpine-baselayout-3.2.0-r23.apk")
	p := alpine.LockedPackage{Name: "alpine-baselayout", Version: "3.2.0-r23", Arch: "aarch64", Repo: "main",
		Checksum: "Q1LLq2qDNrS/qRnhxQ3hsY/sHbQnc=", Size: 11012}
	if err := alpine.VerifyFile(path, "aarch64", p, nil); err != nil {
		t.Fatal(err)
	}
	var fs memFS
	if err := alpine.Extract(path, "aarch64", p, nil, &fs); err != nil {
		t.Fatal(err)
	}
	if _, ok := fs.content["sbin/mkmntdirs"]; !ok || len(fs.entries) < 20 {
		t.Errorf("%d entries, sbin/mkmntdirs present: %v", len(fs.entries), ok)
	}
	bad := p
	bad.Checksum = "Q1" + "AAAAAAAAAAAAAAAAAAAAAAAAAAA="
	if err := alpine.VerifyFile(path, "aarch64", bad, nil); !errors.Is(err, alpine.ErrChecksum) {
		t.Errorf("wrong index checksum: %v, want ErrChecksum", err)
	}
	if err := alpine.VerifyFile(path, "x86_64", p, nil); err == nil {
		t.Error("an aarch64 package verified for x86_64")
	}
	// One flipped byte in the data member breaks the datahash.
	b, _ := os.ReadFile(path)
	b[len(b)-100] ^= 0xff
	tampered := filepath.Join(t.TempDir(), "x.apk")
	os.WriteFile(tampered, b, 0o644)
	if err := alpine.VerifyFile(tampered, "aarch64", p, nil); err == nil {
		t.Error("a tampered data member verified")
	}
}

// TestSeveralSignatures: apk files may carry more than one signature; one
// by a trusted key for the arch suffices, and none is reported with the
// reason for each.
func TestSeveralSignatures(t *testing.T) {
	t.Parallel()
	k, evil := keys(t)
	idx := gzTar(t, []alpinetest.File{{Name: "DESCRIPTION", Body: []byte("d")}, {Name: "APKINDEX", Body: []byte("")}}, true)
	sigOf := func(key *alpinetest.Key, name string) alpinetest.File {
		d := sha256.Sum256(idx)
		s, err := rsa.SignPKCS1v15(rand.Reader, key.Private, crypto.SHA256, d[:])
		if err != nil {
			t.Fatal(err)
		}
		return alpinetest.File{Name: ".SIGN.RSA256." + name, Body: s}
	}
	for _, c := range []struct {
		name string
		sigs []alpinetest.File
		ok   bool
		msg  string
	}{
		{"unknown key first, trusted second", []alpinetest.File{sigOf(evil, "new-key.rsa.pub"), sigOf(k, testKeyName)}, true, ""},
		{"forged under the trusted name, trusted second", []alpinetest.File{sigOf(evil, testKeyName), sigOf(k, testKeyName)}, true, ""},
		{"none trusted", []alpinetest.File{sigOf(evil, "new-key.rsa.pub"), sigOf(evil, testKeyName)}, false, `does not trust`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := append(gzTar(t, c.sigs, false), idx...)
			_, err := alpine.ReadIndex("APKINDEX.tar.gz", "main", "x86_64", bytes.NewReader(file), testRing(t))
			if c.ok != (err == nil) || (err != nil && (!errors.Is(err, alpine.ErrSignature) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "does not verify"))) {
				t.Fatalf("err %v", err)
			}
		})
	}
}
