package lifecycle

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestRunVM drives `vibedom run … -- CMD` against a real VM: the command
// runs in the guest, the workspace is read-only even for root, the overlay
// takes every kind of change while the host tree stays as it was, and exit
// codes come back.
func TestRunVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
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
	stdout, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--", "sh", "-c", script)
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
	c.AssertNothingLeft(t)

	t.Run("killed by a signal", func(t *testing.T) {
		_, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--no-review", "--", "sh", "-c", "kill -KILL $$")
		if code != 128+9 {
			t.Errorf("exit code %d, want 137\n%s", code, stderr)
		}
		c.AssertNothingLeft(t)
	})
}

// TestRunApplyVM is the end-to-end test of the change set: a scripted agent
// edits, adds, deletes, chmods, writes a binary file and a symlink in /work;
// with --apply the host workspace ends up exactly as the guest's /work.
func TestRunApplyVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
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
	_, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\n%s", code, stderr)
	}
	if got, want := vmtest.TreeHash(t, ws), vmtest.TreeHash(t, expected); got != want {
		diff, _ := exec.Command("diff", "-r", "--no-dereference", expected, ws).CombinedOutput()
		t.Errorf("the applied workspace differs from the guest's /work:\n%s\n%s", diff, stderr)
	}
	c.AssertNothingLeft(t)

	// Undo restores the workspace as it was before the apply.
	_, stderr, code = c.Run(t, "", "undo")
	if code != 0 {
		t.Fatalf("undo: exit %d\n%s", code, stderr)
	}
	if got, want := vmtest.TreeHash(t, ws), vmtest.TreeHash(t, clitest.SampleWorkspace(t)); got != want {
		t.Errorf("undo did not restore the workspace")
	}
}

// TestShellVM attaches an interactive shell through a real pseudo-terminal
// and checks the guest follows a window resize.
func TestShellVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	cmd := exec.Command(clitest.Bin(t), "run", ws, "--memory", "512M", "--no-network")
	cmd.Env = c.Env
	term := clitest.StartOnPTY(t, cmd, 30, 100)
	ptmx := term.File
	wait := func(s string, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			text := term.Text()
			if strings.Contains(text, s) {
				return
			}
			if time.Now().After(deadline) {
				consoles, _ := filepath.Glob(filepath.Join(c.Home, "logs", "*", "console.log"))
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
			if strings.Contains(term.Text(), s) {
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
	text := term.Text()
	if !strings.Contains(text, "/dev/pts/") {
		t.Errorf("the shell has no terminal:\n%s", text)
	}
	c.AssertNothingLeft(t)
}

// TestConcurrentEditVM: the user edits files on the host while the agent
// works on the same files in the guest, which reads the live workspace. The
// agent's copies start from the user's versions; after the session, with
// --apply, each file holds both edits exactly once, and a file the agent
// only opened keeps the user's later edit. Driven from the guest as root:
// the guest script waits until it sees the user's edits, edits in place
// and by rename, says so on stdout, and the test then edits again.
func TestConcurrentEditVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
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
	clitest.CommitAll(t, ws, "start")
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
	cmd := exec.Command(clitest.Bin(t), "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	cmd.Env = c.Env
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
		if m, _ := filepath.Glob(filepath.Join(c.Home, "sessions", "*", "baseline", "meta.json")); len(m) > 0 {
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
	c.AssertNothingLeft(t)
}
