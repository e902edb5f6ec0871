package credentials

import (
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/childenv"
)

func TestPlaceholderShape(t *testing.T) {
	t.Parallel()
	a, _ := Lookup("anthropic")
	o, _ := Lookup("openai")
	for _, c := range []struct {
		p      Provider
		key    string
		prefix string
	}{
		{a, "sk-ant-api03-" + strings.Repeat("aB3_-x", 15) + "AA", "sk-ant-api03-"}, // gitleaks:allow
		{o, "sk-proj-" + strings.Repeat("Zz9", 40), "sk-proj-"},                     // gitleaks:allow
		{o, "sk-proj-Qm4_Rz-CxYz" + strings.Repeat("k", 30), "sk-proj-"},            // gitleaks:allow
		{o, "sk-" + strings.Repeat("Y7", 24), "sk-"},                                // gitleaks:allow
		{a, strings.Repeat("q", 40), ""},
	} {
		seen := map[string]bool{}
		for i := 0; i < 20; i++ {
			p, err := Placeholder(c.p, c.key)
			if err != nil {
				t.Fatal(err)
			}
			if p == c.key || len(p) != len(c.key) || seen[p] {
				t.Fatalf("placeholder %q for %q", p, c.key)
			}
			seen[p] = true
			if !strings.HasPrefix(p, c.prefix) || (c.prefix == "" && strings.HasPrefix(p, "sk-")) {
				t.Errorf("prefix of %q: %q, want %q", c.key, p, c.prefix)
			}
			if !regexp.MustCompile(`^[A-Za-z0-9_-]+$`).MatchString(p) {
				t.Errorf("alphabet: %q", p)
			}
		}
	}
}

// TestPlaceholderHoldsNoKeyCharacters (issue 18, item 14): the placeholder
// is the fixed prefix of the key's kind and random characters; no run of 4
// characters of the key's secret part (what follows that prefix) appears
// in it, for many random keys of each kind, and its length is the key's.
func TestPlaceholderHoldsNoKeyCharacters(t *testing.T) {
	t.Parallel()
	const alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	kinds := []struct {
		provider, prefix string
		n                int
	}{
		{"anthropic", "sk-ant-api03-", 95},
		{"openai", "sk-proj-", 156},
		{"openai", "sk-", 48},
	}
	rnd := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alpha[mrand.IntN(len(alpha))]
		}
		return string(b)
	}
	for _, k := range kinds {
		p, _ := Lookup(k.provider)
		for i := 0; i < 300; i++ {
			// The old rule copied up to the last - or _ in the first 16
			// characters: put some there.
			secret := rnd(3) + "_" + rnd(2) + "-" + rnd(k.n-7)
			key := k.prefix + secret
			ph, err := Placeholder(p, key)
			if err != nil {
				t.Fatal(err)
			}
			if len(ph) != len(key) || !strings.HasPrefix(ph, k.prefix) {
				t.Fatalf("placeholder %q for %q: want the prefix %q and the key's length", ph, key, k.prefix)
			}
			for j := len(k.prefix) - 3; j+4 <= len(ph); j++ {
				if strings.Contains(secret, ph[j:j+4]) {
					t.Fatalf("placeholder %q holds %q of the key's secret part %q", ph, ph[j:j+4], secret)
				}
			}
		}
	}
}

func TestLoadAndStore(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	if ks, err := Load(home, getenv); err != nil || len(ks) != 0 {
		t.Fatalf("no keys: %v %v", ks, err)
	}
	a, _ := Lookup("anthropic")
	key := "sk-ant-api03-" + strings.Repeat("k", 40) // gitleaks:allow
	if err := Store(home, a, "  "+key+"\n"); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(Dir(home), "anthropic"))
	di, _ := os.Stat(Dir(home))
	if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
		t.Errorf("modes %v %v", fi.Mode(), di.Mode())
	}
	ks, err := Load(home, getenv)
	if err != nil || len(ks) != 1 || ks[0].value != key || !strings.Contains(ks[0].Source, "credentials") {
		t.Fatalf("stored key: %v %v", ks, err)
	}
	if strings.Contains(ks[0].String(), key) || strings.Contains(ks[0].Fingerprint(), key[:12]) {
		t.Error("the key shows in its description")
	}
	// The environment wins.
	env["ANTHROPIC_API_KEY"] = "sk-ant-api03-" + strings.Repeat("e", 40) // gitleaks:allow
	ks, _ = Load(home, getenv)
	if ks[0].Source != "$ANTHROPIC_API_KEY" {
		t.Errorf("source %q", ks[0].Source)
	}
	// A key file others can read is refused.
	delete(env, "ANTHROPIC_API_KEY")
	os.Chmod(filepath.Join(Dir(home), "anthropic"), 0o644)
	if _, err := Load(home, getenv); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key file: %v", err)
	}
	for _, bad := range []string{"", "short", "has space inside the key value", strings.Repeat("x", 5000)} {
		if err := Store(home, a, bad); err == nil {
			t.Errorf("stored %q", bad)
		}
	}
	if _, err := Lookup("mistral"); err == nil || !strings.Contains(err.Error(), "anthropic, openai, gemini") {
		t.Errorf("unknown provider: %v", err)
	}
	if err := Remove(home, a); err != nil {
		t.Fatal(err)
	}
	if ks, _ := Load(home, getenv); len(ks) != 0 {
		t.Errorf("after remove: %v", ks)
	}
}

func TestSessionEnvAndKnownValues(t *testing.T) {
	t.Parallel()
	k := Key{Provider: Providers[1], value: "sk-proj-" + strings.Repeat("v", 40), Source: "$OPENAI_API_KEY"} // gitleaks:allow
	s, err := NewSession([]Key{k})
	if err != nil {
		t.Fatal(err)
	}
	ph := s.GuestEnv()["OPENAI_API_KEY"]
	if ph == "" || ph == k.value {
		t.Fatalf("guest env: %v", s.GuestEnv())
	}
	kv := s.KnownValues()
	if len(kv) != 2 || kv[0].Value != k.value || kv[1].Value != ph {
		t.Errorf("known values: %v", kv)
	}
}

// TestChildEnvStripsEveryProvider: every variable a provider's key is read
// from is one childenv strips from the programs vibedom starts.
func TestChildEnvStripsEveryProvider(t *testing.T) {
	t.Parallel()
	for _, p := range Providers {
		if !childenv.IsSecret(p.Env + "=x") {
			t.Errorf("childenv.Secret lacks $%s (%s)", p.Env, p.Name)
		}
	}
}

// TestGeminiSwap: $GEMINI_API_KEY becomes a placeholder of its shape in
// the guest, swapped in the x-goog-api-key header to the Gemini API only.
func TestGeminiSwap(t *testing.T) {
	key := "AIzaSyD" + strings.Repeat("q7Xk", 8)
	ks, err := Load(t.TempDir(), func(k string) string {
		if k == "GEMINI_API_KEY" {
			return key
		}
		return ""
	})
	if err != nil || len(ks) != 1 || ks[0].Provider.Name != "gemini" {
		t.Fatalf("load: %v %v", ks, err)
	}
	s, err := NewSession(ks)
	if err != nil {
		t.Fatal(err)
	}
	ph := s.GuestEnv()["GEMINI_API_KEY"]
	if !strings.HasPrefix(ph, "AIza") || len(ph) != len(key) || ph == key {
		t.Fatalf("placeholder %q for a key of %d characters", ph, len(key))
	}
	sw := s.Swaps()
	if len(sw) != 1 || sw[0].Host != "generativelanguage.googleapis.com" || sw[0].Header != "x-goog-api-key" ||
		sw[0].Placeholder != ph || sw[0].Value != key {
		t.Fatalf("swap %+v", sw)
	}
}
