package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/vm"
)

// vibedomBin builds the vibedom command once per test process.
func vibedomBin(t testing.TB) string {
	t.Helper()
	return prodBin.get(t)
}

// vibedomTestKeysBin is vibedom built with the vibedom_testkeys tag: it
// trusts the Alpine keys in $VIBEDOM_TEST_ALPINE_KEYS, so the CLI can build
// a guest image from a test mirror. Every other test uses the real build,
// which ignores that variable.
func vibedomTestKeysBin(t *testing.T) string {
	t.Helper()
	return testKeysBin.get(t, "-tags", "vibedom_testkeys")
}

type binBuild struct {
	once sync.Once
	path string
	err  error
}

var prodBin, testKeysBin binBuild

func (b *binBuild) get(t testing.TB, flags ...string) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "vibedom-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "vibedom")
		args := append(append([]string{"build"}, flags...), "-o", b.path, ".")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			b.err = errors.New(string(out))
		}
	})
	if b.err != nil {
		t.Fatalf("build vibedom: %v", b.err)
	}
	return b.path
}

// cliRun is one run of the vibedom command as a user runs it.
type cliRun struct {
	home, tmp string
	env       []string
}

func newCLI(t testing.TB) *cliRun {
	t.Helper()
	c := &cliRun{home: t.TempDir(), tmp: t.TempDir()}
	// The Alpine mirror is a closed loopback port: a test that builds a
	// guest image serves its own mirror, and nothing may reach the internet.
	c.env = append(os.Environ(), "VIBEDOM_HOME="+c.home, "TMPDIR="+c.tmp, "NO_COLOR=1",
		"VIBEDOM_ALPINE_MIRROR=http://127.0.0.1:9/alpine")
	if d := os.Getenv("VIBEDOM_TEST_IMAGE_CACHE"); d == "" {
		// Share the image cache between the tests' homes.
		shared := filepath.Join(os.TempDir(), "vibedom-test-home-images")
		os.MkdirAll(shared, 0o700)
		os.MkdirAll(c.home, 0o700)
		os.Symlink(shared, filepath.Join(c.home, "images"))
	}
	return c
}

func (c *cliRun) run(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return c.runWith(t, vibedomBin(t), stdin, args...)
}

// runWith is run with another build of vibedom.
func (c *cliRun) runWith(t testing.TB, bin, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = c.env
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run vibedom: %v", err)
	}
	return o.String(), e.String(), code
}

// requireVM skips when no QEMU or guest image assets are here.
func requireVM(t testing.TB) {
	t.Helper()
	bin := map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"}[runtime.GOARCH]
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed (make setup)", bin)
	}
	if _, err := assets.Locate(vm.Arch(runtime.GOARCH)); err != nil {
		t.Skipf("no guest image assets: %v", err)
	}
}

// assertNothingLeft checks a finished run left no VM, socket or temp file.
func (c *cliRun) assertNothingLeft(t *testing.T) {
	t.Helper()
	ents, _ := os.ReadDir(c.tmp)
	for _, e := range ents {
		t.Errorf("left in TMPDIR: %s", e.Name())
	}
	sessions, _ := filepath.Glob(filepath.Join(c.home, "sessions", "*"))
	for _, s := range sessions {
		for _, f := range []string{"scratch.img", "initrd"} {
			if _, err := os.Stat(filepath.Join(s, f)); err == nil {
				t.Errorf("left in the session folder: %s", filepath.Join(s, f))
			}
		}
	}
	procs, _ := exec.Command("pgrep", "-af", "qemu-system|vibedom").Output()
	for _, line := range strings.Split(string(procs), "\n") {
		if strings.Contains(line, c.tmp) || strings.Contains(line, c.home) {
			t.Errorf("left running: %s", line)
		}
	}
}

func sampleWorkspace(t testing.TB) string {
	t.Helper()
	ws := filepath.Join(t.TempDir(), "app")
	files := map[string]string{
		"README.md":    "# app\n",
		"greet.sh":     "#!/bin/sh\necho hello\n",
		"notes.txt":    "one\ntwo\nthree\n",
		"obsolete.txt": "old\n",
		"src/main.c":   "int main(void) { return 0; }\n",
	}
	for p, c := range files {
		fp := filepath.Join(ws, p)
		os.MkdirAll(filepath.Dir(fp), 0o755)
		if err := os.WriteFile(fp, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(ws, "greet.sh"), 0o755)
	return ws
}

func TestRunBadInput(t *testing.T) {
	c := newCLI(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "file.txt")
	os.WriteFile(file, []byte("x"), 0o644)
	empty := t.TempDir()
	oldMitm := t.TempDir()
	os.WriteFile(filepath.Join(oldMitm, "mitmdump"), []byte("#!/bin/sh\necho 'Mitmproxy: 7.0.4'\n"), 0o755)
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no path", nil, []string{"run"}, "no project given"},
		{"missing path", nil, []string{"run", filepath.Join(dir, "nope"), "--", "true"}, "does not exist"},
		{"a file", nil, []string{"run", file, "--", "true"}, "is a file, not a directory"},
		{"bad memory", nil, []string{"run", dir, "--memory", "lots", "--", "true"}, "is not a size"},
		{"tiny memory", nil, []string{"run", dir, "--memory", "64M", "--", "true"}, "at least 128M"},
		{"not enough memory", nil, []string{"run", dir, "--memory", "100000G", "--", "true"}, "not enough memory"},
		{"bad cpus", nil, []string{"run", dir, "--cpus", "0", "--", "true"}, "--cpus must be"},
		{"bad arch", nil, []string{"run", dir, "--arch", "riscv", "--", "true"}, "--arch must be"},
		{"no qemu", []string{"VIBEDOM_QEMU_X86_64=/nonexistent/qemu", "VIBEDOM_QEMU_AARCH64=/nonexistent/qemu"}, []string{"run", dir, "--", "true"}, "nonexistent"},
		{"no kernel", []string{"VIBEDOM_ASSETS=" + empty}, []string{"run", dir, "--", "true"}, "fetch-assets.sh"},
		{"no command without a terminal", nil, []string{"run", dir, "--no-network"}, "not a terminal"},
		{"bad resolve", nil, []string{"run", dir, "--resolve", "example.com:443", "--", "true"}, "NAME:PORT:ADDRESS"},
		{"bad resolve address", nil, []string{"run", dir, "--resolve", "example.com:443:nowhere", "--", "true"}, "bad address"},
		{"missing ca file", nil, []string{"run", dir, "--ca-file", filepath.Join(dir, "nope.pem"), "--", "true"}, "--ca-file"},
		{"bad preflight", nil, []string{"run", dir, "--preflight", "sometimes", "--", "true"}, "--preflight"},
		{"bad proxy engine", nil, []string{"run", dir, "--proxy-engine", "squid", "--", "true"}, "--proxy-engine must be go or mitmproxy"},
		{"no mitmdump", []string{"PATH=" + empty}, []string{"run", dir, "--proxy-engine", "mitmproxy", "--", "true"}, "mitmdump not found"},
		{"old mitmdump", []string{"PATH=" + oldMitm}, []string{"run", dir, "--proxy-engine", "mitmproxy", "--", "true"}, "is version 7.0.4; vibedom needs 8.1 or later"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "no qemu" || tt.name == "no kernel" || tt.name == "no command without a terminal" {
				if _, err := exec.LookPath("qemu-system-x86_64"); err != nil && tt.name != "no qemu" {
					t.Skip("needs QEMU to get that far")
				}
			}
			cc := *c
			cc.env = append(append([]string{}, c.env...), tt.env...)
			_, stderr, code := cc.run(t, "", tt.args...)
			if code == 0 {
				t.Fatalf("exit 0, want an error")
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not say %q", stderr, tt.want)
			}
			if strings.Contains(stderr, "logs are in") {
				t.Errorf("a refused start made a session:\n%s", stderr)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n"); lines > 1 {
				t.Errorf("error is %d lines, want a short one:\n%s", lines+1, stderr)
			}
		})
	}
	c.assertNothingLeft(t)
}

// TestRunVM drives `vibedom run … -- CMD` against a real VM: the command
// runs in the guest, the workspace is read-only even for root, the overlay
// takes every kind of change while the host tree stays as it was, and exit
// codes come back.
func TestRunVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := sampleWorkspace(t)
	before := vmtest.TreeHash(t, ws)
	script := `set -u
uname -s
id -u
echo x > /mnt/workspace/README.md 2>/dev/null && echo WROTE-WORKSPACE
mount -o remount,rw /mnt/workspace && echo x > /mnt/workspace/README.md 2>/dev/null && echo WROTE-AFTER-REMOUNT
cd /work
echo added > added.txt
echo four >> notes.txt
rm obsolete.txt
mv src/main.c src/app.c
chmod 700 greet.sh
ls | tr '\n' ' '; echo
cat notes.txt | wc -l
stat -c %a greet.sh
test -e /mnt/workspace/obsolete.txt && echo LOWER-INTACT
exit 42`
	stdout, stderr, code := c.run(t, "", "run", ws, "--memory", "512M", "--no-network", "--", "sh", "-c", script)
	if code != 42 {
		t.Fatalf("exit code %d, want 42\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := "Linux\n0\nREADME.md added.txt greet.sh notes.txt src \n4\n700\nLOWER-INTACT\n"
	if stdout != want {
		t.Errorf("guest output:\n%s\nwant:\n%s", stdout, want)
	}
	if strings.Contains(stdout, "WROTE") {
		t.Errorf("the guest wrote to the read-only workspace")
	}
	if got := vmtest.TreeHash(t, ws); got != before {
		t.Errorf("the host workspace changed during the session")
	}
	if !strings.Contains(stderr, "1 added, 1 modified, 1 deleted") && !strings.Contains(stderr, "added") {
		t.Errorf("the end-of-session summary is missing:\n%s", stderr)
	}
	if !strings.Contains(stderr, "Nothing applied") {
		t.Errorf("without a terminal nothing may be applied:\n%s", stderr)
	}
	c.assertNothingLeft(t)

	t.Run("killed by a signal", func(t *testing.T) {
		_, stderr, code := c.run(t, "", "run", ws, "--memory", "512M", "--no-network", "--no-review", "--", "sh", "-c", "kill -KILL $$")
		if code != 128+9 {
			t.Errorf("exit code %d, want 137\n%s", code, stderr)
		}
		c.assertNothingLeft(t)
	})
}

// TestRunApplyVM is the end-to-end test of the change set: a scripted agent
// edits, adds, deletes, chmods, writes a binary file and a symlink in /work;
// with --apply the host workspace ends up exactly as the guest's /work.
func TestRunApplyVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := sampleWorkspace(t)
	script := `set -e
echo 'edited by the agent' >> notes.txt
printf 'new file\n' > added.txt
mkdir -p docs/deep && printf 'doc' > docs/deep/guide.md
rm obsolete.txt
chmod 755 notes.txt
chmod 644 greet.sh
printf '\000\001\002\377binary\000' > blob.bin
ln -s notes.txt link-to-notes
printf 'no newline at end' > src/main.c`
	// The same script on a host copy gives the expected tree.
	expected := filepath.Join(t.TempDir(), "expected")
	if out, err := exec.Command("cp", "-a", ws, expected).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = expected
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("script on the host: %v %s", err, out)
	}
	_, stderr, code := c.run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\n%s", code, stderr)
	}
	if got, want := vmtest.TreeHash(t, ws), vmtest.TreeHash(t, expected); got != want {
		diff, _ := exec.Command("diff", "-r", "--no-dereference", expected, ws).CombinedOutput()
		t.Errorf("the applied workspace differs from the guest's /work:\n%s\n%s", diff, stderr)
	}
	c.assertNothingLeft(t)

	// Undo restores the workspace as it was before the apply.
	_, stderr, code = c.run(t, "", "undo")
	if code != 0 {
		t.Fatalf("undo: exit %d\n%s", code, stderr)
	}
	if got, want := vmtest.TreeHash(t, ws), vmtest.TreeHash(t, sampleWorkspace(t)); got != want {
		t.Errorf("undo did not restore the workspace")
	}
}

// TestShellVM attaches an interactive shell through a real pseudo-terminal
// and checks the guest follows a window resize.
func TestShellVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := sampleWorkspace(t)
	cmd := exec.Command(vibedomBin(t), "run", ws, "--memory", "512M", "--no-network")
	cmd.Env = c.env
	term := startOnPTY(t, cmd, 30, 100)
	ptmx, mu, out := term.ptmx, &term.mu, &term.out
	wait := func(s string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			mu.Lock()
			ok := strings.Contains(out.String(), s)
			text := out.String()
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				consoles, _ := filepath.Glob(filepath.Join(c.home, "logs", "*", "console.log"))
				for _, p := range consoles {
					b, _ := os.ReadFile(p)
					t.Logf("%s:\n%s", p, b)
				}
				t.Fatalf("waiting for %q; terminal so far:\n%s", s, text)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("attaching a shell", 3*time.Minute)
	io.WriteString(ptmx, "stty size; echo SIZE-DONE-1\n")
	wait("30 100", 30*time.Second)
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// The resize travels to the guest on its own, beside the typed lines:
	// ask again, as a user would, until the shell reports the new size.
	seen := func(s string, d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			ok := strings.Contains(out.String(), s)
			mu.Unlock()
			if ok {
				return true
			}
		}
		return false
	}
	for end := time.Now().Add(30 * time.Second); ; {
		io.WriteString(ptmx, "stty size\n")
		if seen("40 120", 2*time.Second) {
			break
		}
		if time.Now().After(end) {
			wait("40 120", 0)
		}
	}
	io.WriteString(ptmx, "tty; exit 3\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("vibedom exit: %v, want exit status 3", err)
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("vibedom did not exit after the shell did")
	}
	mu.Lock()
	text := out.String()
	mu.Unlock()
	if !strings.Contains(text, "/dev/pts/") {
		t.Errorf("the shell has no terminal:\n%s", text)
	}
	c.assertNothingLeft(t)
}

// TestConcurrentEditVM: the user edits files on the host while the agent
// works on the same files in the guest, which reads the live workspace. The
// agent's copies start from the user's versions; after the session, with
// --apply, each file holds both edits exactly once, and a file the agent
// only opened keeps the user's later edit. Driven from the guest as root:
// the guest script waits until it sees the user's edits, edits in place
// and by rename, says so on stdout, and the test then edits again.
func TestConcurrentEditVM(t *testing.T) {
	requireVM(t)
	c := newCLI(t)
	ws := filepath.Join(t.TempDir(), "app")
	os.Mkdir(ws, 0o755)
	for name, content := range map[string]string{"a.txt": "header\nx\nx\nx\n", "b.txt": "header\nx\nx\nx\n", "c.txt": "one\n"} {
		if err := os.WriteFile(filepath.Join(ws, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Committed, so the baseline knows every start content (a manifest
	// baseline of an untracked file the user changed would make each a
	// conflict whatever the base).
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "start"}} {
		git := exec.Command("git", args...)
		git.Dir = ws
		if out, err := git.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	script := `set -e
cd /work
wait_for() { n=0; until eval "$1"; do n=$((n+1)); [ $n -lt 1500 ] || { echo "TIMEOUT $1"; exit 9; }; sleep 0.2; done; }
wait_for '[ "$(grep -c "^x$" a.txt)" = 2 ] && [ "$(grep -c "^x$" b.txt)" = 2 ] && grep -q user c.txt'
sed -i 1s/header/HEADER/ a.txt
c=$(tail -n +2 b.txt); printf 'HEADER\n%s\n' "$c" > b.txt
: <> c.txt; touch c.txt
echo COPIED-UP
wait_for '! grep -q user /mnt/workspace/c.txt'
echo DONE`
	cmd := exec.Command(vibedomBin(t), "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	cmd.Env = c.env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	var out bytes.Buffer
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	edit := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The user's first edits, once the session's baseline is taken.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if m, _ := filepath.Glob(filepath.Join(c.home, "sessions", "*", "baseline", "meta.json")); len(m) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no session baseline appeared\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	edit("a.txt", "header\nx\nx\n")
	edit("b.txt", "header\nx\nx\n")
	edit("c.txt", "one\nuser\n")
	// The user's second edit, after the agent copied c.txt up unchanged.
	timeout := time.After(10 * time.Minute)
	for copied := false; !copied; {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("the guest script ended early:\n%s\n%s", out.String(), stderr.String())
			}
			out.WriteString(l + "\n")
			copied = l == "COPIED-UP"
		case <-timeout:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the guest did not copy up:\n%s\n%s", out.String(), stderr.String())
		}
	}
	edit("c.txt", "one\n")
	for l := range lines {
		out.WriteString(l + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("vibedom run: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	if !strings.Contains(out.String(), "DONE") {
		t.Fatalf("guest output:\n%s\n%s", out.String(), stderr.String())
	}
	for name, want := range map[string]string{"a.txt": "HEADER\nx\nx\n", "b.txt": "HEADER\nx\nx\n", "c.txt": "one\n"} {
		got, err := os.ReadFile(filepath.Join(ws, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q (%v), want %q\n%s", name, got, err, want, stderr.String())
		}
	}
	c.assertNothingLeft(t)
}

// ptyRun is a command on a real pseudo-terminal with its output recorded.
type ptyRun struct {
	ptmx *os.File
	mu   sync.Mutex
	out  bytes.Buffer
}

// startOnPTY starts cmd on a new pseudo-terminal of the given size and
// records everything it writes; the terminal is closed when the test ends.
func startOnPTY(t *testing.T, cmd *exec.Cmd, rows, cols uint16) *ptyRun {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptmx.Close() })
	r := &ptyRun{ptmx: ptmx}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			r.mu.Lock()
			r.out.Write(buf[:n])
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return r
}

// seen waits up to d for the output to match re.
func (r *ptyRun) seen(re *regexp.Regexp, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		r.mu.Lock()
		ok := re.Match(r.out.Bytes())
		r.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// text is the output so far.
func (r *ptyRun) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}
