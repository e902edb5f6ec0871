package agents

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/image"
)

// TestGuestImageVM drives the whole guest image pipeline as a user does,
// on the host's arch: `vibedom init` against a mirror (the Debian-sourced
// test repository, since no Alpine mirror is reachable here) — index,
// verify, resolve, download, extract, root image, boot files — then
// `vibedom run` boots it and runs git as the agent user.
func TestGuestImageVM(t *testing.T) { guestImageE2E(t, runtime.GOARCH) }

// TestGuestImageArm64 is the same on an arm64 guest under TCG (`make
// e2e-arm64`): the zboot kernel unwrapped, arm64 modules, arm64 userland.
func TestGuestImageArm64(t *testing.T) {
	if os.Getenv("VIBEDOM_E2E_ARM64") == "" && runtime.GOARCH != "arm64" {
		t.Skip("arm64 guests under TCG are slow: `make e2e-arm64` runs this")
	}
	guestImageE2E(t, "arm64")
}

func guestImageE2E(t *testing.T, goarch string) {
	qemu := map[string]string{"amd64": "qemu-system-x86_64", "arm64": "qemu-system-aarch64"}[goarch]
	if _, err := exec.LookPath(qemu); err != nil {
		t.Skipf("%s not installed (make setup)", qemu)
	}
	mirror, keys := clitest.ServeTestMirror(t, goarch)
	c := clitest.New(t)
	c.Env = append(c.Env, "VIBEDOM_TEST_ALPINE_KEYS="+keys)

	// The real binary trusts only Alpine's keys, whatever the environment says.
	stdout, stderr, _ := c.RunWith(t, clitest.Bin(t), "", "init", "--arch", goarch, "--mirror", mirror, "--json")
	var refused struct {
		ImageError string `json:"image_error"`
		Image      any    `json:"image"`
	}
	if err := json.Unmarshal([]byte(stdout), &refused); err != nil {
		t.Fatalf("init --json: %v\n%s\n%s", err, stdout, stderr)
	}
	if refused.Image != nil || !strings.Contains(refused.ImageError, "signature") {
		t.Fatalf("the release binary accepted a test-signed mirror: %+v", refused)
	}

	bin := clitest.TestKeysBin(t)
	stdout, stderr, code := c.RunWith(t, bin, "", "init", "--arch", goarch, "--mirror", mirror, "--json")
	if code != 0 {
		t.Fatalf("init: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var r struct {
		Image struct {
			Root     string `json:"root_image"`
			RootSHA  string `json:"root_sha256"`
			Packages int    `json:"packages"`
			Built    bool   `json:"built"`
		} `json:"image"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("init --json: %v\n%s", err, stdout)
	}
	if r.Image.Root == "" || r.Image.Packages < 10 {
		t.Fatalf("init built no image: %s\n%s", stdout, stderr)
	}
	e2fsckImage(t, r.Image.Root)

	// Two sessions at once on the one image file: one as the agent user
	// (the default), one with --root. The first boots vibedom's own guest
	// kernel where it is built (make kernel), the second the distribution's
	// (linux-virt's kernel and its modules, from the mirror).
	ws := clitest.SampleWorkspace(t)
	ws2 := clitest.SampleWorkspace(t)
	distro := *c
	distro.Env = append(slices.Clone(c.Env), "VIBEDOM_KERNEL=distro")
	guestKernel := clitest.GuestKernelBuilt(goarch)
	script := `uname -r; id -u; id -un; echo "home=$HOME"; git --version; bash -c 'echo bash-ok'
cd /work && echo "made by the agent" > made.txt && rm obsolete.txt && echo appended >> notes.txt
cat /proc/self/status | grep ^CapEff; git -C /work status --short | wc -l`
	type out struct {
		stdout, stderr string
		code           int
	}
	rootDone := make(chan out, 1)
	go func() {
		o, e, code := distro.RunWith(t, bin, "", "run", ws2, "--arch", goarch, "--memory", "512M", "--no-network", "--no-review", "--root",
			"--", "sh", "-c", "uname -r; id -u; echo x > /etc/written-by-root && cat /etc/written-by-root")
		rootDone <- out{o, e, code}
	}()
	stdout, stderr, code = c.RunWith(t, bin, "", "run", ws, "--arch", goarch, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("in the guest:\n%s", stdout)
	for _, want := range []string{"\n1000\n", "\nagent\n", "home=/home/agent", "git version 2.", "bash-ok"} {
		if !strings.Contains("\n"+stdout, want) {
			t.Errorf("run output lacks %q:\n%s\n%s", want, stdout, stderr)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "made.txt")); string(b) != "made by the agent\n" {
		t.Errorf("made.txt after apply: %q", b)
	}
	if _, err := os.Stat(filepath.Join(ws, "obsolete.txt")); !os.IsNotExist(err) {
		t.Errorf("obsolete.txt survived the apply: %v", err)
	}
	if release, _, _ := strings.Cut(stdout, "\n"); strings.HasSuffix(release, "-vibedom") != guestKernel {
		t.Errorf("the session booted kernel %q; vibedom's guest kernel built: %v", release, guestKernel)
	}
	// --root runs as root; writes to / land in the session's upper layer.
	r2 := <-rootDone
	if r2.code != 0 || !strings.Contains(r2.stdout, "0\nx\n") {
		t.Errorf("run --root: exit %d\n%s\n%s", r2.code, r2.stdout, r2.stderr)
	}
	if release, _, _ := strings.Cut(r2.stdout, "\n"); release == "" || strings.HasSuffix(release, "-vibedom") {
		t.Errorf("with VIBEDOM_KERNEL=distro the session booted kernel %q", release)
	}
	// Nothing a session did changed the shared image.
	if err := image.VerifyRootImage(filepath.Join(c.Home, "images"), r.Image.Root, r.Image.RootSHA, true); err != nil {
		t.Errorf("after two sessions: %v", err)
	}
	c.AssertNothingLeft(t)
}

func e2fsckImage(t *testing.T, img string) {
	t.Helper()
	bin, err := exec.LookPath("e2fsck")
	if err != nil {
		bin = "/usr/sbin/e2fsck"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Logf("e2fsck not installed: the root image's consistency is not checked")
		return
	}
	if out, err := exec.Command(bin, "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

// BenchmarkSessionReadyRootImage compares session ready time (VM start to
// the SSH handshake, from the session log) with the root image against the
// Debian test image in the same run, and times `git status` over a
// 5,000-file workspace inside the root image as the agent user.
func BenchmarkSessionReadyRootImage(b *testing.B) {
	mirror, keys := clitest.ServeTestMirror(b, runtime.GOARCH)
	bin := clitest.TestKeysBin(b)
	env := func(home string) []string {
		return append(os.Environ(), "VIBEDOM_HOME="+home, "NO_COLOR=1", "VIBEDOM_TEST_ALPINE_KEYS="+keys, "VIBEDOM_ALPINE_MIRROR=http://127.0.0.1:9/alpine")
	}
	run := func(home string, args ...string) string {
		cmd := exec.Command(bin, args...)
		cmd.Env = env(home)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	debian, alp := b.TempDir(), b.TempDir()
	run(debian, "init", "--no-image")
	start := time.Now()
	run(alp, "init", "--mirror", mirror)
	b.Logf("cold init from the local mirror: %s", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	run(alp, "init")
	b.Logf("warm init: %s", time.Since(start).Round(time.Millisecond))
	ws := b.TempDir()
	for i := 0; i < 5000; i++ {
		d := filepath.Join(ws, fmt.Sprintf("d%02d", i/250))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d.txt", i)), []byte("x\n"), 0o644)
	}
	g := exec.Command("sh", "-c", "git init -q && git add -A && git -c user.name=b -c user.email=b@example.invalid commit -qm init")
	g.Dir = ws
	if out, err := g.CombinedOutput(); err != nil {
		b.Fatalf("git: %v %s", err, out)
	}
	ready := func(home string) time.Duration {
		logs, _ := filepath.Glob(filepath.Join(home, "logs", "*", "session.log"))
		sort.Strings(logs)
		data, _ := os.ReadFile(logs[len(logs)-1])
		m := regexp.MustCompile(`guest ready.* ready=([0-9.]+m?s)`).FindSubmatch(data)
		if m == nil {
			b.Fatalf("no ready line in %s", logs[len(logs)-1])
		}
		d, _ := time.ParseDuration(string(m[1]))
		return d
	}
	var rd, ra time.Duration
	for i := 0; i < b.N; i++ {
		run(debian, "run", ws, "--no-network", "--preflight=off", "--no-review", "--", "true")
		rd += ready(debian)
		out := run(alp, "run", ws, "--no-network", "--preflight=off", "--no-review", "--", "bash", "-c",
			`cd /work && s=$EPOCHREALTIME && n=$(git status --short | wc -l) && e=$EPOCHREALTIME && echo "git-status $n $s $e"`)
		ra += ready(alp)
		var n int
		var s0, e0 float64
		if i := strings.LastIndex(out, "git-status "); i < 0 {
			b.Fatalf("no timing in:\n%s", out)
		} else if _, err := fmt.Sscanf(out[i:], "git-status %d %f %f", &n, &s0, &e0); err != nil || n != 0 {
			b.Fatalf("git status: %d changes, %v:\n%s", n, err, out)
		}
		b.Logf("git status over 5,000 files in the root image as the agent user: %.2f s", e0-s0)
	}
	b.ReportMetric(rd.Seconds()/float64(b.N), "s-ready-debian")
	b.ReportMetric(ra.Seconds()/float64(b.N), "s-ready-rootimage")
	b.ReportMetric(ra.Seconds()/rd.Seconds(), "ratio")
}
