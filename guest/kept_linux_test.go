package guest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibedom/vibedom/guestlink"
)

// syncBuffer is a bytes.Buffer safe for a writer and a polling reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// attach opens a kept-terminal shell and returns its output, a writer to
// its input, a detach function and the channel's result.
func attachKept(t *testing.T, c *guestlink.Client, name, command string) (*syncBuffer, io.WriteCloser, context.CancelFunc, chan error) {
	t.Helper()
	out := &syncBuffer{}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		st, err := c.Shell(ctx, guestlink.ShellOptions{Keep: name, Command: command, Stdin: pr, Stdout: out})
		if err == nil && !st.Success() {
			err = errors.New(st.String())
		}
		done <- err
	}()
	t.Cleanup(func() { cancel(); pw.Close() })
	return out, pw, cancel, done
}

func TestKeptTerminalSurvivesDetach(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	script := `(i=0; while [ $i -lt 200 ]; do i=$((i+1)); echo tick-$i; sleep 0.02; done) & while read line; do echo got-$line; [ "$line" = quit ] && break; done; wait`
	out1, _, detach1, done1 := attachKept(t, c, "agent", script)
	waitUntil(t, "first output", func() bool { return strings.Contains(out1.String(), "tick-3") })
	detach1()
	if err := <-done1; !errors.Is(err, guestlink.ErrDetached) {
		t.Fatalf("detach: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the command goes on without anyone attached

	// A new attachment (on a new connection, as the host would after a
	// reconnect) sees output from before it and what follows, and its
	// input reaches the command.
	c2 := g.dial(t)
	out2, in2, _, done2 := attachKept(t, c2, "agent", "echo this command is ignored")
	waitUntil(t, "replayed output", func() bool { return strings.Contains(out2.String(), "tick-3") })
	if strings.Contains(out2.String(), "ignored") {
		t.Fatal("an attach started a second command")
	}
	if _, err := io.WriteString(in2, "hello\n"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "input echoed", func() bool { return strings.Contains(out2.String(), "got-hello") })
	// A second simultaneous attachment sees the same live output.
	out3, _, _, done3 := attachKept(t, c, "agent", "")
	waitUntil(t, "second attachment", func() bool { return strings.Contains(out3.String(), "got-hello") })
	if _, err := io.WriteString(in2, "quit\n"); err != nil {
		t.Fatal(err)
	}
	for i, d := range []chan error{done2, done3} {
		select {
		case err := <-d:
			if err != nil {
				t.Fatalf("attachment %d: %v", i+2, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("attachment %d did not end with the command", i+2)
		}
	}
	if !strings.Contains(out2.String(), "tick-200") {
		t.Fatalf("output ends early: %q", tail(out2.String()))
	}
	// After the end, an attachment gets the replay and the status at once.
	out4, _, _, done4 := attachKept(t, c, "agent", "")
	if err := <-done4; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out4.String(), "tick-200") {
		t.Fatalf("no replay after the end: %q", tail(out4.String()))
	}
}

func TestKeptTerminalExitStatus(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	st, err := c.Shell(context.Background(), guestlink.ShellOptions{Keep: "x", Command: "exit 7"})
	if err != nil || st.Code != 7 {
		t.Fatalf("status %v, err %v", st, err)
	}
}

func TestKeptTerminalBadNames(t *testing.T) {
	t.Parallel()
	g := startGuest(t)
	c := g.dial(t)
	for _, name := range []string{"../x", "A", strings.Repeat("a", 33), "a b", "a\x00"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Shell(ctx, guestlink.ShellOptions{Keep: name, Command: "true"})
		cancel()
		if err == nil {
			t.Errorf("kept terminal %q accepted", name)
		}
	}
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}
