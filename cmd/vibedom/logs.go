package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/sshagent"
	"github.com/vibedom/vibedom/termtext"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "logs",
		Usage:     "show a session's logs: session.log, the network log, its alerts, or the decrypted DLP audit",
		ArgsUsage: "[SESSION | LOG-FOLDER]",
		Description: `Without a flag, prints the session's session.log. SESSION defaults to the
latest session; a path to a log folder (~/.vibedom/logs/session-…) works too.

  --network   every connection and request (network.jsonl)
  --alerts    what was refused or scrubbed (alerts.jsonl)
  --decrypt   the original values the DLP scrubbed (dlp_audit.jsonl.enc,
              decrypted with ~/.vibedom/keys/dlp_audit.key): handle with care
  --ssh-agent what the deploy key signed for the guest (ssh_agent.jsonl, run --ssh-agent)
  --path      the log folder's path

With --json, --network, --alerts, --decrypt and --ssh-agent print one JSON object a line
(the schemas are in docs/logs.md). Whatever came from the guest (host names,
URLs, reasons) is printed with control and invisible characters escaped:
\x1b, \u202e … in text, \u001b, \u202e … in JSON.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "network", Usage: "print network.jsonl"},
			&cli.BoolFlag{Name: "alerts", Usage: "print alerts.jsonl"},
			&cli.BoolFlag{Name: "decrypt", Usage: "decrypt and print the DLP audit log (original values)"},
			&cli.BoolFlag{Name: "ssh-agent", Usage: "print ssh_agent.jsonl: every signature the deploy key made for the guest"},
			&cli.BoolFlag{Name: "path", Usage: "print the log folder"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON lines"},
		},
		Action: logsAction,
	})
}

func logsAction(ctx context.Context, c *cli.Command) error {
	n := 0
	for _, f := range []string{"network", "alerts", "decrypt", "ssh-agent", "path"} {
		if c.Bool(f) {
			n++
		}
	}
	if n > 1 {
		return errors.New("--network, --alerts, --decrypt, --ssh-agent and --path exclude each other: pick one")
	}
	if c.Args().Len() > 1 {
		return fmt.Errorf("one SESSION at most (got %d arguments)", c.Args().Len())
	}
	hm, err := home.Default()
	if err != nil {
		return err
	}
	dir, err := logDir(hm, c.Args().First())
	if err != nil {
		return err
	}
	w := c.Root().Writer
	switch {
	case c.Bool("path"):
		fmt.Fprintln(w, dir)
		return nil
	case c.Bool("network"):
		return printEvents(w, filepath.Join(dir, netfilter.NetworkLogFile), c.Bool("json"))
	case c.Bool("alerts"):
		return printEvents(w, filepath.Join(dir, netfilter.AlertsLogFile), c.Bool("json"))
	case c.Bool("ssh-agent"):
		return printAgentLog(w, filepath.Join(dir, sshagent.LogFile), c.Bool("json"))
	case c.Bool("decrypt"):
		return printAudit(w, c.Root().ErrWriter, hm, filepath.Join(dir, dlp.AuditFile), c.Bool("json"))
	}
	f, err := os.Open(filepath.Join(dir, session.SessionLogFile))
	if err != nil {
		return fmt.Errorf("session log: %w", err)
	}
	defer f.Close()
	// session.log quotes what it logs, but it holds guest-chosen text: print
	// it through the sanitizer, line by line.
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if _, werr := w.Write(termtext.Block(line)); werr != nil {
				return werr
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("session log: %w", err)
		}
	}
}

// logDir finds the log folder of a session name, a log folder path, or the
// latest session.
func logDir(hm home.Home, arg string) (string, error) {
	if arg != "" && (strings.ContainsAny(arg, `/\`) || arg == ".") {
		fi, err := os.Stat(arg)
		if err != nil || !fi.IsDir() {
			return "", fmt.Errorf("%s is not a log folder", arg)
		}
		return filepath.Abs(arg)
	}
	si, err := session.FindSession(hm, arg)
	if err != nil {
		return "", err
	}
	if si.LogDir == "" {
		return "", fmt.Errorf("session %s has no log folder recorded", si.Name)
	}
	return si.LogDir, nil
}

// printEvents prints a network or alerts log, as it is (--json) or one
// line an event.
func printEvents(w io.Writer, path string, raw bool) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s does not exist (the session had no network, or did not get that far)", path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		if raw {
			fmt.Fprintf(w, "%s\n", termtext.JSON(sc.Bytes()))
			continue
		}
		var ev egress.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			fmt.Fprintf(w, "(unreadable line: %s)\n", termtext.Inline(err.Error()))
			continue
		}
		fmt.Fprintln(w, formatEvent(ev))
	}
	return sc.Err()
}

// formatEvent is one event as text. Every string in it may be the guest's
// (a DNS name, SNI, Host, URL, method) and is printed through termtext.Line.
func formatEvent(ev egress.Event) string {
	l := termtext.Line
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-6s %-7s", ev.Time.Local().Format("15:04:05"), l(ev.Decision), l(ev.Kind))
	target := l(ev.Name)
	if ev.Port != 0 && ev.Name != "" {
		target = fmt.Sprintf("%s:%d", l(ev.Name), ev.Port)
	}
	if target == "" {
		target = l(ev.Dst)
	}
	b.WriteString(" " + target)
	if ev.Method != "" {
		fmt.Fprintf(&b, " %s %s", l(ev.Method), l(ev.URL))
	}
	if ev.Status != 0 {
		fmt.Fprintf(&b, " → %d", ev.Status)
	}
	if ev.Reason != "" {
		b.WriteString(" (" + l(ev.Reason) + ")")
	}
	for _, f := range ev.Findings {
		fmt.Fprintf(&b, "\n    %s %s in %s, %d chars", l(string(f.Action)), l(string(f.Category)), l(f.Where), f.Length)
		if f.Source != "" {
			b.WriteString(", from " + l(f.Source))
		}
	}
	return b.String()
}

// printAudit decrypts the DLP audit log with the home's audit key.
func printAudit(w, errw io.Writer, hm home.Home, path string, raw bool) error {
	key, err := keys.LoadAuditKey(filepath.Join(hm.Keys(), keys.AuditKeyName))
	if err != nil {
		return fmt.Errorf("the DLP audit key: %w", err)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s does not exist: the session scrubbed nothing, or ran without network", path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if errw == nil {
		errw = os.Stderr
	}
	fmt.Fprintln(errw, "vibedom logs: below are the original values the DLP scrubbed; keep them out of tickets and chats")
	l := termtext.Line
	return dlp.ReadAuditLog(f, func(r dlp.AuditRecord) error {
		if raw {
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			_, err = w.Write(termtext.JSON(append(b, '\n')))
			return err
		}
		src := ""
		if r.Source != "" {
			src = " (from " + l(r.Source) + ")"
		}
		value := l(r.Value)
		if value == r.Value {
			value = `"` + value + `"` // always quoted, as the values are
		}
		_, err := fmt.Fprintf(w, "%s %s %s %s: %s %s in %s: %s%s\n", r.Time.Local().Format("15:04:05"), l(r.Dest), l(r.Method), l(r.URL),
			l(string(r.Action)), l(string(r.Category)), l(r.Where), value, src)
		return err
	}, key.Identity())
}
