package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/policy"
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
for known values and secrets found by their shape only), and printed in the
report; standard input is then
read only when it is not a terminal (use </dev/null to try a URL alone).

Exit status: 0 when the input was scrubbed (whether or not something was
found), 1 when the proxy would refuse the request (a value the DLP redacts
in a header it never rewrites, such as Content-Type), 2 on error (e.g. a
body that cannot be decoded).`,
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

func scrubAction(ctx context.Context, c *cli.Command) error {
	if c.Args().Len() > 0 {
		return errors.New("vibedom scrub reads standard input: give no arguments (e.g. vibedom scrub --dest api.anthropic.com < body.json)")
	}
	r, err := policy.Scrub(ctx, policy.ScrubOptions{
		Dest: c.String("dest"), URL: c.String("url"), Headers: c.StringSlice("header"),
		Workspace: c.String("workspace"), NoPreflight: c.Bool("no-preflight"),
		ContentType: c.String("content-type"), ContentEncoding: c.String("content-encoding"),
		DLP:  policy.DLPOptions{AllowPatterns: c.StringSlice("allow-pattern"), AllowContexts: c.StringSlice("allow-context")},
		Body: os.Stdin, Out: os.Stdout,
	})
	if err != nil {
		return err
	}
	w := c.Root().ErrWriter
	if w == nil {
		w = os.Stderr
	}
	if c.Bool("json") {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		if _, err := w.Write(termtext.JSON(append(b, '\n'))); err != nil {
			return err
		}
		return refusedExit(r)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "vibedom scrub: %s\n", termtext.Inline(n))
	}
	ruleText := "no rule: public by default"
	if r.ClassRule != "" {
		ruleText = "rule from " + r.ClassRule
	}
	fmt.Fprintf(w, "vibedom scrub: %s is %s (%s); %d known values\n", termtext.Line(r.Dest), r.Class, termtext.Line(ruleText), r.KnownValues)
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
	fmt.Fprintf(w, "vibedom scrub: %s\n", r.Summary)
	return refusedExit(r)
}

// refusedExit is exit status 1 when the proxy would not send the request
// at all, so that a script checking a request can tell.
func refusedExit(r *policy.ScrubReport) error {
	if r.Refused > 0 {
		return exitCode(1)
	}
	return nil
}
