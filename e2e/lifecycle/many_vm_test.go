package lifecycle

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// session is one detached session a test started.
type session struct {
	name string
	host int // the session host's PID (the vibedom process)
}

// startWithMemory runs `vibedom run --detach --json` with the guest memory
// and the extra flags given, and returns the session; a failed test kills
// its host.
func startWithMemory(t testing.TB, c *clitest.CLI, bin, ws, memory string, extra ...string) session {
	t.Helper()
	args := append([]string{"run", ws, "--memory", memory, "--preflight=off", "--detach", "--json"}, extra...)
	out, stderr, code := c.RunWith(t, bin, "", args...)
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
		if p, err := os.FindProcess(r.PID); err == nil {
			_ = p.Signal(syscall.SIGKILL)
		}
	})
	return session{r.Name, r.PID}
}

// qemuOf returns the PID of the QEMU process under the session host pid.
func qemuOf(t testing.TB, pid int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.HasPrefix(s[strings.IndexByte(s, '(')+1:], "qemu-system") {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			return p
		}
	}
	t.Fatalf("no QEMU process under the session host %d", pid)
	return 0
}

// rssMiB is a process's resident set (VmRSS) in MiB.
func rssMiB(t testing.TB, pid int) float64 {
	t.Helper()
	return procMiB(t, pid, "VmRSS:")
}

// procMiB is a field of /proc/PID/status given in kB, in MiB.
func procMiB(t testing.TB, pid int, field string) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the status of %d: %v", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	t.Fatalf("no %s in the status of %d", field, pid)
	return 0
}

// allocScript fills 1 GiB of a fresh tmpfs in the guest (the guest kernel
// must hold every page of it), and freeScript drops it again.
const (
	allocScript = `set -e; mkdir -p /run/balloon-test; mount -t tmpfs -o size=1100m balloon /run/balloon-test
dd if=/dev/zero of=/run/balloon-test/fill bs=1M count=1024 2>/dev/null; echo filled`
	freeScript = `set -e; rm /run/balloon-test/fill; umount /run/balloon-test; echo freed`
)

// TestBalloonReturnsMemoryVM: a guest that allocates 1 GiB and frees it
// again gives the memory back to the host (virtio-balloon free page
// reporting): the QEMU process's resident set grows by about 1 GiB, then
// falls by most of it within a deadline, with no host-side action.
func TestBalloonReturnsMemoryVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	s := startWithMemory(t, c, clitest.Bin(t), ws, "1536M", "--no-network")
	qemu := qemuOf(t, s.host)
	// exec waits for the guest to be ready.
	if out, stderr, code := c.Run(t, "", "exec", s.name, "--root", "--", "sh", "-c", allocScript); code != 0 || !strings.Contains(out, "filled") {
		t.Fatalf("allocate in the guest: exit %d\n%s\n%s", code, out, stderr)
	}
	full := rssMiB(t, qemu)
	t.Logf("QEMU RSS with 1 GiB filled: %.0f MiB", full)
	if full < 1024 {
		t.Fatalf("QEMU RSS is %.0f MiB after the guest filled 1 GiB: the fill did not reach host memory", full)
	}
	if out, stderr, code := c.Run(t, "", "exec", s.name, "--root", "--", "sh", "-c", freeScript); code != 0 || !strings.Contains(out, "freed") {
		t.Fatalf("free in the guest: exit %d\n%s\n%s", code, out, stderr)
	}
	// Free page reporting works in the background (a 2 s delay, then
	// batches): wait for the drop, with a deadline.
	freed := time.Now()
	want := full - 512
	var now float64
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if now = rssMiB(t, qemu); now <= want {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("QEMU RSS still %.0f MiB 2 min after the guest freed 1 GiB (was %.0f, want ≤ %.0f): the guest did not give memory back", now, full, want)
		}
	}
	t.Logf("QEMU RSS %.0f MiB → %.0f MiB, %.1f s after the guest freed 1 GiB", full, now, time.Since(freed).Seconds())
	if _, stderr, code := c.Run(t, "", "stop", s.name); code != 0 {
		t.Fatalf("stop: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := c.Run(t, "", "review", s.name, "--apply"); code != 0 {
		t.Fatalf("review --apply: exit %d\n%s", code, stderr)
	}
	c.AssertNothingLeft(t)
}

// hostRSSBudgetMiB is the target for one session host's resident set: the
// vibedom process, guest RAM (QEMU) excluded.
const hostRSSBudgetMiB = 150

// TestFourSessionsVM runs four sessions (1 GiB each) at once on the home's
// guest image, the way four terminals would: all boot, each agent writes
// files, each is stopped and reviewed (`review --apply`), and the work
// comes back to its own workspace. Every QEMU opens the one root image
// file (same path and inode, read-only) and no copy of it is made; each
// session host, with its network on (userspace stack, proxy, DLP) and
// after 32 MB down and 16 MB up through it in all four at once, peaked
// within hostRSSBudgetMiB. About 1.5 min under TCG on a loaded 2-core
// machine (image build included), so it runs in the normal suite.
func TestFourSessionsVM(t *testing.T) {
	clitest.RequireVM(t)
	began := time.Now()
	c, bin := clitest.GuestImageHome(t)
	mans, _ := filepath.Glob(filepath.Join(c.Home, "guest", "*.json"))
	if len(mans) != 1 {
		t.Fatalf("want one guest manifest after init, have %q", mans)
	}
	var man struct {
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if b, err := os.ReadFile(mans[0]); err != nil || json.Unmarshal(b, &man) != nil || man.Root.Path == "" {
		t.Fatalf("read the guest manifest %s: %v", mans[0], err)
	}
	root := man.Root.Path
	var rootSt syscall.Stat_t
	if err := syscall.Stat(root, &rootSt); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest image built in %.0f s", time.Since(began).Seconds())

	// The "internet": a loopback HTTPS server the sessions reach as
	// example.com, for traffic through each session's proxy and DLP.
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			io.Copy(io.Discard, r.Body)
			return
		}
		w.Write(big)
	}))
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "https://"), ":")

	const n = 4
	booted := time.Now()
	var ss [n]session
	var wss [n]string
	for i := range ss {
		wss[i] = clitest.SampleWorkspace(t)
		build := exec.Command("go", "build", "-o", filepath.Join(wss[i], "loadprobe"), "./testdata/loadprobe")
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build the load probe: %v\n%s", err, out)
		}
		ss[i] = startWithMemory(t, c, bin, wss[i], "1G", "--allow", "example.com",
			"--resolve", "example.com:443:127.0.0.1:"+port, "--ca-file", caFile)
	}
	// Each agent works: exec waits for its guest to be ready.
	for i, s := range ss {
		script := fmt.Sprintf(`cd /work && echo "from session %d" > many.txt && mkdir -p out && for j in 1 2 3; do echo "$j of %d" > out/$j.txt; done && id -un`, i, i)
		out, stderr, code := c.RunWith(t, bin, "", "exec", s.name, "--", "sh", "-c", script)
		if code != 0 || strings.TrimSpace(out) != "agent" {
			t.Fatalf("work in session %d: exit %d\n%s\n%s", i, code, out, stderr)
		}
	}
	t.Logf("four sessions booted and worked in %.0f s", time.Since(booted).Seconds())

	// Traffic in all four at once: 4 × 8 MB down and 16 MB up each,
	// through the proxy and the DLP.
	loaded := time.Now()
	errs := make(chan string, n)
	for i, s := range ss {
		go func() {
			out, stderr, code := c.RunWith(t, bin, "", "exec", s.name, "--", "/work/loadprobe", "https://example.com/big", "4", "16")
			if code != 0 || !strings.Contains(out, "down=33554432 up=16777216") {
				errs <- fmt.Sprintf("traffic in session %d: exit %d\n%s\n%s", i, code, out, stderr)
				return
			}
			errs <- ""
		}()
	}
	for range ss {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
	t.Logf("traffic in four sessions at once: %.0f s", time.Since(loaded).Seconds())

	// All four run at once now: memory and the shared root image.
	for i, s := range ss {
		q := qemuOf(t, s.host)
		host, peak, guest := rssMiB(t, s.host), procMiB(t, s.host, "VmHWM:"), rssMiB(t, q)
		t.Logf("session %d: vibedom host RSS %.0f MiB (peak %.0f), QEMU RSS %.0f MiB", i, host, peak, guest)
		if peak > hostRSSBudgetMiB {
			t.Errorf("session %d: the vibedom host process held up to %.0f MiB (now %.0f), budget %d MiB", i, peak, host, hostRSSBudgetMiB)
		}
		assertOpensRoot(t, q, root, rootSt)
	}
	// No per-session copy of the root image anywhere in the home or TMPDIR.
	for _, dir := range []string{c.Home, c.Tmp} {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() || p == root {
				return nil
			}
			if fi, err := d.Info(); err == nil && fi.Size() == int64(rootSt.Size) {
				t.Errorf("a file the size of the root image (a copy?): %s", p)
			}
			return nil
		})
	}

	// Review: stop each, apply its patch, the work is in its workspace.
	for i, s := range ss {
		if _, stderr, code := c.RunWith(t, bin, "", "stop", s.name); code != 0 {
			t.Fatalf("stop %d: exit %d\n%s", i, code, stderr)
		}
		if _, stderr, code := c.RunWith(t, bin, "", "review", s.name, "--apply"); code != 0 {
			t.Fatalf("review --apply %d: exit %d\n%s", i, code, stderr)
		}
		if b, _ := os.ReadFile(filepath.Join(wss[i], "many.txt")); string(b) != fmt.Sprintf("from session %d\n", i) {
			t.Errorf("session %d: many.txt after review is %q", i, b)
		}
		if b, _ := os.ReadFile(filepath.Join(wss[i], "out", "3.txt")); string(b) != fmt.Sprintf("3 of %d\n", i) {
			t.Errorf("session %d: out/3.txt after review is %q", i, b)
		}
	}
	c.AssertNothingLeft(t)
	t.Logf("whole test: %.0f s", time.Since(began).Seconds())
}

// assertOpensRoot checks QEMU process q attached root read-only and holds
// that very file (same device and inode) open.
func assertOpensRoot(t *testing.T, q int, root string, st syscall.Stat_t) {
	t.Helper()
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", q))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range strings.Split(string(cmd), "\x00") {
		if strings.HasPrefix(a, "file="+root+",") {
			found = true
			if !strings.Contains(a, ",readonly=on") {
				t.Errorf("QEMU %d attaches the root image writable: %s", q, a)
			}
		}
	}
	if !found {
		t.Errorf("QEMU %d is not given the root image %s:\n%s", q, root, strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", q))
	for _, fd := range fds {
		var fst syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/fd/%s", q, fd.Name()), &fst) == nil && fst.Dev == st.Dev && fst.Ino == st.Ino {
			return
		}
	}
	t.Errorf("QEMU %d holds no descriptor of the root image's inode %d", q, st.Ino)
}
