package credentials

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"time"
)

// tokenPrefixes are the fixed, public prefixes of OAuth tokens, longest
// first: a token placeholder keeps the one its token starts with.
var tokenPrefixes = []string{"sk-ant-oat01-", "sk-ant-ort01-", "sk-ant-", "rt_", "at_"}

// TokenPlaceholder makes a placeholder for an OAuth token. An opaque
// token gets its public prefix (tokenPrefixes) and then random characters
// of the token's own alphabet (the character classes and punctuation it
// uses) to its length, holding no run of minShared characters of it. A
// JWT gets a JWT: the header's algorithm, the claims in claims (the ones
// the CLI reads) with exp set to expires, a random jti, and random bytes
// of the real signature's length in place of a signature.
func TokenPlaceholder(tok string, claims map[string]any, expires time.Time) (string, error) {
	if _, err := jwtClaims(tok); err == nil {
		return jwtPlaceholder(tok, claims, expires)
	}
	prefix := ""
	for _, p := range tokenPrefixes {
		if strings.HasPrefix(tok, p) {
			prefix = p
			break
		}
	}
	secret := tok[len(prefix):]
	alpha := alphabetOf(secret)
	for {
		b := make([]byte, len(secret))
		for i := range b {
			n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alpha))))
			if err != nil {
				return "", err
			}
			b[i] = alpha[n.Int64()]
		}
		ph := prefix + string(b)
		tail := ph[max(0, len(prefix)-(minShared-1)):]
		if ph != tok && !sharesRun(tail, secret, minShared) {
			return ph, nil
		}
	}
}

// alphabetOf is the alphabet a placeholder of s is drawn from: the
// letter and digit classes s uses, and each other character it holds.
func alphabetOf(s string) string {
	var lower, upper, digit bool
	other := map[byte]bool{}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= '0' && c <= '9':
			digit = true
		default:
			other[c] = true
		}
	}
	var a strings.Builder
	if lower {
		a.WriteString("abcdefghijklmnopqrstuvwxyz")
	}
	if upper {
		a.WriteString("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
	}
	if digit {
		a.WriteString("0123456789")
	}
	for _, c := range []byte("-_.~+/=") {
		if other[c] {
			a.WriteByte(c)
		}
	}
	if a.Len() < 16 { // a token of one character class would make a weak placeholder
		return placeholderAlphabet
	}
	return a.String()
}

// jwtClaimsKept are the claims a placeholder JWT copies from the real
// token: what codex reads (email, plan, account and user ids) and the
// token's standard identification; never anything signed.
var jwtClaimsKept = []string{"email", "email_verified", "https://api.openai.com/auth", "https://api.openai.com/profile",
	"iss", "aud", "sub", "iat", "auth_time", "scp", "client_id"}

func jwtPlaceholder(tok string, claims map[string]any, expires time.Time) (string, error) {
	parts := strings.Split(tok, ".")
	var hdr struct {
		Alg string `json:"alg"`
	}
	if b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[0], "=")); err == nil {
		_ = json.Unmarshal(b, &hdr)
	}
	if hdr.Alg == "" || hdr.Alg == "none" {
		hdr.Alg = "RS256"
	}
	if claims == nil {
		claims, _ = jwtClaims(tok)
	}
	payload := map[string]any{}
	for _, k := range jwtClaimsKept {
		if v, ok := claims[k]; ok {
			payload[k] = v
		}
	}
	payload["exp"] = expires.Unix()
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	payload["jti"] = "vibedom-placeholder-" + base64.RawURLEncoding.EncodeToString(jti)
	hb, _ := json.Marshal(map[string]string{"alg": hdr.Alg, "typ": "JWT", "kid": "vibedom-placeholder"})
	pb, err := json.Marshal(payload)
	if err != nil {
		return "", err
	}
	sigLen := len(parts[2])
	if sigLen < 16 {
		sigLen = 16
	}
	sig := make([]byte, sigLen)
	for i := range sig {
		n, err := rand.Int(rand.Reader, big.NewInt(64))
		if err != nil {
			return "", err
		}
		sig[i] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[n.Int64()]
	}
	return base64.RawURLEncoding.EncodeToString(hb) + "." + base64.RawURLEncoding.EncodeToString(pb) + "." + string(sig), nil
}

// guestTokens is one set of placeholders handed to the guest.
type guestTokens struct {
	access, refresh, id string
	expires             time.Time
}

// placeholderLifetime is how long the guest's placeholder access token
// says it lasts: the host keeps the real one fresh, so the guest has no
// reason to refresh during a session.
const placeholderLifetime = 12 * time.Hour

// newGuestTokens makes a fresh placeholder set for l.
func newGuestTokens(l *Login, now time.Time) (guestTokens, error) {
	g := guestTokens{expires: now.Add(placeholderLifetime)}
	var err error
	if g.access, err = TokenPlaceholder(l.access, nil, g.expires); err != nil {
		return g, err
	}
	if g.refresh, err = TokenPlaceholder(l.refresh, nil, g.expires); err != nil {
		return g, err
	}
	if l.id != "" {
		if g.id, err = TokenPlaceholder(l.id, l.idClaims, g.expires); err != nil {
			return g, err
		}
	}
	return g, nil
}

// guestFile is the CLI's credentials document holding the placeholders g,
// the rest of it (scopes, plan, ids) as the host's login has it.
func guestFile(l *Login, g guestTokens, now time.Time) ([]byte, error) {
	switch l.Kind.Name {
	case "claude":
		o := claudeOAuth{AccessToken: g.access, RefreshToken: g.refresh, ExpiresAt: g.expires.UnixMilli(),
			Scopes: l.Scopes, ClientID: l.ClientID, AccountUUID: l.AccountID, OrganizationUUID: l.OrgID}
		if o.Scopes == nil {
			o.Scopes = []string{}
		}
		if l.Plan != "" {
			o.SubscriptionType = &l.Plan
		}
		if l.RateLimitTier != "" {
			o.RateLimitTier = &l.RateLimitTier
		}
		return json.Marshal(claudeFile{OAuth: &o})
	case "codex":
		f := codexFile{AuthMode: l.AuthMode, Tokens: &codexToken{IDToken: g.id, AccessToken: g.access,
			RefreshToken: g.refresh, AccountID: l.AccountID}, LastRefresh: now.UTC().Format(time.RFC3339Nano)}
		return json.MarshalIndent(f, "", "  ")
	}
	return nil, errors.New("unknown login " + l.Kind.Name)
}
