package session

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vibedom/vibedom/home"
)

// A desktop notification for a question in ask mode when no terminal is
// attached (a detached session nobody watches): the platform's notifier
// (macOS: osascript, desknotify_darwin.go; none elsewhere) gets a title and
// a text naming the session and the name, and how to answer. The name
// comes from the guest: only printable characters are kept, and the
// notifier passes the texts as arguments, never as part of a script.

// deskPost posts one notification; title always starts with "vibedom".
// It must return once ctx is done.
type deskPost func(ctx context.Context, title, text string) error

const (
	deskPerMinute = 3                // notifications in any minute, at most
	deskTimeout   = 10 * time.Second // a notifier that hangs is killed
	deskMaxNames  = 1024             // names remembered (one notification each)
	deskMaxText   = 120              // runes kept of a name
)

// deskNotifier decides which questions get a notification: one per name,
// deskPerMinute a minute, none while a terminal is attached. The zero
// value posts with the platform's notifier (deskPlatform).
type deskNotifier struct {
	post deskPost         // nil: deskPlatform
	now  func() time.Time // nil: time.Now
	log  func(err error)  // a notifier that failed; may be nil
	off  bool             // notify = off in the user's config
	// timeout bounds a notifier (0: deskTimeout).
	timeout time.Duration

	mu   sync.Mutex
	seen map[string]bool
	sent []time.Time // the last minute's notifications
	wg   sync.WaitGroup
}

// init reads notify = off from the user's config (a config that does not
// read leaves notifications on: the run already said why) and logs failed
// notifications to log.
func (d *deskNotifier) init(h home.Home, log *slog.Logger) {
	if c, err := ReadConfig(h); err == nil && c.NoNotify {
		d.off = true
	}
	d.log = func(err error) { log.Warn("egress: the desktop notification", "err", err) }
}

// asked posts a notification for the question about name in session,
// unless terminals (how many are attached) is not 0, the name had one
// already, or the minute's budget is spent. It never waits for the
// notifier; it reports whether a notification was started.
func (d *deskNotifier) asked(session, name string, terminals int) bool {
	post := d.post
	if post == nil {
		post = deskPlatform
	}
	if post == nil || terminals > 0 || d.off {
		return false
	}
	now := time.Now
	if d.now != nil {
		now = d.now
	}
	d.mu.Lock()
	t := now()
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[name] || len(d.seen) >= deskMaxNames {
		d.mu.Unlock()
		return false
	}
	for len(d.sent) > 0 && t.Sub(d.sent[0]) >= time.Minute {
		d.sent = d.sent[1:]
	}
	if len(d.sent) >= deskPerMinute {
		d.mu.Unlock()
		return false
	}
	d.seen[name] = true
	d.sent = append(d.sent, t)
	d.mu.Unlock()

	title, text := deskMessage(session, name)
	timeout := d.timeout
	if timeout <= 0 {
		timeout = deskTimeout
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := post(ctx, title, text); err != nil && d.log != nil {
			d.log(err)
		}
	}()
	return true
}

// deskMessage is the notification's title and text.
func deskMessage(session, name string) (title, text string) {
	session, name = deskSafe(session), deskSafe(name)
	title = "vibedom: " + session + " asks"
	text = fmt.Sprintf("The agent asks to reach %s. Answer with: vibedom watch %s (or vibedom allow %s %s)",
		name, session, session, name)
	return title, text
}

// deskSafe keeps the printable characters of s (no controls, no format or
// bidirectional characters, nothing that is not UTF-8), at most
// deskMaxText of them.
func deskSafe(s string) string {
	var b strings.Builder
	n := 0
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				continue
			}
		}
		if !unicode.IsPrint(r) {
			continue
		}
		if n == deskMaxText {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
		n++
	}
	if b.Len() == 0 {
		return "?"
	}
	return b.String()
}

// deskScript shows a notification with the texts it is given as
// arguments (osascript -e SCRIPT TITLE TEXT): they are never part of the
// script's source, so nothing in them is AppleScript.
const deskScript = `on run argv
display notification (item 2 of argv) with title (item 1 of argv)
end run`

// osascriptArgs is osascript's command line for a notification. The title
// starts with "vibedom", so osascript reads neither it nor the text after
// it as an option.
func osascriptArgs(title, text string) []string {
	return []string{"-e", deskScript, title, text}
}

// terminals is how many terminals are attached now.
func (h *noticeHub) terminals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.terms)
}
