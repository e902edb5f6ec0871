package credentials

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ErrRefreshRefused means the vendor's token endpoint refused the host's
// refresh token (expired, revoked, reused): only a new login helps.
var ErrRefreshRefused = errors.New("the refresh token was refused")

// RefreshClient refreshes a login's tokens with the host's own request to
// the vendor's token endpoint (LoginKind.TokenURL). Its zero value uses
// http.DefaultClient.
type RefreshClient struct {
	// HTTP sends the request; it must verify TLS. A session gives one
	// that honours its --resolve and --ca-file.
	HTTP *http.Client
	// Now is time.Now unless set (tests).
	Now func() time.Time
}

// refreshTimeout bounds one refresh, as the CLIs do.
const refreshTimeout = 30 * time.Second

// maxTokenResponse bounds the token endpoint's answer.
const maxTokenResponse = 256 << 10

// maxLifetime bounds, in seconds, the lifetime a token endpoint may give
// a token (ten years): beyond, it is garbage, and a time.Duration would
// overflow.
const maxLifetime = 10 * 365 * 24 * 3600

// tokenResponse is what both vendors' token endpoints answer.
type tokenResponse struct {
	AccessToken           string `json:"access_token"`
	RefreshToken          string `json:"refresh_token"`
	IDToken               string `json:"id_token"`
	ExpiresIn             int64  `json:"expires_in"`
	RefreshTokenExpiresIn int64  `json:"refresh_token_expires_in"`
	Scope                 string `json:"scope"`
}

// Refresh asks the vendor for new tokens for l and returns the updated
// login (l is not changed). A refusal (4xx) wraps ErrRefreshRefused; the
// error never holds a token.
func (c *RefreshClient) Refresh(ctx context.Context, l *Login) (*Login, error) {
	k := l.Kind
	now := c.now()
	if !l.RefreshExpires.IsZero() && !now.Before(l.RefreshExpires) {
		return nil, fmt.Errorf("%w: the %s refresh token expired on %s: run `vibedom auth login %s` on the host",
			ErrRefreshRefused, k.Name, l.RefreshExpires.UTC().Format(time.RFC3339), k.Name)
	}
	clientID := l.ClientID
	if clientID == "" {
		clientID = k.ClientID
	}
	body := map[string]any{"grant_type": "refresh_token", "refresh_token": l.refresh, "client_id": clientID}
	if k.Name == "claude" && len(l.Scopes) > 0 {
		body["scope"] = strings.Join(l.Scopes, " ")
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.TokenURL(), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	noRedirect := *hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Do(req)
	if err != nil {
		return nil, fmt.Errorf("refresh the %s login at %s: %v", k.Name, k.TokenHost, scrubErr(err, l))
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse+1))
	if err != nil {
		return nil, fmt.Errorf("refresh the %s login at %s: %v", k.Name, k.TokenHost, err)
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 {
		return nil, fmt.Errorf("%w by %s (HTTP %d%s): run `vibedom auth login %s` on the host",
			ErrRefreshRefused, k.TokenHost, resp.StatusCode, oauthError(rb), k.Name)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("refresh the %s login at %s: HTTP %d", k.Name, k.TokenHost, resp.StatusCode)
	}
	if len(rb) > maxTokenResponse {
		return nil, fmt.Errorf("refresh the %s login at %s: the answer is over %d bytes", k.Name, k.TokenHost, maxTokenResponse)
	}
	var tr tokenResponse
	if err := json.Unmarshal(rb, &tr); err != nil {
		return nil, fmt.Errorf("refresh the %s login at %s: the answer is not JSON", k.Name, k.TokenHost)
	}
	n := *l
	n.Scopes = append([]string(nil), l.Scopes...)
	if err := checkToken("new access token", tr.AccessToken, 16); err != nil {
		return nil, fmt.Errorf("refresh the %s login at %s: %v", k.Name, k.TokenHost, err)
	}
	n.access = tr.AccessToken
	if tr.RefreshToken != "" {
		if err := checkToken("new refresh token", tr.RefreshToken, 16); err != nil {
			return nil, fmt.Errorf("refresh the %s login at %s: %v", k.Name, k.TokenHost, err)
		}
		n.refresh = tr.RefreshToken
	}
	if tr.IDToken != "" {
		claims, err := jwtClaims(tr.IDToken)
		if err != nil {
			return nil, fmt.Errorf("refresh the %s login at %s: id_token: %v", k.Name, k.TokenHost, err)
		}
		n.id, n.idClaims = tr.IDToken, claims
	}
	if tr.ExpiresIn < 0 || tr.ExpiresIn > maxLifetime || tr.RefreshTokenExpiresIn < 0 || tr.RefreshTokenExpiresIn > maxLifetime {
		return nil, fmt.Errorf("refresh the %s login at %s: the answer's expires_in is out of range", k.Name, k.TokenHost)
	}
	switch {
	case tr.ExpiresIn > 0:
		n.Expires = now.Add(time.Duration(tr.ExpiresIn) * time.Second)
	default:
		exp, err := jwtExpiry(n.access)
		if err != nil {
			// Never refreshed again, the login would die with the token.
			return nil, fmt.Errorf("refresh the %s login at %s: the answer says not when the new access token expires", k.Name, k.TokenHost)
		}
		n.Expires = exp
	}
	if !n.Expires.After(now) || n.Expires.After(now.Add(maxLifetime*time.Second)) {
		// In the past, the host would refresh on every request; centuries
		// away, never.
		return nil, fmt.Errorf("refresh the %s login at %s: the new access token's expiry is out of range", k.Name, k.TokenHost)
	}
	if tr.RefreshTokenExpiresIn > 0 {
		n.RefreshExpires = now.Add(time.Duration(tr.RefreshTokenExpiresIn) * time.Second)
	}
	if tr.Scope != "" {
		n.Scopes = strings.Fields(tr.Scope)
	}
	n.Updated = now
	return &n, nil
}

func (c *RefreshClient) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// oauthError is the OAuth error code of a refusal, when the body names a
// short, plain one (never the body itself, which the vendor writes).
func oauthError(b []byte) string {
	var e struct {
		Error any `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	var code string
	switch v := e.Error.(type) {
	case string:
		code = v
	case map[string]any:
		code, _ = v["code"].(string)
		if code == "" {
			code, _ = v["type"].(string)
		}
	}
	for _, c := range code {
		if !(c >= 'a' && c <= 'z' || c == '_' || c >= '0' && c <= '9') || len(code) > 40 {
			return ""
		}
	}
	if code == "" {
		return ""
	}
	return ", " + code
}

// scrubErr is err's text without l's tokens (a URL error can quote the
// request).
func scrubErr(err error, l *Login) string {
	s := err.Error()
	for _, v := range l.Secrets() {
		s = strings.ReplaceAll(s, v, "[REDACTED]")
	}
	return s
}
