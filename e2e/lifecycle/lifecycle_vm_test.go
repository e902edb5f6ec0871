package lifecycle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// startDetached runs `vibedom run --detach --json` and returns the name.
func startDetached(t testing.TB, c *clitest.CLI, ws string, args ...string) string {
	t.Helper()
	all := append([]string{"run", ws, "--memory", "512M", "--no-network", "--preflight=off", "--detach", "--json"}, args...)
	out, stderr, code := c.Run(t, "", all...)
	if code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, stderr)
	}
	var r struct {
		Name string `json:"name"`
		PID  int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Name == "" || r.PID == 0 {
		t.Fatalf("run --detach --json printed %q: %v", out, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// What the session host said, for the failure's reader.
			logs, _ := filepath.Glob(filepath.Join(c.Home, "logs", "host-"+r.Name+".log"))
			more, _ := filepath.Glob(filepath.Join(c.Home, "logs", "session-*", "session.log"))
			for _, p := range append(logs, more...) {
				b, _ := os.ReadFile(p)
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("%s:\n%s", p, b)
			}
		}
		// A failed test must not leave a session host and its VM behind.
		if p, err := os.FindProcess(r.PID); err == nil {
			_ = p.Signal(syscall.SIGKILL)
		}
	})
	return r.Name
}

// state reads a session's state.json.
func state(t *testing.T, c *clitest.CLI, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.Home, "sessions", name, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// statusJSON is `vibedom status NAME --json`.
func statusJSON(t *testing.T, c *clitest.CLI, name string) map[string]any {
	t.Helper()
	out, stderr, code := c.Run(t, "", "status", name, "--json")
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, stderr)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	return m
}

// attachRun is one `vibedom attach` whose input the test types.
type attachRun struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	mu  sync.Mutex
	out bytes.Buffer
	err bytes.Buffer
}

func attach(t *testing.T, c *clitest.CLI, name string) *attachRun {
	t.Helper()
	a := &attachRun{cmd: exec.Command(clitest.Bin(t), "attach", name)}
	a.cmd.Env = c.Env
	var err error
	if a.in, err = a.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	a.cmd.Stdout, a.cmd.Stderr = lockedWriter{&a.mu, &a.out}, lockedWriter{&a.mu, &a.err}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.cmd.Process.Kill() })
	return a
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (a *attachRun) text() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.String()
}

func (a *attachRun) waitFor(t *testing.T, re *regexp.Regexp, d time.Duration) []string {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if m := re.FindAllString(a.text(), -1); m != nil {
			return m
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t.Fatalf("attach: waiting for %v; output so far:\n%s\nstderr:\n%s", re, a.out.String(), a.err.String())
	return nil
}

// detach sends Ctrl-] and waits for attach to exit.
func (a *attachRun) detach(t *testing.T) {
	t.Helper()
	if _, err := a.in.Write([]byte{0x1d}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("attach after detaching: %v\n%s", err, a.err.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("attach did not exit after Ctrl-]")
	}
	if !strings.Contains(a.err.String(), "detached from") {
		t.Errorf("attach did not say it detached: %q", a.err.String())
	}
}

// lastTick is the highest tick-N in s.
func lastTick(s string) int {
	n := 0
	for _, m := range regexp.MustCompile(`tick-(\d+)`).FindAllStringSubmatch(s, -1) {
		if v, _ := strconv.Atoi(m[1]); v > n {
			n = v
		}
	}
	return n
}

// guestClock returns the guest's uptime and wall clock (seconds).
func guestClock(t *testing.T, c *clitest.CLI, name string) (uptime, wall float64) {
	t.Helper()
	out, stderr, code := c.Run(t, "", "exec", name, "--", "sh", "-c", "cut -d' ' -f1 /proc/uptime; date +%s")
	if code != 0 {
		t.Fatalf("exec: exit %d\n%s", code, stderr)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("exec printed %q", out)
	}
	uptime, _ = strconv.ParseFloat(f[0], 64)
	wall, _ = strconv.ParseFloat(f[1], 64)
	return uptime, wall
}

// TestDetachedSessionVM drives a session's whole life from separate
// commands, as a user in several terminals would: run --detach returns at
// once; attach shows a process started before an earlier detach; exec,
// status, pause (the guest's clock stands still, QMP and state.json say
// paused), resume (the clock is set from the host's), stop, and review
// of the work.
func TestDetachedSessionVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws)
	out, _, _ := c.Run(t, "", "list")
	if !regexp.MustCompile(name + `\s+running, detached`).MatchString(out) {
		t.Errorf("list does not show the session as detached:\n%s", out)
	}

	// First attach: start a process on the agent's terminal, then detach.
	a1 := attach(t, c, name)
	io.WriteString(a1.in, "echo before-$((6*7)); echo from-attach > /work/attached.txt; (i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo tick-$i; sleep 0.2; done) &\n")
	a1.waitFor(t, regexp.MustCompile(`tick-2\b`), 2*time.Minute)
	a1.detach(t)
	seen := lastTick(a1.text())

	// Second attach: the earlier output is replayed and the process went on
	// while nobody was attached.
	a2 := attach(t, c, name)
	a2.waitFor(t, regexp.MustCompile(`before-42`), time.Minute)
	for end := time.Now().Add(time.Minute); lastTick(a2.text()) <= seen+5; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no new ticks after re-attaching (last seen %d):\n%s", seen, a2.text())
		}
	}
	st := statusJSON(t, c, name)
	if st["attached"] != float64(1) || st["status"] != "running" || st["detached"] != true {
		t.Errorf("status while attached: %v", st)
	}
	a2.detach(t)

	// exec beside the agent: streams and status come back.
	out, errOut, code := c.Run(t, "", "exec", name, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if out != "out\n" || errOut != "err\n" || code != 3 {
		t.Errorf("exec: stdout %q stderr %q code %d", out, errOut, code)
	}

	// Pause: nothing runs in the guest (its uptime stands still), the
	// hypervisor and state.json say paused; resume sets the clock.
	up1, _ := guestClock(t, c, name)
	h1 := time.Now()
	out, stderr, code := c.Run(t, "", "pause", name, "--json")
	if code != 0 {
		t.Fatalf("pause: exit %d\n%s", code, stderr)
	}
	var took struct {
		TookMS int64 `json:"took_ms"`
	}
	json.Unmarshal([]byte(out), &took)
	t.Logf("pause took %d ms", took.TookMS)
	st = statusJSON(t, c, name)
	if st["status"] != "paused" || st["vm"] != "paused" {
		t.Errorf("status after pause: %v", st)
	}
	if s := state(t, c, name); s["status"] != "paused" || s["paused_at"] == nil {
		t.Errorf("state.json after pause: %v", s)
	}
	_, stderr, code = c.Run(t, "", "exec", name, "--", "true")
	if code == 0 || !strings.Contains(stderr, "vibedom resume") || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
		t.Errorf("exec on a paused session: exit %d, %q", code, stderr)
	}
	time.Sleep(3 * time.Second)
	out, stderr, code = c.Run(t, "", "resume", name, "--json")
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	json.Unmarshal([]byte(out), &took)
	t.Logf("resume took %d ms", took.TookMS)
	up2, wall := guestClock(t, c, name)
	h2 := time.Now()
	if ran, passed := up2-up1, h2.Sub(h1).Seconds(); ran > passed-2.5 {
		t.Errorf("the guest ran %.1fs of the %.1fs that passed, though paused for 3s", ran, passed)
	}
	if d := wall - float64(h2.Unix()); d < -2 || d > 2 {
		t.Errorf("after resume the guest's clock is %.1fs off the host's", d)
	}
	if s := state(t, c, name); s["status"] != "running" {
		t.Errorf("state.json after resume: %v", s["status"])
	}

	// Stop: the agent ends, the changes wait for review.
	out, stderr, code = c.Run(t, "", "stop", name)
	if code != 0 || !strings.Contains(out, "vibedom review "+name) {
		t.Fatalf("stop: exit %d\n%s\n%s", code, out, stderr)
	}
	out, _, _ = c.Run(t, "", "list", "--json")
	if !strings.Contains(out, `"patch_pending": true`) {
		t.Errorf("list after stop: %s", out)
	}
	// Every command on a stopped session: a one-line error saying what to do.
	for _, args := range [][]string{{"attach", name}, {"pause", name}, {"resume", name}, {"exec", name, "--", "true"}, {"stop", name}} {
		_, stderr, code := c.Run(t, "", args...)
		msg := strings.TrimSpace(stderr)
		if code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "vibedom review "+name) {
			t.Errorf("%v on a stopped session: exit %d, %q", args[0], code, msg)
		}
	}
	_, stderr, code = c.Run(t, "", "review", name, "--apply")
	if code != 0 {
		t.Fatalf("review --apply: exit %d\n%s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "attached.txt")); err != nil || string(b) != "from-attach\n" {
		t.Errorf("the work done through attach did not come back: %q %v", b, err)
	}
	c.AssertNothingLeft(t)
}

// TestRecoverVM: the session host is killed (-9) mid-work; `vibedom
// recover` boots a rescue VM on the scratch disk and the agent's work comes
// back byte-exact.
func TestRecoverVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws)
	out, stderr, code := c.Run(t, "", "exec", name, "--", "sh", "-c",
		"head -c 2000000 /dev/urandom > /work/random.bin && mkdir -p /work/deep/er && echo work > /work/deep/er/f.txt && echo edited >> /work/notes.txt && sync && sha256sum /work/random.bin")
	if code != 0 {
		t.Fatalf("exec: exit %d\n%s", code, stderr)
	}
	want := strings.Fields(out)[0]
	pid := int(state(t, c, name)["pid"].(float64))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _, _ = c.Run(t, "", "list")
		if strings.Contains(out, "crashed, recoverable") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("list after kill -9:\n%s", out)
		}
	}
	_, stderr, code = c.Run(t, "", "attach", name)
	if code == 0 || !strings.Contains(stderr, "vibedom recover "+name) {
		t.Errorf("attach to a crashed session: exit %d, %q", code, stderr)
	}
	// The dead host's VM goes with it, but not at once.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := exec.Command("pgrep", "-f", "qemu-system.*"+regexp.QuoteMeta(c.Home)).Run(); err != nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the crashed session's VM is still running")
		}
	}
	// While recover runs, list says so (it once said "running, detached").
	rec := exec.Command(clitest.Bin(t), "recover", name, "--apply")
	rec.Env = c.Env
	var recErr bytes.Buffer
	rec.Stderr = &recErr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	recDone := make(chan error, 1)
	go func() { recDone <- rec.Wait() }()
	var during []string
	for polling := true; polling; {
		select {
		case err := <-recDone:
			polling = false
			if err != nil {
				t.Fatalf("recover: %v\n%s", err, recErr.String())
			}
		default:
			out, _, _ = c.Run(t, "", "list")
			if m := regexp.MustCompile(name + `\s+(\S[^\n]*?)\s{2,}`).FindStringSubmatch(out); m != nil {
				during = append(during, m[1])
			}
		}
	}
	during = slices.Compact(during)
	if !slices.Contains(during, "recovering") || slices.Contains(during, "running, detached") {
		t.Errorf("list while recover ran: %q, want recovering", during)
	}
	t.Logf("recover:\n%s", recErr.String())
	b, err := os.ReadFile(filepath.Join(ws, "random.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256.Sum256(b); hex.EncodeToString(got[:]) != want {
		t.Errorf("random.bin came back different")
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "deep/er/f.txt")); string(b) != "work\n" {
		t.Errorf("deep/er/f.txt: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "notes.txt")); string(b) != "one\ntwo\nthree\nedited\n" {
		t.Errorf("notes.txt: %q", b)
	}
	out, _, _ = c.Run(t, "", "status", name, "--json")
	if !strings.Contains(out, `"status": "stopped"`) {
		t.Errorf("status after recover: %s", out)
	}
	_, stderr, code = c.Run(t, "", "recover", name)
	if code == 0 || strings.Contains(strings.TrimSpace(stderr), "\n") {
		t.Errorf("second recover: exit %d, %q", code, stderr)
	}
	c.AssertNothingLeft(t)
}

// TestPauseResumeLoopVM pauses and resumes a busy guest 20 times in a row:
// a counter it appends to without pause loses nothing (every number once,
// in order), and each pause and resume takes under a second.
func TestPauseResumeLoopVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws, "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i >> /work/count.txt; done")
	var pauses, resumes []time.Duration
	for i := 0; i < 20; i++ {
		for _, op := range []string{"pause", "resume"} {
			out, stderr, code := c.Run(t, "", op, name, "--json")
			if code != 0 {
				t.Fatalf("%s #%d: exit %d\n%s", op, i+1, code, stderr)
			}
			var r struct {
				TookMS int64 `json:"took_ms"`
			}
			json.Unmarshal([]byte(out), &r)
			d := time.Duration(r.TookMS) * time.Millisecond
			if op == "pause" {
				pauses = append(pauses, d)
			} else {
				resumes = append(resumes, d)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	t.Logf("pause median %v max %v; resume median %v max %v", med(pauses), slicesMax(pauses), med(resumes), slicesMax(resumes))
	if med(pauses) >= time.Second || med(resumes) >= time.Second {
		t.Errorf("pause/resume take a second or more (medians %v, %v)", med(pauses), med(resumes))
	}
	out, stderr, code := c.Run(t, "", "stop", name)
	if code != 0 {
		t.Fatalf("stop: exit %d\n%s%s", code, out, stderr)
	}
	if _, stderr, code = c.Run(t, "", "review", name, "--apply"); code != 0 {
		t.Fatalf("review --apply: exit %d\n%s", code, stderr)
	}
	b, err := os.ReadFile(filepath.Join(ws, "count.txt"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	// The last line may be cut by the stop; every complete one counts up.
	for i, l := range lines[:len(lines)-1] {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("count.txt line %d is %q (of %d lines)", i+1, l, len(lines))
		}
	}
	if len(lines) < 100 {
		t.Errorf("the guest counted only to %d", len(lines))
	}
	t.Logf("the guest counted to %d", len(lines))
	c.AssertNothingLeft(t)
}

func slicesMax(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// BenchmarkSessionLifecycle measures, on one detached session, what the
// user waits for: `vibedom pause` and `vibedom resume` (the whole command,
// and the hypervisor's part the host reports), and `vibedom attach` until
// the first byte of the agent's terminal. The baseline is `vibedom status`,
// the cheapest command that reaches the session host; the target for pause
// and resume is one second.
func BenchmarkSessionLifecycle(b *testing.B) {
	clitest.RequireVM(b)
	c := clitest.New(b)
	ws := clitest.SampleWorkspace(b)
	name := startDetached(b, c, ws)
	timeCmd := func(args ...string) (time.Duration, string) {
		t0 := time.Now()
		cmd := exec.Command(clitest.Bin(b), args...)
		cmd.Env = c.Env
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%v: %v", args, err)
		}
		return time.Since(t0), string(out)
	}
	const n = 10
	var status, pause, resume, pauseHost, resumeHost, attach time.Duration
	for i := 0; i < n; i++ {
		d, _ := timeCmd("status", name, "--json")
		status += d
		for _, op := range []string{"pause", "resume"} {
			d, out := timeCmd(op, name, "--json")
			var r struct {
				TookMS int64 `json:"took_ms"`
			}
			json.Unmarshal([]byte(out), &r)
			if op == "pause" {
				pause, pauseHost = pause+d, pauseHost+time.Duration(r.TookMS)*time.Millisecond
			} else {
				resume, resumeHost = resume+d, resumeHost+time.Duration(r.TookMS)*time.Millisecond
			}
		}
		// attach: until the first byte of the terminal's replay.
		cmd := exec.Command(clitest.Bin(b), "attach", name)
		cmd.Env = c.Env
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		one := make([]byte, 1)
		if _, err := io.ReadFull(out, one); err != nil {
			b.Fatal(err)
		}
		attach += time.Since(t0)
		in.Write([]byte{0x1d})
		go io.Copy(io.Discard, out)
		cmd.Wait()
	}
	avg := func(d time.Duration) float64 { return float64(d.Milliseconds()) / n }
	b.ReportMetric(avg(status), "status-ms")
	b.ReportMetric(avg(pause), "pause-ms")
	b.ReportMetric(avg(pauseHost), "pause-vm-ms")
	b.ReportMetric(avg(resume), "resume-ms")
	b.ReportMetric(avg(resumeHost), "resume-vm-ms")
	b.ReportMetric(avg(attach), "attach-first-byte-ms")
	fmt.Printf("lifecycle: status %.0f ms (baseline); pause %.0f ms (VM %.0f ms) = %.2fx status, %.2fx the 1 s target; resume %.0f ms (VM %.0f ms, clock set) = %.2fx status, %.2fx the target; attach to first byte %.0f ms = %.2fx status\n",
		avg(status), avg(pause), avg(pauseHost), avg(pause)/avg(status), avg(pause)/1000,
		avg(resume), avg(resumeHost), avg(resume)/avg(status), avg(resume)/1000, avg(attach), avg(attach)/avg(status))
	timeCmd("stop", name)
}
