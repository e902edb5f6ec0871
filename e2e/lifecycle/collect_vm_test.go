package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
)

// TestCollectLargeFilesVM: files of 2 MB, 100 MB and 200 MB written in the
// guest come back whole: `vibedom run --apply` leaves them in the host
// workspace with the hashes the guest computed. (Collection once went
// through SFTP, whose short reads cut every file over ~1.1 MB.) The big
// files repeat an 8 KiB random block with a counter mixed in, so the patch
// compresses and the test stays short under TCG; the 2 MB file is random.
func TestCollectLargeFilesVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	script := `set -e
s=/mnt/scratch
dd if=/dev/urandom of=$s/p bs=1k count=8 2>/dev/null
i=0
while [ $i -lt 15 ]; do cat $s/p $s/p > $s/q; echo $i >> $s/q; mv $s/q $s/p; i=$((i+1)); done
head -c 209715211 $s/p > big200.bin
tail -c 104857613 $s/p > big100.bin
rm $s/p
dd if=/dev/urandom of=rand2.bin bs=1k count=2051 2>/dev/null
sha256sum big200.bin big100.bin rand2.bin`
	stdout, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			want[f[1]] = f[0]
		}
	}
	if len(want) != 3 {
		t.Fatalf("guest hashes: %q", stdout)
	}
	for name, sum := range want {
		f, err := os.Open(filepath.Join(ws, name))
		if err != nil {
			t.Errorf("%s not applied: %v\n%s", name, err, stderr)
			continue
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum {
			t.Errorf("%s: %d bytes on the host with sha256 %s, the guest had %s", name, n, got[:12], sum[:12])
		}
	}
	c.AssertNothingLeft(t)
}

// TestCollectNotCarriedVM: what a patch cannot carry — a path past 4096
// bytes, a setuid bit, a sticky directory, a fifo — is listed as not
// carried with its reason, and the rest of the session is still collected
// and applied. (A path over 4096 bytes once aborted the whole collection.)
func TestCollectNotCarriedVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	script := `set -e
echo ok > ok.txt
printf '#!/bin/sh\n' > suid.sh
chmod 4755 suid.sh
mkdir shared
chmod 1777 shared
echo x > shared/f
mkfifo pipe
d=` + strings.Repeat("d", 180) + `
(i=0; while [ $i -lt 25 ]; do mkdir $d; cd -P $d; echo x > f; i=$((i+1)); done)`
	stdout, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--apply", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if data, err := os.ReadFile(filepath.Join(ws, "ok.txt")); err != nil || string(data) != "ok\n" {
		t.Errorf("ok.txt on the host: %q, %v\n%s", data, err, stderr)
	}
	// The deep paths make the summary long: show its lines shortened.
	var short []string
	for _, l := range strings.Split(stderr, "\n") {
		if len(l) > 160 {
			l = l[:80] + " … " + l[len(l)-70:]
		}
		short = append(short, l)
	}
	for _, want := range []string{"Not carried", "suid.sh  setuid bit", "shared  sticky bit", "pipe  special file"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the summary does not say %q:\n%s", want, strings.Join(short, "\n"))
		}
	}
	if !strings.Contains(stderr, "longer than 4096 bytes") && !strings.Contains(stderr, "file name too long") {
		t.Errorf("the deep path is not reported as not carried:\n%s", strings.Join(short, "\n"))
	}
	c.AssertNothingLeft(t)
}

// TestCollectBusyWritersVM: processes still writing in /work when the
// session stops — a `vibedom exec` that appends forever and a background
// job the agent left, immune to the hang-up — do not fail the collection:
// `vibedom stop` collects, and the review brings the agent's work back.
// (The guest once read a log "changed while reading", the stream ended
// without its end, and the scratch disk was deleted.)
func TestCollectBusyWritersVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws, "--", "sh", "-c",
		`(trap "" HUP TERM; while :; do echo x >> /work/bg.log; done) & echo hi > /work/a.txt; exec sleep 100000`)
	writer := exec.Command(clitest.Bin(t), "exec", name, "--", "sh", "-c", "while :; do echo x >> /work/dev-server.log; done")
	writer.Env = c.Env
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writer.Process.Kill(); writer.Wait() })
	// Both writers run before the stop.
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, _, code := c.Run(t, "", "exec", name, "--", "sh", "-c", "test -s /work/dev-server.log && test -s /work/bg.log && test -s /work/a.txt")
		if code == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the writers did not start")
		}
	}
	out, stderr, code := c.Run(t, "", "stop", name)
	if code != 0 || !strings.Contains(out, "vibedom review "+name) {
		t.Fatalf("stop: exit %d\n%s\n%s", code, out, stderr)
	}
	if _, stderr, code = c.Run(t, "", "review", name, "--apply"); code != 0 {
		t.Fatalf("review --apply: exit %d\n%s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "a.txt")); err != nil || string(b) != "hi\n" {
		t.Errorf("a.txt: %q %v", b, err)
	}
	for _, f := range []string{"bg.log", "dev-server.log"} {
		b, err := os.ReadFile(filepath.Join(ws, f))
		if err != nil || len(b) == 0 || strings.Trim(string(b), "x\n") != "" {
			t.Errorf("%s: %d bytes, %v", f, len(b), err)
		}
	}
	c.AssertNothingLeft(t)
}

// TestCollectStalledVM: a guest that stops sending in the middle of the
// collection (its VM frozen with SIGSTOP) is given up after the idle time
// ($VIBEDOM_COLLECT_IDLE, short here); the session ends "crashed,
// recoverable" with its scratch disk, says to run vibedom recover, and
// recover brings the work back. (A fixed 10-minute deadline once ended it
// by deleting the scratch disk.)
func TestCollectStalledVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	c.Env = append(c.Env, "VIBEDOM_COLLECT_IDLE=5s")
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws)
	if _, stderr, code := c.Run(t, "", "exec", name, "--", "sh", "-c", "echo kept > /work/kept.txt && sync"); code != 0 {
		t.Fatalf("exec: exit %d\n%s", code, stderr)
	}
	pgrep, err := exec.Command("pgrep", "-f", "qemu-system.*"+regexp.QuoteMeta(c.Home)).Output()
	if err != nil {
		t.Fatalf("find the VM's process: %v", err)
	}
	var qemus []int
	for _, f := range strings.Fields(string(pgrep)) {
		pid, _ := strconv.Atoi(f)
		qemus = append(qemus, pid)
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	t.Cleanup(func() {
		for _, pid := range qemus {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	_, stderr, code := c.Run(t, "", "stop", name)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; code == 0 || !strings.Contains(last, "vibedom recover "+name) || !strings.Contains(last, "stopped sending") {
		t.Fatalf("stop of a stalled session: exit %d\n%s", code, stderr)
	}
	out, _, _ := c.Run(t, "", "list")
	if !regexp.MustCompile(name + `\s+crashed, recoverable`).MatchString(out) {
		t.Errorf("list after a stalled collection:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(c.Home, "sessions", name, "scratch.img")); err != nil {
		t.Fatalf("the scratch disk is gone: %v", err)
	}
	if _, stderr, code = c.Run(t, "", "recover", name, "--apply"); code != 0 {
		t.Fatalf("recover: exit %d\n%s", code, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "kept.txt")); err != nil || string(b) != "kept\n" {
		t.Errorf("kept.txt after recover: %q %v", b, err)
	}
	c.AssertNothingLeft(t)
}

// TestCollectInterruptVM: SIGTERM to a detached host while it collects
// from a guest that stopped answering (its VM frozen) does not abort at
// once: the host says a second one aborts and keeps the scratch disk; the
// second one does, and the session is crashed, recoverable, without
// waiting for the idle deadline (left at its 2-minute default).
func TestCollectInterruptVM(t *testing.T) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	name := startDetached(t, c, ws)
	if _, stderr, code := c.Run(t, "", "exec", name, "--", "sh", "-c", "echo kept > /work/kept.txt && sync"); code != 0 {
		t.Fatalf("exec: exit %d\n%s", code, stderr)
	}
	host := int(state(t, c, name)["pid"].(float64))
	pgrep, err := exec.Command("pgrep", "-f", "qemu-system.*"+regexp.QuoteMeta(c.Home)).Output()
	if err != nil {
		t.Fatalf("find the VM's process: %v", err)
	}
	for _, f := range strings.Fields(string(pgrep)) {
		pid, _ := strconv.Atoi(f)
		syscall.Kill(pid, syscall.SIGSTOP)
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	}
	hostLog := filepath.Join(c.Home, "logs", "host-"+name+".log")
	waitLog := func(want string) {
		t.Helper()
		for end := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if b, _ := os.ReadFile(hostLog); strings.Contains(string(b), want) {
				return
			}
			if time.Now().After(end) {
				b, _ := os.ReadFile(hostLog)
				t.Fatalf("the host log never said %q:\n%s", want, b)
			}
		}
	}
	syscall.Kill(host, syscall.SIGTERM) // stop: the agent does not answer; after 10 s the host collects
	waitLog("collecting the agent's changes\n")
	syscall.Kill(host, syscall.SIGTERM)
	waitLog("press Ctrl-C again to abort and keep the scratch disk for vibedom recover " + name)
	if st := state(t, c, name)["status"]; st != "stopping" && st != "running" {
		t.Errorf("after one interrupt while collecting the session is %v", st)
	}
	syscall.Kill(host, syscall.SIGTERM)
	for end := time.Now().Add(2 * time.Minute); syscall.Kill(host, 0) == nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the host did not end after the second interrupt")
		}
	}
	out, _, _ := c.Run(t, "", "list")
	if !regexp.MustCompile(name + `\s+crashed, recoverable`).MatchString(out) {
		t.Errorf("list after an aborted collection:\n%s", out)
	}
	if e, _ := state(t, c, name)["error"].(string); !strings.Contains(e, "collection aborted") || !strings.Contains(e, "vibedom recover "+name) {
		t.Errorf("the session's error: %q", e)
	}
	if _, err := os.Stat(filepath.Join(c.Home, "sessions", name, "scratch.img")); err != nil {
		t.Errorf("the scratch disk is gone: %v", err)
	}
}
