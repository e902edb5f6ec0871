package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "scrub",
		Usage: "filter stdin to stdout through the DLP, as a request body to HOST would be, and report what was redacted",
		Description: `Scrubs standard input as the proxy scrubs a request body sent to --dest, and
writes the result to standard output; the report goes to standard error (or,
with --json, as one JSON object to standard error). Nothing is sent anywhere.

What is scrubbed depends on the destination's class (external, internal,
public: ~/.vibedom/dlp_classes.txt, then the built-in table) and, with
--workspace, on the project: its secrets (the preflight's gitleaks scan, cached)
and .env values are known values, its .vibedom/dlp_allowlist.txt applies.

Categories: ` + categoryList() + `.

With --url and --header the request's URL and headers are scrubbed too,
exactly as the proxy scrubs them (credential headers such as Authorization
for known values only), and printed in the report; standard input is then
read only when it is not a terminal (use </dev/null to try a URL alone).

Exit status: 0 when the input was scrubbed (whether or not something was
found), 2 on error (e.g. a body that cannot be decoded).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dest", Usage: "destination `HOST`, HOST:PORT or URL the body would go to (default: --url's host)"},
			&cli.StringFlag{Name: "url", Usage: "also scrub this request `URL` (its path and query), as the proxy would, and print the result"},
			&cli.StringSliceFlag{Name: "header", Usage: "also scrub this request header, `'Name: value'` (repeatable), as the proxy would, and print the result"},
			&cli.StringFlag{Name: "workspace", Usage: "use this project's secrets, .env values and DLP allowlist"},
			&cli.BoolFlag{Name: "no-preflight", Usage: "with --workspace: skip the gitleaks scan (only .env values are known)"},
			&cli.StringFlag{Name: "content-type", Usage: "the body's Content-Type (application/json, application/x-www-form-urlencoded, multipart/form-data; boundary=…)", Value: "text/plain"},
			&cli.StringFlag{Name: "content-encoding", Usage: "the body's Content-Encoding (gzip, deflate, br, zstd); the output is encoded the same way"},
			&cli.StringSliceFlag{Name: "allow-pattern", Usage: "never redact this value (repeatable; re:REGEXP for a pattern)"},
			&cli.StringSliceFlag{Name: "allow-context", Usage: "let this category through (repeatable)"},
			&cli.BoolFlag{Name: "json", Usage: "write the report to stderr as JSON"},
		},
		Action: scrubAction,
	})
}

func categoryList() string {
	var names []string
	for _, c := range dlp.Categories() {
		names = append(names, c.String())
	}
	return strings.Join(names, ", ")
}

// scrubReport is the --json report of vibedom scrub.
type scrubReport struct {
	Dest        string    `json:"dest"`
	Class       dlp.Class `json:"class"`
	ClassRule   string    `json:"class_rule,omitempty"`
	KnownValues int       `json:"known_values"`
	Redacted    int       `json:"redacted"`
	Logged      int       `json:"logged"`
	// URL and Headers are the scrubbed --url and --header values.
	URL      string        `json:"url,omitempty"`
	Headers  []string      `json:"headers,omitempty"`
	Findings []dlp.Finding `json:"findings"`
	Notes    []string      `json:"notes,omitempty"`
}

func scrubAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() > 0 {
		return errors.New("vibedom scrub reads standard input: give no arguments (e.g. vibedom scrub --dest api.anthropic.com < body.json)")
	}
	dest := c.String("dest")
	if dest == "" && c.String("url") != "" {
		dest = c.String("url")
	}
	if dest == "" {
		return errors.New("--dest: give the destination host, e.g. --dest api.anthropic.com (or a --url)")
	}
	host, err := destHost(dest)
	if err != nil {
		return err
	}
	req, err := scrubRequest(c.String("url"), c.StringSlice("header"), host)
	if err != nil {
		return err
	}
	h, err := session.DefaultHome()
	if err != nil {
		return err
	}
	o := session.DLPOptions{AllowPatterns: c.StringSlice("allow-pattern"), AllowContexts: c.StringSlice("allow-context")}
	var cfg dlp.Config
	var notes []string
	if ws := c.String("workspace"); ws != "" {
		cfg, notes, err = session.WorkspaceDLPConfig(ctx, h, ws, c.Bool("no-preflight"), o)
	} else {
		cfg, notes, err = session.DLPConfig(h, "", nil, o)
	}
	if err != nil {
		return err
	}
	e, err := dlp.New(cfg)
	if err != nil {
		return err
	}
	pol := e.PolicyFor(host)
	class, rule := e.ClassOf(host)
	rep := &dlp.Report{}
	var reqFindings []dlp.Finding
	if req != nil {
		// The proxy's own filter, on a request without a body.
		port := uint16(443)
		if p := req.URL.Port(); p != "" {
			if n, err := strconv.ParseUint(p, 10, 16); err == nil {
				port = uint16(n)
			}
		}
		f := &netfilter.DLPFilter{Engine: e}
		done, err := f.FilterRequest(ctx, netfilter.Destination{Name: host, Port: port}, req)
		if err != nil {
			return fmt.Errorf("scrub: %w", err)
		}
		for _, fd := range done() {
			reqFindings = append(reqFindings, findingOf(fd))
		}
	}
	if req == nil || !isTerminal(os.Stdin) {
		out := bufio.NewWriterSize(os.Stdout, 64<<10)
		err = e.Scrub(out, bufio.NewReaderSize(os.Stdin, 64<<10), &pol, dlp.StreamOptions{
			ContentType: c.String("content-type"), ContentEncoding: c.String("content-encoding"),
		}, rep)
		if ferr := out.Flush(); err == nil {
			err = ferr
		}
		if err != nil {
			return fmt.Errorf("scrub: %w", err)
		}
	}
	r := scrubReport{Dest: host, Class: class, ClassRule: rule, KnownValues: e.KnownValues(), Findings: append(reqFindings, rep.Findings()...), Notes: notes}
	if req != nil {
		if c.String("url") != "" {
			r.URL = req.URL.String()
		}
		for _, h := range c.StringSlice("header") {
			name := http.CanonicalHeaderKey(strings.TrimSpace(strings.SplitN(h, ":", 2)[0]))
			vals, ok := req.Header[name]
			if !ok {
				r.Headers = append(r.Headers, name+": (dropped: its name holds a value)")
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
		if f.Action == dlp.Redact {
			r.Redacted++
		} else {
			r.Logged++
		}
	}
	r.Redacted += rep.Dropped()
	w := c.Root().ErrWriter
	if w == nil {
		w = os.Stderr
	}
	if c.Bool("json") {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(termtext.JSON(append(b, '\n')))
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(w, "vibedom scrub: %s\n", termtext.Inline(n))
	}
	ruleText := "no rule: public by default"
	if rule != "" {
		ruleText = "rule from " + rule
	}
	fmt.Fprintf(w, "vibedom scrub: %s is %s (%s); %d known values\n", termtext.Line(host), class, termtext.Line(ruleText), r.KnownValues)
	if r.URL != "" {
		fmt.Fprintf(w, "  url     %s\n", termtext.Line(r.URL))
	}
	for _, h := range r.Headers {
		fmt.Fprintf(w, "  header  %s\n", termtext.Line(h))
	}
	for _, f := range r.Findings {
		shown := "…"
		if f.Prefix != "" {
			shown = termtext.Line(f.Prefix) + "…"
		}
		extra := ""
		if f.Source != "" {
			extra = " from " + termtext.Line(f.Source)
		}
		if f.Form != "" && f.Form != "raw" {
			extra += " (" + termtext.Line(f.Form) + ")"
		}
		fmt.Fprintf(w, "  %-7s %-12s %-14s %s (%d chars)%s\n", f.Action, f.Category, termtext.Line(f.Where), shown, f.Length, extra)
	}
	for _, f := range reqFindings {
		rep.Add(f)
	}
	fmt.Fprintf(w, "vibedom scrub: %s\n", rep.Summary())
	return nil
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

// findingOf turns the proxy's logged finding back into a report finding.
func findingOf(f egress.Finding) dlp.Finding {
	c, _ := dlp.ParseCategory(f.Category)
	a := dlp.Redact
	if f.Action == "log" {
		a = dlp.Log
	}
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
