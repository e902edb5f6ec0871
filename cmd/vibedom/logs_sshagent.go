package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vibedom/vibedom/sshagent"
	"github.com/vibedom/vibedom/termtext"
)

// printAgentLog prints the SSH agent log, as it is (--json) or one line an
// event. User and service names are the guest's: printed through termtext.
func printAgentLog(w io.Writer, path string, raw bool) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s does not exist: the session ran without --ssh-agent", path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	l := termtext.Line
	for sc.Scan() {
		if raw {
			fmt.Fprintf(w, "%s\n", termtext.JSON(sc.Bytes()))
			continue
		}
		var e sshagent.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintf(w, "(unreadable line: %s)\n", termtext.Inline(err.Error()))
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s %-6s %-10s", e.Time.Local().Format("15:04:05"), l(e.Decision), l(e.Op))
		if e.Key != "" {
			b.WriteString(" " + l(e.Key))
		}
		if e.User != "" || e.Service != "" {
			fmt.Fprintf(&b, " user %s service %s %s", l(e.User), l(e.Service), l(e.Algorithm))
		}
		if len(e.SessionID) >= 16 {
			b.WriteString(" ssh session " + l(e.SessionID[:16]) + "…")
		}
		if e.Server != "" {
			b.WriteString(" to " + l(e.Server))
			if e.ServerHostKey != "" {
				b.WriteString(" host key " + l(e.ServerHostKey))
				if e.KnownHost {
					b.WriteString(" (in known_hosts)")
				}
			}
		}
		if e.Reason != "" {
			b.WriteString(" (" + l(e.Reason) + ")")
		}
		fmt.Fprintln(w, b.String())
	}
	return sc.Err()
}
