package alpine

import "crypto/rsa"

// Internals the external tests (package alpine_test) look at.

const (
	PartialDir    = partialDir
	MaxSignature  = maxSignature
	MaxSignatures = maxSignatures
)

// WithPublicKey returns a copy of k with every key's public half replaced
// by pub, names and arches kept: another key under a trusted name.
func WithPublicKey(k *Keyring, pub *rsa.PublicKey) *Keyring {
	out := NewKeyring()
	for name, rk := range k.keys {
		out.keys[name] = ringKey{pub: pub, arch: rk.arch}
	}
	return out
}
