package credentials

import (
	"github.com/vibedom/vibedom/dlp"
)

// Session is one session's placeholders.
type Session struct {
	entries []entry
}

type entry struct {
	key         Key
	placeholder string
}

// NewSession makes a placeholder for each key.
func NewSession(keys []Key) (*Session, error) {
	s := &Session{}
	for _, k := range keys {
		ph, err := Placeholder(k.Provider, k.value)
		if err != nil {
			return nil, err
		}
		s.entries = append(s.entries, entry{key: k, placeholder: ph})
	}
	return s, nil
}

// GuestEnv is what the guest's environment gets: each provider's variable
// holding its placeholder.
func (s *Session) GuestEnv() map[string]string {
	env := map[string]string{}
	for _, e := range s.entries {
		env[e.key.Provider.Env] = e.placeholder
	}
	return env
}

// KnownValues are the real keys and the placeholders, for the DLP: a real
// key never leaves but through the swap, and a placeholder anywhere the
// swap does not take it (a body, another host) is scrubbed and alerted.
func (s *Session) KnownValues() []dlp.Secret {
	var out []dlp.Secret
	for _, e := range s.entries {
		out = append(out,
			dlp.Secret{Value: e.key.value, Source: "the host's " + e.key.Provider.Name + " API key (" + e.key.Source + ")"},
			dlp.Secret{Value: e.placeholder, Source: "vibedom's placeholder for the " + e.key.Provider.Name + " API key"})
	}
	return out
}

// Providers lists the providers this session has keys for.
func (s *Session) Providers() []string {
	var out []string
	for _, e := range s.entries {
		out = append(out, e.key.Provider.Name)
	}
	return out
}

// Swaps are the session's swap rules, one a key, for the proxy's request
// filter (netfilter.NewSwapFilter wraps the DLP with them).
func (s *Session) Swaps() []Swap {
	var swaps []Swap
	for _, e := range s.entries {
		p := e.key.Provider
		swaps = append(swaps, Swap{Name: p.Name, Host: p.Host, Header: p.Header,
			Placeholder: authValue(p, e.placeholder), Value: authValue(p, e.key.value), Token: e.placeholder})
	}
	return swaps
}

// Swap says where one secret the guest only has a placeholder for is put
// in: on requests to Host, port 443, sent upstream over verified TLS
// (netfilter.Destination.SwapAllowed), a Header whose whole value is Placeholder
// becomes Value.
type Swap struct {
	Name        string // for messages ("anthropic")
	Host        string
	Header      string
	Placeholder string // the header value as the guest sends it
	Value       string // the header value upstream gets
	// Token is the placeholder itself: seen anywhere else, the request is
	// refused.
	Token string
}

// authValue is the header value carrying key for p.
func authValue(p Provider, key string) string {
	if p.Header == "authorization" {
		return "Bearer " + key
	}
	return key
}
