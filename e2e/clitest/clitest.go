// Package clitest drives the vibedom command the way a user does, for tests:
// it builds ./cmd/vibedom once per test process, runs it with a home, a
// TMPDIR and an environment of the test's own, and checks that a finished
// run left nothing behind. The unit tests of cmd/vibedom and the end-to-end
// packages under e2e/ share it.
//
// It does not boot VMs itself, know any command's flags or output, or reach
// into the command's internals: everything goes through the built binary.
// It is imported by tests only.
package clitest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/vm"
)

// command is the import path of the vibedom command.
const command = "github.com/vibedom/vibedom/cmd/vibedom"

// Bin returns the vibedom command, built once per test process.
func Bin(t testing.TB) string {
	t.Helper()
	return prodBin.get(t)
}

// TestKeysBin returns vibedom built with the vibedom_testkeys tag: it trusts
// the Alpine keys in $VIBEDOM_TEST_ALPINE_KEYS, so the CLI can build a guest
// image from a test mirror. Every other test uses the real build, which
// ignores that variable.
func TestKeysBin(t testing.TB) string {
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
		args := append(append([]string{"build"}, flags...), "-o", b.path, command)
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

// CLI is one user of the vibedom command: a home (VIBEDOM_HOME), a TMPDIR
// and the environment every run gets.
type CLI struct {
	Home, Tmp string
	Env       []string
}

// New returns a CLI with fresh temporary folders. The Alpine mirror is a
// closed loopback port: a test that builds a guest image serves its own
// mirror, and nothing may reach the internet. Unless
// $VIBEDOM_TEST_IMAGE_CACHE is set, the homes of a test process share one
// image cache.
func New(t testing.TB) *CLI {
	t.Helper()
	c := &CLI{Home: t.TempDir(), Tmp: t.TempDir()}
	c.Env = append(os.Environ(), "VIBEDOM_HOME="+c.Home, "TMPDIR="+c.Tmp, "NO_COLOR=1",
		"VIBEDOM_ALPINE_MIRROR=http://127.0.0.1:9/alpine")
	// The binaries under test live in a temporary folder: name the
	// checkout's assets, as a checkout's bin/vibedom finds them (its
	// guest kernel included).
	if d := AssetsDir(); d != "" && os.Getenv("VIBEDOM_ASSETS") == "" {
		c.Env = append(c.Env, "VIBEDOM_ASSETS="+d)
	}
	if d := os.Getenv("VIBEDOM_TEST_IMAGE_CACHE"); d == "" {
		shared := filepath.Join(os.TempDir(), "vibedom-test-home-images")
		os.MkdirAll(shared, 0o700)
		os.MkdirAll(c.Home, 0o700)
		os.Symlink(shared, filepath.Join(c.Home, "images"))
	}
	return c
}

// AssetsDir is the test assets folder: $VIBEDOM_ASSETS, else the first
// .cache/assets in the current directory or a parent, else "".
func AssetsDir() string {
	if d := os.Getenv("VIBEDOM_ASSETS"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		d := filepath.Join(dir, ".cache", "assets")
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d
		}
		if filepath.Dir(dir) == dir {
			return ""
		}
	}
}

// GuestKernelBuilt reports whether vibedom's own guest kernel for goarch
// is built in AssetsDir (`make kernel`): sessions then boot it.
func GuestKernelBuilt(goarch string) bool {
	d := AssetsDir()
	if d == "" || os.Getenv("VIBEDOM_KERNEL") == "distro" {
		return false
	}
	_, err := os.Stat(filepath.Join(d, goarch, "guest-kernel", ".complete"))
	return err == nil
}

// Run runs the vibedom command with args and stdin and returns what it
// printed and its exit code.
func (c *CLI) Run(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return c.RunWith(t, Bin(t), stdin, args...)
}

// RunWith is Run with another build of vibedom.
func (c *CLI) RunWith(t testing.TB, bin, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = c.Env
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

// Command returns the vibedom command with args, in c's environment plus
// extraEnv, not started.
func (c *CLI) Command(t testing.TB, extraEnv []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(Bin(t), args...)
	cmd.Env = append(slices.Clone(c.Env), extraEnv...)
	return cmd
}

// RequireVM skips when no QEMU or guest image assets are here.
func RequireVM(t testing.TB) {
	t.Helper()
	bin := map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"}[runtime.GOARCH]
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed (make setup)", bin)
	}
	if _, err := assets.Locate(vm.Arch(runtime.GOARCH)); err != nil {
		t.Skipf("no guest image assets: %v", err)
	}
}

// AssertNothingLeft checks a finished run left no VM, socket or temp file.
func (c *CLI) AssertNothingLeft(t *testing.T) {
	t.Helper()
	ents, _ := os.ReadDir(c.Tmp)
	for _, e := range ents {
		t.Errorf("left in TMPDIR: %s", e.Name())
	}
	sessions, _ := filepath.Glob(filepath.Join(c.Home, "sessions", "*"))
	for _, s := range sessions {
		for _, f := range []string{"scratch.img", "initrd"} {
			if _, err := os.Stat(filepath.Join(s, f)); err == nil {
				t.Errorf("left in the session folder: %s", filepath.Join(s, f))
			}
		}
	}
	procs, _ := exec.Command("pgrep", "-af", "qemu-system|vibedom").Output()
	for _, line := range strings.Split(string(procs), "\n") {
		if strings.Contains(line, c.Tmp) || strings.Contains(line, c.Home) {
			t.Errorf("left running: %s", line)
		}
	}
}

// SampleWorkspace makes a small project: a README, a script, a text file,
// a file the tests delete and a C source under src/.
func SampleWorkspace(t testing.TB) string {
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

// PTY is a command on a real pseudo-terminal with its output recorded.
type PTY struct {
	// File is the terminal's controlling side: write to it to type.
	File *os.File
	mu   sync.Mutex
	out  bytes.Buffer
}

// StartOnPTY starts cmd on a new pseudo-terminal of the given size and
// records everything it writes; the terminal is closed when the test ends.
func StartOnPTY(t *testing.T, cmd *exec.Cmd, rows, cols uint16) *PTY {
	t.Helper()
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptmx.Close() })
	r := &PTY{File: ptmx}
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

// Seen waits up to d for the output to match re.
func (r *PTY) Seen(re *regexp.Regexp, d time.Duration) bool {
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

// Text is the output so far.
func (r *PTY) Text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}
