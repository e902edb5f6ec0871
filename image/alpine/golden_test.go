package alpine

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseKeysPinned fails when an embedded key changes, appears or
// goes: a change of trust must be a deliberate edit of this table.
func TestReleaseKeysPinned(t *testing.T) {
	want := map[string]string{
		"alpine-devel@lists.alpinelinux.org-616ae350.rsa.pub": "d11f6b21c61b4274e182eb888883a8ba8acdbf820dcc7a6d82a7d9fc2fd2836d",
		"alpine-devel@lists.alpinelinux.org-6165ee59.rsa.pub": "207e4696d3c05f7cb05966aee557307151f1f00217af4143c1bcaf33b8df733f",
	}
	ents, err := releaseKeyFiles.ReadDir("keys")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(want) {
		t.Fatalf("%d embedded keys, want %d", len(ents), len(want))
	}
	for _, e := range ents {
		b, _ := releaseKeyFiles.ReadFile("keys/" + e.Name())
		s := sha256.Sum256(b)
		if got := hex.EncodeToString(s[:]); got != want[e.Name()] {
			t.Errorf("key %s: sha256 %s, want %s", e.Name(), got, want[e.Name()])
		}
	}
	if got := ReleaseKeys().Names(); len(got) != len(want) {
		t.Errorf("ReleaseKeys has %v", got)
	}
}

// TestGoldenIndexes verifies real Alpine indexes (from apko's testdata:
// v3.16 x86_64 signed by 6165ee59, v3.17 aarch64 signed by 616ae350)
// with the embedded keys, and refuses them under any other key or arch.
func TestGoldenIndexes(t *testing.T) {
	cases := []struct {
		dir, arch, desc string
		min             int
	}{
		{"alpine-316-x86_64", "x86_64", "v3.16.3-13-g4d933a1fa3", 1000},
		{"alpine-317-aarch64", "aarch64", "v3.17.3-216-g54a39ace82a", 1000},
	}
	for _, c := range cases {
		t.Run(c.dir, func(t *testing.T) {
			path := filepath.Join("testdata", c.dir, IndexFile)
			open := func() *os.File {
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				return f
			}
			idx, err := ReadIndex(path, "main", c.arch, open(), ReleaseKeys())
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
			if _, err := ReadIndex(path, "main", c.arch, open(), other); !errors.Is(err, ErrSignature) {
				t.Errorf("with a foreign keyring: %v, want ErrSignature", err)
			}
			swapped := NewKeyring()
			for name, k := range ReleaseKeys().keys {
				swapped.keys[name] = ringKey{pub: &testKey.PublicKey, arch: k.arch}
			}
			if _, err := ReadIndex(path, "main", c.arch, open(), swapped); !errors.Is(err, ErrSignature) {
				t.Errorf("with another key under Alpine's name: %v, want ErrSignature", err)
			}
			wrong := "aarch64"
			if c.arch == wrong {
				wrong = "x86_64"
			}
			if _, err := ReadIndex(path, "main", wrong, open(), ReleaseKeys()); !errors.Is(err, ErrSignature) {
				t.Errorf("as an index for %s: %v, want ErrSignature", wrong, err)
			}
		})
	}
}

// TestGoldenPackage verifies a real Alpine package (alpine-baselayout
// 3.2.0-r23, aarch64): signature by 616ae350, control SHA-1, datahash.
func TestGoldenPackage(t *testing.T) {
	path := filepath.Join("testdata", "alpine-baselayout-3.2.0-r23.apk")
	p := LockedPackage{Name: "alpine-baselayout", Version: "3.2.0-r23", Arch: "aarch64", Repo: "main",
		Checksum: "Q1LLq2qDNrS/qRnhxQ3hsY/sHbQnc=", Size: 11012}
	if err := VerifyFile(path, "aarch64", p, nil); err != nil {
		t.Fatal(err)
	}
	var fs memFS
	if err := Extract(path, "aarch64", p, nil, &fs); err != nil {
		t.Fatal(err)
	}
	if _, ok := fs.content["sbin/mkmntdirs"]; !ok || len(fs.entries) < 20 {
		t.Errorf("%d entries, sbin/mkmntdirs present: %v", len(fs.entries), ok)
	}
	bad := p
	bad.Checksum = "Q1" + "AAAAAAAAAAAAAAAAAAAAAAAAAAA="
	if err := VerifyFile(path, "aarch64", bad, nil); !errors.Is(err, ErrChecksum) {
		t.Errorf("wrong index checksum: %v, want ErrChecksum", err)
	}
	if err := VerifyFile(path, "x86_64", p, nil); err == nil {
		t.Error("an aarch64 package verified for x86_64")
	}
	// One flipped byte in the data member breaks the datahash.
	b, _ := os.ReadFile(path)
	b[len(b)-100] ^= 0xff
	tampered := filepath.Join(t.TempDir(), "x.apk")
	os.WriteFile(tampered, b, 0o644)
	if err := VerifyFile(tampered, "aarch64", p, nil); err == nil {
		t.Error("a tampered data member verified")
	}
}

// TestSeveralSignatures: apk files may carry more than one signature; one
// by a trusted key for the arch suffices, and none is reported with the
// reason for each.
func TestSeveralSignatures(t *testing.T) {
	k, evil := keys(t)
	idx := gzTar(t, []tent{{name: "DESCRIPTION", body: "d"}, {name: "APKINDEX", body: ""}}, true)
	sigOf := func(key *rsa.PrivateKey, name string) tent {
		d := sha256.Sum256(idx)
		s, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, d[:])
		if err != nil {
			t.Fatal(err)
		}
		return tent{name: ".SIGN.RSA256." + name, body: string(s)}
	}
	for _, c := range []struct {
		name string
		sigs []tent
		ok   bool
		msg  string
	}{
		{"unknown key first, trusted second", []tent{sigOf(evil, "new-key.rsa.pub"), sigOf(k, testKeyName)}, true, ""},
		{"forged under the trusted name, trusted second", []tent{sigOf(evil, testKeyName), sigOf(k, testKeyName)}, true, ""},
		{"none trusted", []tent{sigOf(evil, "new-key.rsa.pub"), sigOf(evil, testKeyName)}, false, `does not trust`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := append(gzTar(t, c.sigs, false), idx...)
			_, err := ReadIndex("APKINDEX.tar.gz", "main", "x86_64", bytes.NewReader(file), testRing(t))
			if c.ok != (err == nil) || (err != nil && (!errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "does not verify"))) {
				t.Fatalf("err %v", err)
			}
		})
	}
}
