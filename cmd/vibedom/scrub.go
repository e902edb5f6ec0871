package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/dlp"
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

Exit status: 0 when the input was scrubbed (whether or not something was
found), 2 on error (e.g. a body that cannot be decoded).`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dest", Usage: "destination `HOST`, HOST:PORT or URL the body would go to", Required: true},
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
	Dest        string        `json:"dest"`
	Class       dlp.Class     `json:"class"`
	ClassRule   string        `json:"class_rule,omitempty"`
	KnownValues int           `json:"known_values"`
	Redacted    int           `json:"redacted"`
	Logged      int           `json:"logged"`
	Findings    []dlp.Finding `json:"findings"`
	Notes       []string      `json:"notes,omitempty"`
}

func scrubAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() > 0 {
		return errors.New("vibedom scrub reads standard input: give no arguments (e.g. vibedom scrub --dest api.anthropic.com < body.json)")
	}
	host, err := destHost(c.String("dest"))
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
	r := scrubReport{Dest: host, Class: class, ClassRule: rule, KnownValues: e.KnownValues(), Findings: rep.Findings(), Notes: notes}
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
	fmt.Fprintf(w, "vibedom scrub: %s\n", rep.Summary())
	return nil
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
