// Package credentials keeps the agents' API keys on the host. The guest
// gets, per session, a placeholder of the same shape; the host's proxy puts
// the real key in place of the placeholder only in the provider's own auth
// header on requests to the provider's API host, and refuses any request
// that carries a placeholder anywhere else.
package credentials

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"path/filepath"
	"strings"
)

// Provider is a model API whose key vibedom holds.
type Provider struct {
	Name string
	// Env is the variable the key comes from on the host and the one the
	// guest's placeholder is put in.
	Env string
	// Host is the API host; the swap happens only on requests to it,
	// port 443.
	Host string
	// Header is the auth header the key goes in: "x-api-key" takes the
	// key as is, "authorization" as "Bearer <key>".
	Header string
}

// Providers are the known providers, by name.
var Providers = []Provider{
	{Name: "anthropic", Env: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Header: "x-api-key"},
	{Name: "openai", Env: "OPENAI_API_KEY", Host: "api.openai.com", Header: "authorization"},
	{Name: "gemini", Env: "GEMINI_API_KEY", Host: "generativelanguage.googleapis.com", Header: "x-goog-api-key"},
}

// Names lists the providers' names.
func Names() []string {
	var n []string
	for _, p := range Providers {
		n = append(n, p.Name)
	}
	return n
}

// Lookup finds a provider by name.
func Lookup(name string) (Provider, error) {
	for _, p := range Providers {
		if p.Name == name {
			return p, nil
		}
	}
	return Provider{}, fmt.Errorf("unknown provider %q: use one of %s", name, strings.Join(Names(), ", "))
}

// Dir is where `vibedom auth set` keeps keys: <home>/credentials.
func Dir(home string) string { return filepath.Join(home, "credentials") }

// maxKey bounds a key.
const maxKey = 4096

// CheckKey refuses what cannot be an API key.
func CheckKey(k string) error {
	switch {
	case k == "":
		return errors.New("the key is empty")
	case len(k) > maxKey:
		return fmt.Errorf("the key is longer than %d bytes", maxKey)
	case len(k) < 16:
		return errors.New("the key is shorter than 16 characters: that is no API key")
	}
	for _, c := range k {
		if c <= ' ' || c > '~' {
			return errors.New("the key holds spaces or characters outside printable ASCII")
		}
	}
	return nil
}

// Store keeps provider's key, replacing what was there: in
// <home>/credentials/<provider> (0600, the folder 0700), or the login
// Keychain on macOS.
func Store(home string, p Provider, key string) error {
	key = strings.TrimSpace(key)
	if err := CheckKey(key); err != nil {
		return err
	}
	return newStore(home).put(p.Name, []byte(key+"\n"))
}

// Remove deletes provider's stored key; a missing one is not an error.
func Remove(home string, p Provider) error {
	return newStore(home).del(p.Name)
}

// Where says where provider's key is stored: a file, or the login
// Keychain on macOS.
func Where(home string, p Provider) string { return newStore(home).where(p.Name) }

// Key is a provider's real key and where it came from.
type Key struct {
	Provider Provider
	value    string
	Source   string // "$ANTHROPIC_API_KEY" or the file
}

// String never shows the key.
func (k Key) String() string { return k.Provider.Name + " key from " + k.Source }

// Fingerprint is a short, non-reversible name for the key.
func (k Key) Fingerprint() string {
	s := sha256.Sum256([]byte(k.value))
	return "sha256:" + hex.EncodeToString(s[:6])
}

// Load returns the keys the host has: the environment first (it wins),
// then <home>/credentials. getenv is os.Getenv in production.
func Load(home string, getenv func(string) string) ([]Key, error) {
	var out []Key
	for _, p := range Providers {
		if v := strings.TrimSpace(getenv(p.Env)); v != "" {
			if err := CheckKey(v); err != nil {
				return nil, fmt.Errorf("$%s: %w", p.Env, err)
			}
			out = append(out, Key{Provider: p, value: v, Source: "$" + p.Env})
			continue
		}
		st := newStore(home)
		f := st.where(p.Name)
		b, err := st.get(p.Name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		v := strings.TrimSpace(string(b))
		if err := CheckKey(v); err != nil {
			return nil, fmt.Errorf("%s: %w (vibedom auth set %s)", f, err, p.Name)
		}
		out = append(out, Key{Provider: p, value: v, Source: f})
	}
	return out, nil
}

// Prefixes are the fixed, public prefixes of each provider's key kinds,
// longest first: a placeholder starts with the one the key starts with and
// holds nothing else of the key.
var prefixes = map[string][]string{
	"anthropic": {"sk-ant-admin01-", "sk-ant-api03-", "sk-ant-oat01-", "sk-ant-ort01-", "sk-ant-"},
	"openai":    {"sk-svcacct-", "sk-admin-", "sk-proj-", "sk-None-", "sk-"},
	"gemini":    {"AIza"},
}

// placeholderAlphabet is what follows the prefix: the characters both
// providers' keys use.
const placeholderAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"

// minShared is the shortest run of the key's secret part a placeholder may
// not contain.
const minShared = 4

// KeyPrefix is the fixed prefix of key's kind for p (sk-ant-api03-,
// sk-proj-, sk-), or "" when the key starts with none of them.
func KeyPrefix(p Provider, key string) string {
	for _, pre := range prefixes[p.Name] {
		if strings.HasPrefix(key, pre) {
			return pre
		}
	}
	return ""
}

// Placeholder makes a value of the key's shape for provider p: the fixed
// prefix of the key's kind (KeyPrefix), then random characters of one
// fixed alphabet to the key's length (every key of a kind has the same
// length, so the length tells nothing of this key). No real character of
// the key follows the prefix: the placeholder holds no run of minShared
// characters of the key's secret part (a random one that does is drawn
// again), and it never equals the key.
func Placeholder(p Provider, key string) (string, error) {
	prefix := KeyPrefix(p, key)
	secret := key[len(prefix):]
	for {
		b := make([]byte, len(secret))
		for i := range b {
			n, err := rand.Int(rand.Reader, big.NewInt(int64(len(placeholderAlphabet))))
			if err != nil {
				return "", err
			}
			b[i] = placeholderAlphabet[n.Int64()]
		}
		ph := prefix + string(b)
		// Runs wholly inside the public prefix are no secret; every other
		// run is checked.
		tail := ph[max(0, len(prefix)-(minShared-1)):]
		if ph != key && !sharesRun(tail, secret, minShared) {
			return ph, nil
		}
	}
}

// sharesRun reports whether a and b have a common substring of n bytes.
func sharesRun(a, b string, n int) bool {
	if len(a) < n || len(b) < n {
		return false
	}
	runs := make(map[string]bool, len(b))
	for i := 0; i+n <= len(b); i++ {
		runs[b[i:i+n]] = true
	}
	for i := 0; i+n <= len(a); i++ {
		if runs[a[i:i+n]] {
			return true
		}
	}
	return false
}
