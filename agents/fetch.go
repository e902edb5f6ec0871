package agents

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/progress"
)

// DefaultRegistry is the npm registry vibedom fetches from unless told
// otherwise.
const DefaultRegistry = "https://registry.npmjs.org"

// maxPackument bounds a packument's size (@openai/codex's is ~0.5 MB).
var maxPackument = 64 << 20

// maxPackuments bounds the bytes of all the packuments one dependency
// tree's resolution reads (up to maxNPMPackages of them).
var maxPackuments int64 = 1 << 30

// Errors a caller may test with errors.Is.
var (
	// ErrIntegrity: the registry's integrity or the downloaded tarball's
	// digest differs from the pin. Nothing is installed.
	ErrIntegrity = errors.New("integrity mismatch")
	// ErrForeignHost: the registry pointed the tarball, or redirected a
	// request, to a host other than its own.
	ErrForeignHost = errors.New("tarball not on the registry's host")
	// ErrNotInstalled: the agent was never installed, or its directory
	// no longer matches the pin.
	ErrNotInstalled = errors.New("agent not installed")
)

// Options says where agents are fetched from and kept.
type Options struct {
	// Home is vibedom's home directory (~/.vibedom or $VIBEDOM_HOME):
	// installed agents go to Home/agents, tarballs to Home/cache/npm.
	Home string
	// Registry is the npm registry's base URL; "" means DefaultRegistry.
	// Tarballs must be on the same scheme and host (see ErrForeignHost).
	Registry string
	// Client is the HTTP client; nil means one with connect and
	// response-header timeouts. Its redirect policy is replaced by one
	// that refuses other hosts.
	Client *http.Client
	// Attempts is how often a tarball download is tried, resuming where
	// the last attempt stopped; 0 means 3.
	Attempts int
	// Progress, when set, is told about every byte and package.
	Progress progress.Progress
	// MaxUnpacked bounds the bytes a package unpacks to; 0 means 2 GiB.
	MaxUnpacked int64
}

// AgentsDir is where installed agents live: <home>/agents.
func AgentsDir(h string) string { return home.Home(h).Agents() }

// CacheDir is the tarball cache: <home>/cache/npm.
func CacheDir(h string) string { return home.Home(h).NPMCache() }

// TarballName is a pin's file name in the cache, as `npm pack` names it:
// "@scope/name" 1.0 becomes "scope-name-1.0.tgz".
func TarballName(p Pin) string {
	return strings.ReplaceAll(strings.TrimPrefix(p.Package, "@"), "/", "-") + "-" + p.Version + ".tgz"
}

const partialDir = "partial"

var retryDelay = 500 * time.Millisecond

var defaultTransport = &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	TLSHandshakeTimeout:   15 * time.Second,
	ResponseHeaderTimeout: 30 * time.Second,
	IdleConnTimeout:       60 * time.Second,
}

func (o Options) normalized() (Options, *url.URL, error) {
	if o.Home == "" {
		return o, nil, errors.New("agents: no vibedom home directory")
	}
	if o.Registry == "" {
		o.Registry = DefaultRegistry
	}
	o.Registry = strings.TrimRight(o.Registry, "/")
	reg, err := parseRegistry(o.Registry)
	if err != nil {
		return o, nil, err
	}
	c := http.Client{Transport: defaultTransport}
	if o.Client != nil {
		c = *o.Client
	}
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("too many redirects")
		}
		if !sameOrigin(reg, req.URL) {
			return fmt.Errorf("%w: %s redirects to %s", ErrForeignHost, via[len(via)-1].URL.Redacted(), req.URL.Redacted())
		}
		return nil
	}
	o.Client = &c
	if o.Attempts <= 0 {
		o.Attempts = 3
	}
	if o.Progress == nil {
		o.Progress = progress.Nop{}
	}
	if o.MaxUnpacked <= 0 {
		o.MaxUnpacked = 2 << 30
	}
	return o, reg, nil
}

// CheckRegistry says whether u can be used as Options.Registry: an
// http(s) URL with a host, no credentials, query or fragment.
func CheckRegistry(u string) error {
	_, err := parseRegistry(strings.TrimRight(u, "/"))
	return err
}

func parseRegistry(s string) (*url.URL, error) {
	reg, err := url.Parse(s)
	if err != nil || (reg.Scheme != "https" && reg.Scheme != "http") || reg.Host == "" || reg.User != nil || reg.RawQuery != "" || reg.Fragment != "" {
		return nil, fmt.Errorf("registry %q: want an http(s) URL such as %s", s, DefaultRegistry)
	}
	return reg, nil
}

// sameOrigin: u uses the registry's scheme and host (with port).
func sameOrigin(reg, u *url.URL) bool {
	return u.Scheme == reg.Scheme && strings.EqualFold(u.Host, reg.Host) && u.User == nil
}

// pinnedDigest decodes a pin's "sha512-…" integrity.
func pinnedDigest(p Pin) ([]byte, error) {
	d, ok := sriSHA512(p.Integrity)
	if !ok {
		return nil, fmt.Errorf("%s: pinned integrity %q is not sha512-<base64>", p, p.Integrity)
	}
	return d, nil
}

// sriSHA512 returns the sha512 digest of a subresource-integrity string,
// which may list several space-separated hashes.
func sriSHA512(s string) ([]byte, bool) {
	for _, f := range strings.Fields(s) {
		b64, ok := strings.CutPrefix(f, "sha512-")
		if !ok {
			continue
		}
		if i := strings.IndexByte(b64, '?'); i >= 0 {
			b64 = b64[:i]
		}
		d, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && len(d) == sha512.Size {
			return d, true
		}
	}
	return nil, false
}

func sri(d []byte) string { return "sha512-" + base64.StdEncoding.EncodeToString(d) }

// packumentURL is where the registry serves name's document: a scoped
// name's slash is escaped (@scope%2fname), as npm does.
func packumentURL(registry, name string) string {
	return registry + "/" + strings.ReplaceAll(url.PathEscape(name), "%40", "@")
}

// resolve asks the registry for p's tarball address and checks the
// registry's integrity against the pin.
func resolve(ctx context.Context, o Options, reg *url.URL, p Pin) (string, error) {
	u := packumentURL(o.Registry, p.Package)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8")
	resp, err := o.Client.Do(req)
	if err != nil {
		return "", fmt.Errorf("fetch %s's packument: %w (check the network, or --registry)", p.Package, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("fetch %s's packument from %s: %s", p.Package, u, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(maxPackument)+1))
	if err != nil {
		return "", fmt.Errorf("fetch %s's packument: %w", p.Package, err)
	}
	if len(body) > maxPackument {
		return "", fmt.Errorf("%s's packument from %s is over %d MiB: refused", p.Package, u, maxPackument>>20)
	}
	var doc struct {
		Versions map[string]struct {
			Dist struct {
				Tarball   string `json:"tarball"`
				Integrity string `json:"integrity"`
			} `json:"dist"`
		} `json:"versions"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", fmt.Errorf("%s's packument from %s: %w", p.Package, u, err)
	}
	v, ok := doc.Versions[p.Version]
	if !ok {
		return "", fmt.Errorf("the registry %s has no %s (a mirror that lags the npm registry?)", o.Registry, p)
	}
	want, err := pinnedDigest(p)
	if err != nil {
		return "", err
	}
	got, ok := sriSHA512(v.Dist.Integrity)
	if !ok || !bytes.Equal(got, want) {
		return "", fmt.Errorf("%w: %s: the registry says %q, vibedom pins %s; nothing installed",
			ErrIntegrity, p, v.Dist.Integrity, p.Integrity)
	}
	t, err := url.Parse(v.Dist.Tarball)
	if err != nil || !t.IsAbs() {
		return "", fmt.Errorf("%s: the registry's tarball address %q is not a URL", p, v.Dist.Tarball)
	}
	if !sameOrigin(reg, t) {
		return "", fmt.Errorf("%w: %s: the registry %s points to %s; refused (use a registry that serves its own tarballs)",
			ErrForeignHost, p, o.Registry, t.Redacted())
	}
	return t.String(), nil
}

// fetchTarball makes sure p's tarball is in the cache, verified against
// the pin, and returns its path. A cached tarball that verifies needs no
// network; one that does not is deleted and fetched again.
func fetchTarball(ctx context.Context, o Options, reg *url.URL, p Pin) (string, error) {
	cache := CacheDir(o.Home)
	final := filepath.Join(cache, TarballName(p))
	if verifyFile(final, p) == nil {
		o.Progress.Advance(p.String(), p.Size)
		return final, nil
	}
	os.Remove(final) // absent or failing: never used
	if err := os.MkdirAll(filepath.Join(cache, partialDir), 0o755); err != nil {
		return "", fmt.Errorf("make the download cache: %w", err)
	}
	u, err := resolve(ctx, o, reg, p)
	if err != nil {
		return "", err
	}
	part := filepath.Join(cache, partialDir, TarballName(p)+".part")
	if st, err := os.Stat(part); err == nil && st.Size() <= p.Size {
		o.Progress.Advance(p.String(), st.Size()) // from an earlier run
	}
	for attempt := 0; attempt < o.Attempts; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt) * retryDelay):
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		err = download(ctx, o, u, part, p)
		if err == nil || errors.Is(err, ErrIntegrity) || errors.Is(err, ErrForeignHost) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return "", err
	}
	if err := atomicfile.Move(part, final); err != nil {
		os.Remove(part)
		return "", fmt.Errorf("cache %s: %w", p, err)
	}
	return final, nil
}

// download brings part to p.Size bytes, resuming from what it holds, and
// checks the whole file's SHA-512 against the pin as it streams. Bytes
// past p.Size or a wrong digest are ErrIntegrity (part deleted); fewer
// bytes are a retryable error that keeps part for the next attempt.
func download(ctx context.Context, o Options, u, part string, p Pin) error {
	want, err := pinnedDigest(p)
	if err != nil {
		return err
	}
	have := int64(0)
	if st, err := os.Stat(part); err == nil {
		have = st.Size()
	}
	if have > p.Size {
		o.Progress.Advance(p.String(), -have)
		os.Remove(part)
		have = 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if have > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	var resp *http.Response
	if have < p.Size {
		resp, err = o.Client.Do(req)
		if err != nil {
			if errors.Is(err, ErrForeignHost) {
				return err
			}
			return fmt.Errorf("download %s: %w (run again to resume)", u, err)
		}
		defer resp.Body.Close()
	}
	h := sha512.New()
	flags := os.O_WRONLY | os.O_CREATE
	switch {
	case resp == nil: // the partial file is complete: just check it
		flags |= os.O_APPEND
		if err := hashFile(h, part); err != nil {
			return err
		}
	case resp.StatusCode == http.StatusPartialContent && have > 0 &&
		strings.HasPrefix(resp.Header.Get("Content-Range"), "bytes "+strconv.FormatInt(have, 10)+"-"):
		flags |= os.O_APPEND
		if err := hashFile(h, part); err != nil {
			return err
		}
	case resp.StatusCode == http.StatusOK:
		flags |= os.O_TRUNC
		if have > 0 {
			o.Progress.Advance(p.String(), -have)
		}
		have = 0
	case resp.StatusCode == http.StatusPartialContent:
		os.Remove(part)
		o.Progress.Advance(p.String(), -have)
		return fmt.Errorf("download %s: the server answered range %q for bytes=%d-; retrying from the start", u, resp.Header.Get("Content-Range"), have)
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		os.Remove(part)
		o.Progress.Advance(p.String(), -have)
		return fmt.Errorf("%w: %s: the server's tarball is shorter than the pinned %d bytes; nothing installed", ErrIntegrity, p, p.Size)
	default:
		return fmt.Errorf("download %s: %s", u, resp.Status)
	}
	if resp != nil && resp.ContentLength >= 0 && have+resp.ContentLength > p.Size {
		os.Remove(part)
		return fmt.Errorf("%w: %s: the server sends %d bytes, the pin says %d; nothing installed", ErrIntegrity, p, have+resp.ContentLength, p.Size)
	}
	f, err := os.OpenFile(part, flags, 0o644)
	if err != nil {
		return fmt.Errorf("download %s: %w", p, err)
	}
	var n int64
	var cerr error
	if resp != nil {
		n, cerr = io.Copy(io.MultiWriter(f, h), progress.Reader(io.LimitReader(resp.Body, p.Size-have+1), p.String(), o.Progress))
	}
	if err := f.Close(); err != nil && cerr == nil {
		cerr = err
	}
	switch {
	case have+n > p.Size:
		os.Remove(part)
		return fmt.Errorf("%w: %s: the server sends more than the pinned %d bytes; nothing installed", ErrIntegrity, p, p.Size)
	case cerr != nil:
		return fmt.Errorf("download %s: cut off at %d of %d bytes: %w (run again to resume)", u, have+n, p.Size, cerr)
	case have+n < p.Size:
		return fmt.Errorf("download %s: cut off at %d of %d bytes (run again to resume)", u, have+n, p.Size)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		os.Remove(part)
		return fmt.Errorf("%w: %s: the tarball hashes to %s, vibedom pins %s; nothing installed", ErrIntegrity, p, sri(got), p.Integrity)
	}
	return nil
}

func hashFile(h hash.Hash, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}

// verifyFile checks a cached tarball's size and SHA-512 against the pin.
func verifyFile(path string, p Pin) error {
	want, err := pinnedDigest(p)
	if err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Size() != p.Size {
		return fmt.Errorf("%w: %s: %s has %d bytes, the pin says %d", ErrIntegrity, p, path, st.Size(), p.Size)
	}
	h := sha512.New()
	if err := hashFile(h, path); err != nil {
		return err
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("%w: %s: %s hashes to %s, vibedom pins %s", ErrIntegrity, p, path, sri(got), p.Integrity)
	}
	return nil
}
