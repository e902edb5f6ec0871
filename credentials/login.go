package credentials

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// LoginKind is an agent CLI whose subscription login (OAuth) vibedom can
// hold: where the CLI keeps it, where its access token goes, and where it
// is refreshed. Facts pinned to the CLI versions in agents/pins.go (see
// docs/credentials.md).
type LoginKind struct {
	// Name is the agent's name and the login's: "claude", "codex".
	Name string
	// Provider is the API provider billed ("anthropic", "openai").
	Provider string
	// APIHost gets the access token, as "Authorization: Bearer <token>",
	// on port 443 over verified TLS, on APIPaths only.
	APIHost string
	// APIPaths are the request paths on APIHost the CLI sends its
	// subscription token to (docs/credentials.md says where each comes
	// from): one ending in "/" allows the paths below it, any other only
	// itself. The access placeholder on another path is refused, so the
	// guest cannot use the user's token for the rest of the account
	// (chat history, minting an API key).
	APIPaths []string
	// TokenHost and TokenPath are the vendor's token endpoint: the host
	// refreshes there; the guest's requests to TokenHost are answered by
	// the proxy and never forwarded.
	TokenHost, TokenPath string
	// File is where the CLI keeps the login, relative to the home
	// directory; the guest gets its placeholder file there.
	File string
	// Login is the vendor's own login command, run on the host.
	Login []string
	// ClientID is the CLI's public OAuth client id, used when the stored
	// login names none.
	ClientID string
	// keychainService is the CLI's own item in the macOS login Keychain
	// ("" when it keeps none).
	keychainService string
}

// LoginKinds are the subscription logins vibedom knows.
var LoginKinds = []LoginKind{
	{Name: "claude", Provider: "anthropic", APIHost: "api.anthropic.com",
		APIPaths: []string{"/v1/messages", "/v1/messages/count_tokens", "/api/oauth/profile", "/api/oauth/usage",
			"/api/claude_cli_profile", "/api/claude_cli/bootstrap", "/api/claude_code/settings", "/api/claude_code/policy_limits"},
		TokenHost: "platform.claude.com", TokenPath: "/v1/oauth/token",
		File: ".claude/.credentials.json", Login: []string{"claude", "auth", "login"},
		ClientID: "9d1c250a-e61b-44d9-88ed-5944d1962f5e", keychainService: "Claude Code-credentials"},
	{Name: "codex", Provider: "openai", APIHost: "chatgpt.com",
		APIPaths: []string{"/backend-api/codex/", "/backend-api/wham/accounts/check", "/backend-api/wham/usage",
			"/backend-api/wham/config/bundle"},
		TokenHost: "auth.openai.com", TokenPath: "/oauth/token",
		File: ".codex/auth.json", Login: []string{"codex", "login"},
		ClientID: "app_EMoamEEZ73f0CkXaXp7hrann"},
}

// LookupLogin finds a login kind by name.
func LookupLogin(name string) (LoginKind, error) {
	for _, k := range LoginKinds {
		if k.Name == name {
			return k, nil
		}
	}
	var n []string
	for _, k := range LoginKinds {
		n = append(n, k.Name)
	}
	return LoginKind{}, fmt.Errorf("unknown subscription login %q: use one of %s", name, strings.Join(n, ", "))
}

// TokenURL is the vendor's token endpoint.
func (k LoginKind) TokenURL() string { return "https://" + k.TokenHost + k.TokenPath }

// storeName is the login's name in the secret store.
func (k LoginKind) storeName() string { return k.Name + ".login" }

// ErrNoLogin means the host holds no subscription login of a kind.
var ErrNoLogin = errors.New("no subscription login")

// ErrDamaged means a stored or imported login cannot be read.
var ErrDamaged = errors.New("damaged login")

// Login is a subscription login the host holds: its real tokens and what
// the CLI needs beside them. It never prints its tokens (String,
// LogValue).
type Login struct {
	Kind LoginKind
	// Expires is when the access token expires (zero: unknown);
	// RefreshExpires when the refresh token does (zero: unknown).
	Expires, RefreshExpires time.Time
	Scopes                  []string
	// Plan is the subscription (max, pro, plus, team…), "" when unknown.
	Plan string
	// RateLimitTier, AccountID, OrgID and Email are copied into the
	// guest's file as the CLI stored them (identifiers, not secrets).
	RateLimitTier, AccountID, OrgID, Email string
	ClientID                               string
	// AuthMode is codex's auth_mode as stored ("" when absent).
	AuthMode string
	// Source says where it was imported from.
	Source string
	// Updated is when the tokens were last written.
	Updated time.Time

	access, refresh, id string
	// idClaims are the claims of codex's id_token the CLI reads.
	idClaims map[string]any
}

func (l *Login) String() string {
	return l.Kind.Name + " subscription login (" + l.Fingerprint() + ")"
}

// LogValue never shows a token.
func (l *Login) LogValue() slog.Value {
	return slog.GroupValue(slog.String("login", l.Kind.Name), slog.String("fingerprint", l.Fingerprint()),
		slog.Time("expires", l.Expires))
}

// Fingerprint names the refresh token (what the login is) without
// revealing it.
func (l *Login) Fingerprint() string {
	s := sha256.Sum256([]byte(l.refresh))
	return "sha256:" + hex.EncodeToString(s[:6])
}

// Secrets are the login's real token values.
func (l *Login) Secrets() []string {
	var out []string
	for _, v := range []string{l.access, l.refresh, l.id} {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// maxToken bounds one token.
const maxToken = 16 << 10

func checkToken(what, v string, min int) error {
	switch {
	case v == "":
		return fmt.Errorf("no %s", what)
	case len(v) > maxToken:
		return fmt.Errorf("the %s is longer than %d bytes", what, maxToken)
	case len(v) < min:
		return fmt.Errorf("the %s is shorter than %d characters", what, min)
	}
	for _, c := range v {
		if c <= ' ' || c > '~' {
			return fmt.Errorf("the %s holds spaces or characters outside printable ASCII", what)
		}
	}
	return nil
}

// claudeFile is Claude Code's credentials document (2.1.330).
type claudeFile struct {
	OAuth *claudeOAuth `json:"claudeAiOauth"`
}

type claudeOAuth struct {
	AccessToken           string   `json:"accessToken"`
	RefreshToken          string   `json:"refreshToken"`
	ExpiresAt             int64    `json:"expiresAt"`
	RefreshTokenExpiresAt int64    `json:"refreshTokenExpiresAt,omitempty"`
	Scopes                []string `json:"scopes"`
	SubscriptionType      *string  `json:"subscriptionType"`
	RateLimitTier         *string  `json:"rateLimitTier"`
	ClientID              string   `json:"clientId,omitempty"`
	AccountUUID           string   `json:"accountUuid,omitempty"`
	OrganizationUUID      string   `json:"organizationUuid,omitempty"`
}

// codexFile is Codex's auth.json (0.169.0), the fields vibedom uses.
type codexFile struct {
	AuthMode    string      `json:"auth_mode,omitempty"`
	APIKey      *string     `json:"OPENAI_API_KEY"`
	Tokens      *codexToken `json:"tokens"`
	LastRefresh string      `json:"last_refresh,omitempty"`
}

type codexToken struct {
	IDToken      string `json:"id_token"`
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	AccountID    string `json:"account_id,omitempty"`
}

// ParseLogin reads a CLI's own credentials document (Claude Code's
// .credentials.json or Keychain item, Codex's auth.json). source names it
// in errors.
func ParseLogin(k LoginKind, b []byte, source string) (*Login, error) {
	l, err := parseLogin(k, b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrDamaged, source, err)
	}
	l.Source = source
	return l, nil
}

func parseLogin(k LoginKind, b []byte) (*Login, error) {
	l := &Login{Kind: k}
	switch k.Name {
	case "claude":
		var f claudeFile
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("not JSON: %v", shortErr(err))
		}
		o := f.OAuth
		if o == nil {
			return nil, errors.New("no claudeAiOauth entry (an API-key login is no subscription)")
		}
		if err := checkToken("access token", o.AccessToken, 16); err != nil {
			return nil, err
		}
		if err := checkToken("refresh token", o.RefreshToken, 16); err != nil {
			return nil, errors.New("no refresh token: a setup-token login cannot be refreshed; sign in with `claude auth login`")
		}
		if o.ExpiresAt <= 0 {
			return nil, errors.New("no expiresAt")
		}
		l.access, l.refresh = o.AccessToken, o.RefreshToken
		l.Expires = time.UnixMilli(o.ExpiresAt)
		if o.RefreshTokenExpiresAt > 0 {
			l.RefreshExpires = time.UnixMilli(o.RefreshTokenExpiresAt)
		}
		l.Scopes = append([]string(nil), o.Scopes...)
		if o.SubscriptionType != nil {
			l.Plan = *o.SubscriptionType
		}
		if o.RateLimitTier != nil {
			l.RateLimitTier = *o.RateLimitTier
		}
		l.ClientID, l.AccountID, l.OrgID = o.ClientID, o.AccountUUID, o.OrganizationUUID
	case "codex":
		var f codexFile
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("not JSON: %v", shortErr(err))
		}
		t := f.Tokens
		if t == nil {
			return nil, errors.New("no tokens (an API-key login is no ChatGPT login)")
		}
		for _, c := range []struct{ what, v string }{{"id_token", t.IDToken}, {"access_token", t.AccessToken}, {"refresh_token", t.RefreshToken}} {
			if err := checkToken(c.what, c.v, 16); err != nil {
				return nil, err
			}
		}
		claims, err := jwtClaims(t.IDToken)
		if err != nil {
			return nil, fmt.Errorf("id_token: %v", err)
		}
		l.access, l.refresh, l.id = t.AccessToken, t.RefreshToken, t.IDToken
		l.idClaims = claims
		l.AccountID, l.AuthMode = t.AccountID, f.AuthMode
		if exp, err := jwtExpiry(t.AccessToken); err == nil {
			l.Expires = exp
		}
		if auth, ok := claims["https://api.openai.com/auth"].(map[string]any); ok {
			l.Plan, _ = auth["chatgpt_plan_type"].(string)
			if l.AccountID == "" {
				l.AccountID, _ = auth["chatgpt_account_id"].(string)
			}
		}
		l.Email, _ = claims["email"].(string)
	default:
		return nil, fmt.Errorf("unknown login %q", k.Name)
	}
	return l, nil
}

func shortErr(err error) string {
	s := err.Error()
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}

// jwtPart is one base64url segment of a JWT.
var jwtPart = regexp.MustCompile(`^[A-Za-z0-9_-]+={0,2}$`)

// jwtClaims decodes a JWT's payload as codex does: three non-empty
// dot-separated base64url parts, the signature not checked.
func jwtClaims(tok string) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a JWT (three dot-separated parts)")
	}
	for _, p := range parts {
		if !jwtPart.MatchString(p) {
			return nil, errors.New("not a JWT (a part is not base64url)")
		}
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return nil, errors.New("not a JWT (payload is not base64url)")
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errors.New("not a JWT (payload is not a JSON object)")
	}
	return m, nil
}

// jwtExpiry is a JWT's exp claim.
func jwtExpiry(tok string) (time.Time, error) {
	c, err := jwtClaims(tok)
	if err != nil {
		return time.Time{}, err
	}
	exp, ok := c["exp"].(float64)
	if !ok || exp <= 0 || exp > 1e11 { // 1e11: the year 5138, beyond which int64(exp) may overflow
		return time.Time{}, errors.New("no exp claim")
	}
	return time.Unix(int64(exp), 0), nil
}

// storedLogin is vibedom's own record of a login.
type storedLogin struct {
	Version        int            `json:"version"`
	Kind           string         `json:"kind"`
	Access         string         `json:"access_token"`
	Refresh        string         `json:"refresh_token"`
	ID             string         `json:"id_token,omitempty"`
	Expires        int64          `json:"expires_ms,omitempty"`
	RefreshExpires int64          `json:"refresh_expires_ms,omitempty"`
	Scopes         []string       `json:"scopes,omitempty"`
	Plan           string         `json:"plan,omitempty"`
	RateLimitTier  string         `json:"rate_limit_tier,omitempty"`
	AccountID      string         `json:"account_id,omitempty"`
	OrgID          string         `json:"org_id,omitempty"`
	Email          string         `json:"email,omitempty"`
	ClientID       string         `json:"client_id,omitempty"`
	AuthMode       string         `json:"auth_mode,omitempty"`
	IDClaims       map[string]any `json:"id_claims,omitempty"`
	Source         string         `json:"source"`
	Updated        int64          `json:"updated_ms"`
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}

func (l *Login) marshal() ([]byte, error) {
	return json.MarshalIndent(storedLogin{Version: 1, Kind: l.Kind.Name, Access: l.access, Refresh: l.refresh, ID: l.id,
		Expires: ms(l.Expires), RefreshExpires: ms(l.RefreshExpires), Scopes: l.Scopes, Plan: l.Plan,
		RateLimitTier: l.RateLimitTier, AccountID: l.AccountID, OrgID: l.OrgID, Email: l.Email, ClientID: l.ClientID,
		AuthMode: l.AuthMode, IDClaims: l.idClaims, Source: l.Source, Updated: ms(l.Updated)}, "", "  ")
}

func unmarshalLogin(k LoginKind, b []byte) (*Login, error) {
	var s storedLogin
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("not JSON: %v", shortErr(err))
	}
	if s.Version != 1 || s.Kind != k.Name {
		return nil, fmt.Errorf("not a %s login record", k.Name)
	}
	if err := checkToken("access token", s.Access, 16); err != nil {
		return nil, err
	}
	if err := checkToken("refresh token", s.Refresh, 16); err != nil {
		return nil, err
	}
	return &Login{Kind: k, access: s.Access, refresh: s.Refresh, id: s.ID, Expires: fromMS(s.Expires),
		RefreshExpires: fromMS(s.RefreshExpires), Scopes: s.Scopes, Plan: s.Plan, RateLimitTier: s.RateLimitTier,
		AccountID: s.AccountID, OrgID: s.OrgID, Email: s.Email, ClientID: s.ClientID, AuthMode: s.AuthMode,
		idClaims: s.IDClaims, Source: s.Source, Updated: fromMS(s.Updated)}, nil
}

// SaveLogin stores l (the 0600 file store, the login Keychain on macOS),
// replacing the login of its kind.
func SaveLogin(home string, l *Login) error {
	b, err := l.marshal()
	if err != nil {
		return err
	}
	return newStore(home).put(l.Kind.storeName(), b)
}

// LoadLogin returns the host's login of kind k: ErrNoLogin when there is
// none, ErrDamaged (with what to run) when it cannot be read.
func LoadLogin(home string, k LoginKind) (*Login, error) {
	st := newStore(home)
	b, err := st.get(k.storeName())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w for %s: run `vibedom auth import %s` (or `vibedom auth login %s`)", ErrNoLogin, k.Name, k.Name, k.Name)
	}
	if err != nil {
		return nil, err
	}
	l, err := unmarshalLogin(k, b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v: run `vibedom auth import %s` or `vibedom auth login %s`", ErrDamaged, st.where(k.storeName()), err, k.Name, k.Name)
	}
	return l, nil
}

// LoadLogins returns every login the host holds.
func LoadLogins(home string) ([]*Login, error) {
	var out []*Login
	for _, k := range LoginKinds {
		l, err := LoadLogin(home, k)
		if errors.Is(err, ErrNoLogin) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// RemoveLogin forgets the host's login of kind k; none is not an error.
func RemoveLogin(home string, k LoginKind) error { return newStore(home).del(k.storeName()) }

// WhereLogin says where the login of kind k is stored.
func WhereLogin(home string, k LoginKind) string { return newStore(home).where(k.storeName()) }

// ImportLogin reads the login the host's own CLI holds: on macOS Claude
// Code's Keychain item first (macOS asks the user once whether vibedom
// may read it), then the CLI's file under homeDir (the CLI's config
// folder when env names one: CLAUDE_CONFIG_DIR, CODEX_HOME). getenv is
// os.Getenv in production.
func ImportLogin(k LoginKind, homeDir string, getenv func(string) string) (*Login, error) {
	file := filepath.Join(homeDir, filepath.FromSlash(k.File))
	service := k.keychainService
	switch k.Name {
	case "claude":
		if d := getenv("CLAUDE_CONFIG_DIR"); d != "" {
			file = filepath.Join(d, ".credentials.json")
			s := sha256.Sum256([]byte(d))
			service += "-" + hex.EncodeToString(s[:])[:8]
		}
	case "codex":
		if d := getenv("CODEX_HOME"); d != "" {
			file = filepath.Join(d, "auth.json")
		}
	}
	if service != "" {
		b, err := vendorKeychain(service, keychainAccount(getenv))
		if err == nil {
			return ParseLogin(k, b, fmt.Sprintf("the Keychain item %q", service))
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	fi, err := os.Lstat(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s holds none: run `vibedom auth login %s` (it runs `%s` on this host)", ErrNoLogin, file, k.Name, strings.Join(k.Login, " "))
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrDamaged, file)
	}
	b, err := atomicfile.ReadLimited(file, maxStored)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	return ParseLogin(k, b, file)
}

// keychainAccount is the account Claude Code files its Keychain item
// under: $USER, else the OS user name; claude-code-user when that is not
// a plain name.
func keychainAccount(getenv func(string) string) string {
	a := getenv("USER")
	if a == "" {
		if u, err := user.Current(); err == nil {
			a = u.Username
		}
	}
	if !regexp.MustCompile(`^[a-zA-Z0-9._-]+$`).MatchString(a) {
		return "claude-code-user"
	}
	return a
}
