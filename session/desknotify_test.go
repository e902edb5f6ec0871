package session

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/vibedom/vibedom/home"
)

type deskSent struct{ title, text string }

// fakeDesk is a notifier that records what it is given.
func fakeDesk() (deskPost, <-chan deskSent) {
	ch := make(chan deskSent, 100)
	return func(ctx context.Context, title, text string) error {
		ch <- deskSent{title, text}
		return nil
	}, ch
}

func recv(t *testing.T, ch <-chan deskSent) deskSent {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
	}
	return deskSent{}
}

// TestDeskNotifyHostileName: a name from the guest with quotes,
// backslashes, new lines, escapes, bidirectional controls and AppleScript
// reaches osascript only as an argument, stripped of every control.
func TestDeskNotifyHostileName(t *testing.T) {
	post, sent := fakeDesk()
	d := &deskNotifier{post: post}
	hostile := "x.example\" with title \"pwned\"\nend run\r\ndo shell script \"touch /tmp/p\" -- \\\"\x1b]2;t\x07\u202egoogle.com\x00\xff"
	if !d.asked("proj", hostile, 0) {
		t.Fatal("no notification for a detached session")
	}
	m := recv(t, sent)
	if m.title != "vibedom: proj asks" {
		t.Errorf("title %q", m.title)
	}
	for _, r := range m.text {
		if !unicode.IsPrint(r) {
			t.Errorf("the text keeps %U: %q", r, m.text)
		}
	}
	for _, want := range []string{"x.example\" with title \"pwned\"end rundo shell script \"touch /tmp/p\" -- \\\"]2;tgoogle.com", "vibedom watch proj", "vibedom allow proj x.example"} {
		if !strings.Contains(m.text, want) {
			t.Errorf("text %q lacks %q", m.text, want)
		}
	}
	args := osascriptArgs(m.title, m.text)
	if len(args) != 4 || args[0] != "-e" || args[1] != deskScript || args[2] != m.title || args[3] != m.text {
		t.Fatalf("osascript %q", args)
	}
	if strings.Contains(deskScript, "x.example") || strings.HasPrefix(args[2], "-") {
		t.Fatalf("the name is in the script or the title reads as an option: %q", args)
	}
	if long := deskSafe(strings.Repeat("a", 1000)); len([]rune(long)) != deskMaxText+1 {
		t.Errorf("a long name is kept whole: %d runes", len([]rune(long)))
	}
}

// TestDeskNotifyLimits: one notification per name, deskPerMinute a
// minute, none while a terminal is attached.
func TestDeskNotifyLimits(t *testing.T) {
	post, sent := fakeDesk()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &deskNotifier{post: post, now: func() time.Time { return now }}
	if d.asked("proj", "a.example", 1) {
		t.Error("a notification while a terminal is attached")
	}
	if !d.asked("proj", "a.example", 0) || d.asked("proj", "a.example", 0) {
		t.Error("a name is not notified exactly once")
	}
	n := 1
	for i := range 10 {
		if d.asked("proj", "n"+string(rune('a'+i))+".example", 0) {
			n++
		}
	}
	if n != deskPerMinute {
		t.Errorf("%d notifications in a minute, want %d", n, deskPerMinute)
	}
	now = now.Add(time.Minute)
	if !d.asked("proj", "later.example", 0) {
		t.Error("no notification a minute later")
	}
	d.wg.Wait()
	if len(sent) != deskPerMinute+1 {
		t.Errorf("%d sent", len(sent))
	}
}

// TestDeskNotifyNeverHolds: a notifier that hangs does not hold the
// question, and is given up on after its timeout.
func TestDeskNotifyNeverHolds(t *testing.T) {
	release := make(chan struct{})
	blocked := &deskNotifier{timeout: time.Hour, post: func(ctx context.Context, title, text string) error {
		<-release
		return nil
	}}
	returned := make(chan bool, 1)
	go func() { returned <- blocked.asked("proj", "slow.example", 0) }()
	select {
	case ok := <-returned:
		if !ok {
			t.Fatal("no notification")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the question waits for the notifier")
	}
	close(release)
	blocked.wg.Wait()

	ended := make(chan error, 1)
	d := &deskNotifier{timeout: 50 * time.Millisecond, post: func(ctx context.Context, title, text string) error {
		<-ctx.Done()
		ended <- ctx.Err()
		return ctx.Err()
	}}
	var logged error
	d.log = func(err error) { logged = err }
	if !d.asked("proj", "hang.example", 0) {
		t.Fatal("no notification")
	}
	if err := <-ended; err == nil {
		t.Fatal("the hung notifier was not cancelled")
	}
	d.wg.Wait()
	if logged == nil {
		t.Error("the failure is not logged")
	}
}

// TestAskNotifiesDesktop: a question of a session with no terminal
// attached reaches the desktop; with one attached, only the terminal.
func TestAskNotifiesDesktop(t *testing.T) {
	s := askHost(t, time.Minute)
	l := s.egress.live
	l.ask.notify = s.notifyQuestion
	post, sent := fakeDesk()
	s.egress.desk.post = post
	decideAsync(l, "d.example", 443)
	q := waitPending(t, l.ask, "d.example")
	if m := recv(t, sent); !strings.Contains(m.text, "d.example") || !strings.Contains(m.text, "vibedom watch "+s.name) {
		t.Errorf("notification %+v", m)
	}
	answer(t, s, q.ID, AnswerDeny)

	detach := s.egress.notices.add(newNoticeTerm(io.Discard))
	defer detach()
	decideAsync(l, "e.example", 443)
	q = waitPending(t, l.ask, "e.example")
	answer(t, s, q.ID, AnswerDeny)
	s.egress.desk.wg.Wait()
	if len(sent) != 0 {
		t.Errorf("a notification while a terminal is attached: %+v", <-sent)
	}
}

// TestDeskNotifyOff: notify = off in ~/.vibedom/config turns the
// notifications off; anything but on or off is an error naming the line.
func TestDeskNotifyOff(t *testing.T) {
	h := home.Home(t.TempDir())
	post, _ := fakeDesk()
	on := &deskNotifier{post: post}
	on.init(h, slog.New(slog.DiscardHandler))
	if !on.asked("proj", "a.example", 0) {
		t.Error("no notification without a config")
	}
	writeFileAtomic(h.Config(), []byte("notify = off\n"), 0o600)
	off := &deskNotifier{post: post}
	off.init(h, slog.New(slog.DiscardHandler))
	if off.asked("proj", "a.example", 0) {
		t.Error("a notification with notify = off")
	}
	writeFileAtomic(h.Config(), []byte("notify = maybe\n"), 0o600)
	if _, err := ReadConfig(h); err == nil || !strings.Contains(err.Error(), "config:1: notify must be on or off") {
		t.Errorf("notify = maybe: %v", err)
	}
	on.wg.Wait()
}
