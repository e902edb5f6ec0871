package egress

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// background runs vibedom with args and returns a function that waits for
// it (at most d) and returns its output.
func (r *liveRig) background(t *testing.T, d time.Duration, args ...string) func() string {
	wait, _ := r.backgroundBuf(t, d, args...)
	return wait
}

// backgroundBuf is background that also returns the output so far.
func (r *liveRig) backgroundBuf(t *testing.T, d time.Duration, args ...string) (func() string, *lockedBuf) {
	t.Helper()
	cmd := r.c.Command(t, nil, args...)
	b := &lockedBuf{}
	cmd.Stdout, cmd.Stderr = b, b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return func() string {
		t.Helper()
		select {
		case <-done:
		case <-time.After(d):
			cmd.Process.Kill()
			<-done
			t.Errorf("vibedom %v did not end within %v: %s", args, d, b.String())
		}
		return b.String()
	}, b
}

// TestAskModeVM: a session in ask mode holds requests for names no rule
// decides; a second terminal's vibedom watch answers with one key.
// "session" lets the held request through and is not asked again; "once"
// asks again next time; a lookup held with the guest's real resolver and a
// retrying client goes through once answered; no answer within the
// timeout gives the client the reason.
func TestAskModeVM(t *testing.T) { testAskMode(t) }

// TestAskModeVMMitmproxy is TestAskModeVM with --proxy-engine mitmproxy
// (whose upstream dial decides once more: it must not ask again).
func TestAskModeVMMitmproxy(t *testing.T) {
	if _, err := mitmproxy.MitmdumpVersion(t.Context(), ""); err != nil {
		t.Skipf("mitmproxy engine not tested: %v", err)
	}
	testAskMode(t, "--proxy-engine", "mitmproxy")
}

func testAskMode(t *testing.T, extra ...string) {
	r := startLiveRig(t, []string{"ask.example.com", "once.example.com", "late.example.com"},
		append([]string{"--egress", "ask", "--ask-timeout", "25s"}, extra...)...)
	watch := clitest.StartOnPTY(t, r.c.Command(t, nil, "watch", r.name), 40, 160)
	if !watch.Seen(regexp.MustCompile(`watching session`), time.Minute) {
		t.Fatalf("watch did not start:\n%s", watch.Text())
	}
	asked := func(name string, n int) {
		t.Helper()
		re := regexp.MustCompile(`(?s)(wants ` + regexp.QuoteMeta(name) + `.*){` + string(rune('0'+n)) + `}`)
		if !watch.Seen(re, 2*time.Minute) {
			t.Fatalf("watch never showed question %d about %s:\n%s", n, name, watch.Text())
		}
	}

	// Through the proxy: held, answered "session" from the watch.
	held := r.background(t, 3*time.Minute, "exec", r.name, "--", liveProbe, "pget", "https://ask.example.com/held")
	asked("ask.example.com", 1)
	watch.File.Write([]byte("s"))
	if got := held(); !strings.Contains(got, "upstream saw host=ask.example.com path=/held") {
		t.Errorf("the held request after \"session\": %s", got)
	}
	if got := r.probe(t, "get", "https://ask.example.com/again"); !strings.Contains(got, "upstream saw host=ask.example.com path=/again") {
		t.Errorf("the next request: %s", got)
	}
	// The watch shows the guest's requests as they happen.
	if !watch.Seen(regexp.MustCompile(`allow\s+GET ask\.example\.com:443 200`), time.Minute) {
		t.Errorf("watch does not show the request:\n%s", watch.Text())
	}
	if n := strings.Count(watch.Text(), "wants ask.example.com"); n != 1 {
		t.Errorf("ask.example.com asked %d times after a session answer:\n%s", n, watch.Text())
	}

	// Transparent: the guest's resolver asks DNS, which is held; the
	// client retries until the user answers "once".
	retried, progress := r.backgroundBuf(t, 3*time.Minute, "exec", r.name, "--", liveProbe, "retry", "120", "https://once.example.com/retry")
	asked("once.example.com", 1)
	// Answer only once the resolver got the temporary failure and the
	// client tried again: nothing the guest saw was final.
	for end := time.Now().Add(2 * time.Minute); !strings.Contains(progress.String(), "RETRY"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) || strings.Contains(progress.String(), "final") {
			t.Fatalf("the client never retried: %s", progress.String())
		}
	}
	watch.File.Write([]byte("o"))
	if got := retried(); !strings.Contains(got, "upstream saw host=once.example.com path=/retry") {
		t.Errorf("the retrying client after \"once\": %s", got)
	}
	// Once: the next request is asked again; deny refuses it.
	again := r.background(t, 3*time.Minute, "exec", r.name, "--", liveProbe, "pget", "https://once.example.com/next")
	asked("once.example.com", 2)
	watch.File.Write([]byte("d"))
	if got := again(); strings.Contains(got, "upstream saw") {
		t.Errorf("after \"deny\": %s", got)
	}

	// Nobody answers: the timeout refuses with the reason, as text or JSON.
	t0 := time.Now()
	if got := r.probe(t, "pget", "http://late.example.com/x"); !strings.Contains(got, "HTTP 403") || !strings.Contains(got, "did not answer") ||
		!strings.Contains(got, `refused="late.example.com:80"`) || !strings.Contains(got, "vibedom allow "+r.name) {
		t.Errorf("after the timeout: %s", got)
	}
	t.Logf("refused after %v", time.Since(t0))
	out, stderr, code := r.c.Run(t, "", "exec", r.name, "--", "env", "PROBE_ACCEPT=application/json", liveProbe, "pget", "http://late.example.com/y")
	if code != 0 || !strings.Contains(out, `ctype="application/json`) || !strings.Contains(out, `\"error\":\"vibedom_refused\"`) {
		t.Errorf("JSON refusal: exit %d %s %s", code, out, stderr)
	}

	// Guarded names are never asked about.
	before := strings.Count(watch.Text(), "wants")
	for _, u := range []string{"http://127.0.0.1:" + r.hostPort + "/", "http://localhost:" + r.hostPort + "/", "http://169.254.169.254/"} {
		if got := r.probe(t, "pget", u); strings.Contains(got, "upstream saw") {
			t.Errorf("pget %s: %s", u, got)
		}
	}
	if after := strings.Count(watch.Text(), "wants"); after != before {
		t.Errorf("a guarded address was asked about:\n%s", watch.Text())
	}
	if n := r.hostHits.Load(); n != 0 {
		t.Errorf("the host's loopback service got %d connections from the guest", n)
	}
	r.vibedom(t, 0, "stop", r.name)
}

// TestAskModeFullScreenVM: a question arrives while a full-screen program
// (vi) runs on the attached terminal, inside tmux: the terminal rings and
// its title names the question, and the screen is the same before, during
// and after.
func TestAskModeFullScreenVM(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux not installed")
	}
	r := startLiveRig(t, []string{"tui.example.com"}, "--egress", "ask", "--ask-timeout", "60s")
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	env := []string{"env"}
	for _, kv := range r.c.Env {
		if strings.HasPrefix(kv, "VIBEDOM_") || strings.HasPrefix(kv, "TMPDIR=") || strings.HasPrefix(kv, "NO_COLOR=") {
			env = append(env, kv)
		}
	}
	attach := strings.Join(append(env, clitest.Bin(t), "attach", r.name), " ")
	tmux("new-session", "-d", "-x", "100", "-y", "30", attach)
	t.Cleanup(func() { exec.Command("tmux", "-S", sock, "kill-server").Run() })
	screen := func() string { return tmux("capture-pane", "-p") }
	waitScreen := func(re *regexp.Regexp) string {
		t.Helper()
		for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			if s := screen(); re.MatchString(s) {
				return s
			}
		}
		t.Fatalf("the screen never matched %s:\n%s", re, screen())
		return ""
	}
	tmux("send-keys", "vi /mnt/workspace/notes.txt", "Enter")
	waitScreen(regexp.MustCompile(`(?s)one.*two.*three`))
	tmux("send-keys", "j")
	before := stable(t, screen)
	titleBefore := tmux("display", "-p", "#{pane_title}")

	held := r.background(t, 3*time.Minute, "exec", r.name, "--", liveProbe, "pget", "https://tui.example.com/x")
	var title string
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if title = tmux("display", "-p", "#{pane_title}"); strings.Contains(title, "tui.example.com") {
			break
		}
	}
	if !strings.Contains(title, "asks to reach tui.example.com") || !strings.Contains(title, "vibedom watch "+r.name) {
		t.Fatalf("the terminal's title did not show the question: %q (before: %q)", title, titleBefore)
	}
	if during := screen(); during != before {
		t.Errorf("the screen changed when the question arrived:\nbefore:\n%s\nduring:\n%s", before, during)
	}
	r.vibedom(t, 0, "allow", r.name, "tui.example.com") // answers the question
	if got := held(); !strings.Contains(got, "upstream saw host=tui.example.com") {
		t.Errorf("the held request after allow: %s", got)
	}
	if after := stable(t, screen); after != before {
		t.Errorf("the screen changed after the answer:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	t.Logf("title before %q, during %q, after %q", strings.TrimSpace(titleBefore), strings.TrimSpace(title), strings.TrimSpace(tmux("display", "-p", "#{pane_title}")))
	// vi still answers: quit it.
	// (vi is in command mode: an Escape right before ":" would read as Alt-:.)
	tmux("send-keys", ":q!", "Enter")
	for end := time.Now().Add(time.Minute); screen() == before; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("vi did not quit: the terminal no longer answers:\n%s", screen())
		}
	}
}

// stable returns the screen once two captures in a row agree.
func stable(t *testing.T, screen func() string) string {
	t.Helper()
	prev := screen()
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		time.Sleep(300 * time.Millisecond)
		cur := screen()
		if cur == prev {
			return cur
		}
		prev = cur
	}
	t.Fatalf("the screen never settled:\n%s", prev)
	return ""
}
