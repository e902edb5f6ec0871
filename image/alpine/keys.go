package alpine

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"embed"
	"encoding/pem"
	"fmt"
	"path"
	"sort"
	"strings"
)

// releaseKeyFiles are Alpine's release signing keys, from the alpine-keys
// package, with the architecture each one signs. Only these verify
// production indexes and packages.
//
//go:embed keys/*.rsa.pub
var releaseKeyFiles embed.FS

// releaseKeyArches binds each embedded key to the architecture whose
// repositories it signs, so a key of one arch cannot vouch for another's
// index.
var releaseKeyArches = map[string]string{
	"alpine-devel@lists.alpinelinux.org-616ae350.rsa.pub": "aarch64",
	"alpine-devel@lists.alpinelinux.org-6165ee59.rsa.pub": "x86_64",
}

// Keyring maps key file names (as they appear in .SIGN.RSA.<name>) to
// public keys, each optionally bound to one arch.
type Keyring struct {
	keys map[string]ringKey
}

type ringKey struct {
	pub  *rsa.PublicKey
	arch string // "" = any arch
}

// NewKeyring returns an empty keyring.
func NewKeyring() *Keyring { return &Keyring{keys: map[string]ringKey{}} }

// Add parses a PEM public key under the file name signatures use; arch ""
// lets it sign for every arch.
func (k *Keyring) Add(name, arch string, pemBytes []byte) error {
	if strings.ContainsAny(name, "/\x00") || name == "" {
		return fmt.Errorf("key name %q: want a plain file name", name)
	}
	blk, _ := pem.Decode(pemBytes)
	if blk == nil {
		return fmt.Errorf("key %s: no PEM block", name)
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return fmt.Errorf("key %s: %w", name, err)
	}
	rk, ok := pub.(*rsa.PublicKey)
	if !ok {
		return fmt.Errorf("key %s: not an RSA key", name)
	}
	k.keys[name] = ringKey{pub: rk, arch: arch}
	return nil
}

// Names lists the key names, sorted.
func (k *Keyring) Names() []string {
	out := make([]string, 0, len(k.keys))
	for n := range k.keys {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ReleaseKeys returns the embedded Alpine release keys.
func ReleaseKeys() *Keyring {
	k := NewKeyring()
	ents, err := releaseKeyFiles.ReadDir("keys")
	if err != nil {
		panic(err) // embedded at build time
	}
	for _, e := range ents {
		b, err := releaseKeyFiles.ReadFile(path.Join("keys", e.Name()))
		if err != nil {
			panic(err)
		}
		arch, ok := releaseKeyArches[e.Name()]
		if !ok {
			panic("alpine: embedded key " + e.Name() + " has no arch in releaseKeyArches")
		}
		if err := k.Add(e.Name(), arch, b); err != nil {
			panic(err)
		}
	}
	return k
}

// sigAlgo is the digest a signature entry's name announces.
type sigAlgo int

const (
	sigSHA1 sigAlgo = iota
	sigSHA256
)

// parseSigName splits ".SIGN.RSA.<key>" / ".SIGN.RSA256.<key>".
func parseSigName(name string) (sigAlgo, string, bool) {
	if k, ok := strings.CutPrefix(name, ".SIGN.RSA256."); ok && k != "" {
		return sigSHA256, k, true
	}
	if k, ok := strings.CutPrefix(name, ".SIGN.RSA."); ok && k != "" {
		return sigSHA1, k, true
	}
	return 0, "", false
}

// verify accepts a member when one of its signatures is by a trusted key
// for arch and verifies over the member's SHA-1 / SHA-256. Signatures by
// keys vibedom does not know are skipped, as apk does; if none is left,
// the error names them.
func (k *Keyring) verify(file, arch string, sigs []sigEntry, sum1, sum256 []byte) error {
	var problems []string
	for _, se := range sigs {
		algo, keyName, ok := parseSigName(se.name)
		if !ok {
			problems = append(problems, fmt.Sprintf("entry %q is not a signature", se.name))
			continue
		}
		rk, ok := k.keys[keyName]
		if !ok {
			problems = append(problems, fmt.Sprintf("signed with key %q, which vibedom does not trust (trusted: %s)", keyName, strings.Join(k.Names(), ", ")))
			continue
		}
		if rk.arch != "" && rk.arch != arch {
			problems = append(problems, fmt.Sprintf("key %q signs %s, not %s", keyName, rk.arch, arch))
			continue
		}
		var err error
		if algo == sigSHA256 {
			err = rsa.VerifyPKCS1v15(rk.pub, crypto.SHA256, sum256, se.sig)
		} else {
			err = rsa.VerifyPKCS1v15(rk.pub, crypto.SHA1, sum1, se.sig)
		}
		if err == nil {
			return nil
		}
		problems = append(problems, fmt.Sprintf("key %q does not verify it; the file was changed or corrupted in transit", keyName))
	}
	if len(problems) == 0 {
		problems = append(problems, "no signature")
	}
	return fmt.Errorf("%s: %w: %s", file, ErrSignature, strings.Join(problems, "; "))
}
