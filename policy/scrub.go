package policy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/netfilter"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/wstrust"
)

// ScanOptions are the secrets scan's options for workspace, with h's
// gitleaks config, cache and approval key.
func ScanOptions(h home.Home, workspace string) preflight.Options {
	return preflight.Options{
		Workspace:       workspace,
		UserConfig:      h.GitleaksConfig(),
		CacheDir:        h.PreflightCache(),
		ApprovalKeyPath: h.PreflightApprovalKey(),
	}
}

// workspaceDLPConfig is DLPConfig for a workspace as a session would see
// it, the preflight's gitleaks scan included (quiet, cached) unless
// noScan.
func workspaceDLPConfig(ctx context.Context, h home.Home, workspace string, noScan bool, o DLPOptions) (dlp.Config, []string, error) {
	ws, err := wstrust.CheckWorkspace(workspace)
	if err != nil {
		return dlp.Config{}, nil, err
	}
	var found []string
	if !noScan {
		rep, err := preflight.Scan(ctx, ScanOptions(h, ws))
		if err != nil {
			return dlp.Config{}, nil, fmt.Errorf("secrets preflight: %w", err)
		}
		found = rep.Secrets()
	}
	return DLPConfig(h, ws, found, o)
}

// ScrubOptions is `vibedom scrub`: one request, scrubbed as the proxy
// would scrub it, sent nowhere.
type ScrubOptions struct {
	// Home is the vibedom home; "" means home.Default.
	Home home.Home
	// Dest is the destination: HOST, HOST:PORT or a URL; "" means URL's.
	Dest string
	// URL and Headers ('Name: value') are scrubbed too when given.
	URL     string
	Headers []string
	// Workspace, when set, adds the project's secrets (the preflight's
	// cached scan unless NoPreflight, and its .env values) and its
	// approved DLP allowlist.
	Workspace   string
	NoPreflight bool
	// ContentType and ContentEncoding describe the body.
	ContentType, ContentEncoding string
	// DLP are the session's allowlist options.
	DLP DLPOptions
	// Body is read and scrubbed to Out, except when URL or Headers are
	// given and Body is a terminal (a URL alone is tried).
	Body io.Reader
	Out  io.Writer
}

// ScrubReport is what Scrub found (the --json report of vibedom scrub).
type ScrubReport struct {
	Dest        string    `json:"dest"`
	Class       dlp.Class `json:"class"`
	ClassRule   string    `json:"class_rule,omitempty"`
	KnownValues int       `json:"known_values"`
	Redacted    int       `json:"redacted"`
	Logged      int       `json:"logged"`
	// Refused counts the findings that refuse the request (a value in a
	// header that frames the message): the proxy would not send it.
	Refused int `json:"refused,omitempty"`
	// URL and Headers are the scrubbed URL and Headers.
	URL      string        `json:"url,omitempty"`
	Headers  []string      `json:"headers,omitempty"`
	Findings []dlp.Finding `json:"findings"`
	Notes    []string      `json:"notes,omitempty"`
	// Summary is the one-line summary of everything found.
	Summary string `json:"-"`
}

// Scrub scrubs one request as the proxy would for a session on o.Workspace:
// the body from o.Body to o.Out with the DLP engine, the URL and headers
// with the proxy's own DLP filter.
func Scrub(ctx context.Context, o ScrubOptions) (*ScrubReport, error) {
	dest := o.Dest
	if dest == "" && o.URL != "" {
		dest = o.URL
	}
	if dest == "" {
		return nil, errors.New("--dest: give the destination host, e.g. --dest api.anthropic.com (or a --url)")
	}
	host, err := destHost(dest)
	if err != nil {
		return nil, err
	}
	req, err := scrubRequest(o.URL, o.Headers, host)
	if err != nil {
		return nil, err
	}
	h := o.Home
	if h == "" {
		if h, err = home.Default(); err != nil {
			return nil, err
		}
	}
	var cfg dlp.Config
	var notes []string
	if o.Workspace != "" {
		cfg, notes, err = workspaceDLPConfig(ctx, h, o.Workspace, o.NoPreflight, o.DLP)
	} else {
		cfg, notes, err = DLPConfig(h, "", nil, o.DLP)
	}
	if err != nil {
		return nil, err
	}
	e, err := dlp.New(cfg)
	if err != nil {
		return nil, err
	}
	pol := e.PolicyFor(host)
	class, rule := e.ClassOf(host)
	rep := &dlp.Report{}
	var reqFindings []dlp.Finding
	var refusal *netfilter.DLPRefusal
	if req != nil {
		// The proxy's own filter, on a request without a body.
		port := uint16(443)
		if p := req.URL.Port(); p != "" {
			if n, err := strconv.ParseUint(p, 10, 16); err == nil {
				port = uint16(n)
			}
		}
		f := &netfilter.DLPFilter{Engine: e}
		done, err := f.FilterRequest(ctx, mitm.Destination{Name: host, Port: port}, req)
		switch {
		case errors.As(err, &refusal):
			// What the proxy does: the request is not sent. Reported, not
			// an error of the scrub.
			for _, fd := range refusal.Findings {
				reqFindings = append(reqFindings, findingOf(fd))
			}
			notes = append(notes, "the proxy refuses this request: "+refusal.Error())
		case err != nil:
			return nil, fmt.Errorf("scrub: %w", err)
		default:
			for _, fd := range done() {
				reqFindings = append(reqFindings, findingOf(fd))
			}
		}
	}
	if f, ok := o.Body.(*os.File); req == nil || o.Body != nil && !(ok && isTerminal(f)) {
		body := o.Body
		if body == nil {
			body = strings.NewReader("")
		}
		out := bufio.NewWriterSize(o.Out, 64<<10)
		err = e.Scrub(out, bufio.NewReaderSize(body, 64<<10), &pol, dlp.StreamOptions{
			ContentType: o.ContentType, ContentEncoding: o.ContentEncoding,
		}, rep)
		if ferr := out.Flush(); err == nil {
			err = ferr
		}
		if err != nil {
			return nil, fmt.Errorf("scrub: %w", err)
		}
	}
	r := &ScrubReport{Dest: host, Class: class, ClassRule: rule, KnownValues: e.KnownValues(), Findings: append(reqFindings, rep.Findings()...), Notes: notes}
	if req != nil {
		if o.URL != "" {
			r.URL = req.URL.String()
		}
		for _, h := range o.Headers {
			name := http.CanonicalHeaderKey(strings.TrimSpace(strings.SplitN(h, ":", 2)[0]))
			vals, ok := req.Header[name]
			if !ok {
				r.Headers = append(r.Headers, name+": (dropped: its name holds a value)")
				continue
			}
			if refusal != nil && "header:"+name == refusal.Where {
				r.Headers = append(r.Headers, name+": (refused: it holds a value the DLP redacts, and it is not rewritten)")
				continue
			}
			r.Headers = append(r.Headers, name+": "+strings.Join(vals, ", "))
		}
		r.Headers = slices.Compact(r.Headers)
	}
	if r.Findings == nil {
		r.Findings = []dlp.Finding{}
	}
	for _, f := range r.Findings {
		switch f.Action {
		case dlp.Redact:
			r.Redacted++
		case dlp.Refuse:
			r.Refused++
		default:
			r.Logged++
		}
	}
	r.Redacted += rep.Dropped()
	for _, f := range reqFindings {
		rep.Add(f)
	}
	r.Summary = rep.Summary()
	return r, nil
}

// scrubRequest builds the request --url and --header describe (nil when
// neither is given).
func scrubRequest(rawURL string, headers []string, host string) (*http.Request, error) {
	if rawURL == "" && len(headers) == 0 {
		return nil, nil
	}
	u := &url.URL{Scheme: "https", Host: host, Path: "/"}
	if rawURL != "" {
		var err error
		if u, err = url.Parse(rawURL); err != nil || u.Host == "" {
			return nil, fmt.Errorf("--url %q: not an absolute URL (e.g. https://api.example.com/v1/x?q=1)", rawURL)
		}
	}
	req := &http.Request{Method: http.MethodGet, URL: u, Host: u.Host, Header: http.Header{}, Body: http.NoBody}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("--header %q: write it as 'Name: value'", h)
		}
		req.Header.Add(http.CanonicalHeaderKey(name), strings.TrimSpace(value))
	}
	return req, nil
}

// findingOf turns the proxy's logged finding back into a report finding,
// its action as the proxy took it (an action it does not know counts as a
// redaction).
func findingOf(f nfegress.Finding) dlp.Finding {
	c, _ := dlp.ParseCategory(f.Category)
	a, _ := dlp.ParseAction(f.Action)
	return dlp.Finding{Category: c, Action: a, Where: f.Where, Form: f.Form, Source: f.Source, Prefix: f.Prefix, Length: f.Length}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// destHost reads HOST, HOST:PORT or a URL into a host name.
func destHost(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("--dest: give a host, e.g. --dest api.anthropic.com")
	}
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil || u.Hostname() == "" {
			return "", fmt.Errorf("--dest %q: not a URL with a host", s)
		}
		return strings.ToLower(u.Hostname()), nil
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		s = h
	}
	s = strings.ToLower(strings.TrimSuffix(strings.Trim(s, "[]"), "."))
	if s == "" || strings.ContainsAny(s, "/ \t") {
		return "", fmt.Errorf("--dest %q: not a host name", s)
	}
	return s, nil
}
