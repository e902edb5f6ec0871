// Package vmtest is the conformance suite every vm backend runs: written
// once, run against vm/qemu on Linux (in CI) and against vm/vz on a Mac. It
// boots the real guest image with the real guest agent and checks what
// vibedom relies on: the control channel carries SSH, the workspace share is
// read-only whatever root in the guest does, the scratch disk holds the
// overlay, pause and resume freeze the guest, and stop and kill end the
// machine leaving nothing behind.
//
// It lives under boot, not vm: it builds the guest image (image, keys) and
// boots it with boot.Start, so it sits above every package it drives and
// vm imports none of them. It has no tests of its own; the backends' test
// files call Run, RunStop and Boot.
package vmtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/boot"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/assets"
	"github.com/vibedom/vibedom/keys/keystest"
	"github.com/vibedom/vibedom/vm"
)

// Harness is what a backend provides to the suite.
type Harness struct {
	// Driver is the backend under test.
	Driver vm.Driver
	// Arch is the guest architecture to boot.
	Arch vm.Arch
	// Transport is the control channel the backend offers
	// (proto.TransportVirtioSerial or proto.TransportVsock).
	Transport string
	// ShareFS is how the backend shares directories (proto.FS9P or
	// proto.FSVirtiofs).
	ShareFS string
	// CPUs and MemoryMiB size the test VMs (defaults 2 and 512).
	CPUs, MemoryMiB int
	// BootTimeout bounds each boot (default 2 minutes: emulation is slow).
	BootTimeout time.Duration
	// ScratchSize is the sparse scratch disk's size (default 1 GiB: 16,384
	// inodes, as the guest formats one per 64 KiB).
	ScratchSize int64 // AccelGrace is boot.Options.AccelGrace (default: boot's).
	AccelGrace  time.Duration
}

// Guest is a booted test VM and an SSH connection to its agent.
type Guest struct {
	Machine   vm.Machine
	Client    *guestlink.Client
	Workspace string // host folder shared read-only
	Console   string // console log path
	StateDir  string
}

// Boot boots the real guest image on h.Driver with a fresh workspace
// holding files, and connects to the agent. It skips the test when the
// backend or the image's assets are unavailable. The VM is killed at the
// end of the test if it still runs.
func Boot(t testing.TB, h Harness, files map[string]string) *Guest {
	t.Helper()
	h.defaults()
	ctx := context.Background()
	if err := h.Driver.Available(ctx, h.Arch); err != nil {
		t.Skipf("backend %s cannot run %s guests here: %v", h.Driver.Name(), h.Arch, err)
	}
	as, err := assets.Locate(h.Arch)
	if err != nil {
		t.Skipf("no guest image assets for %s: %v", h.Arch, err)
	}
	img, err := image.Ensure(ctx, imageCache(t), image.NewDebianTest(as, nil))
	if err != nil {
		t.Fatalf("build the guest image: %v", err)
	}
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	for name, content := range files {
		p := filepath.Join(ws, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sk := keystest.New(t)
	k, hostPEM := sk.Keys, sk.HostPEM
	bc := &proto.BootConfig{
		Version: proto.Version, SessionID: "vmtest", Hostname: "vmtest",
		Workspace:      proto.Workspace{Tag: "workspace", FSType: h.ShareFS},
		Scratch:        proto.Scratch{Device: "/dev/vda"},
		AuthorizedKeys: []string{k.AuthorizedKey()},
	}
	if h.Transport == proto.TransportVsock {
		bc.Control = proto.Control{Transport: proto.TransportVsock, Port: vm.DefaultControlPort}
	} else {
		bc.Control = proto.Control{Transport: proto.TransportVirtioSerial, Name: vm.ControlPortName}
	}
	sf, err := image.SessionFiles(bc, hostPEM, nil)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd")
	if err := image.WriteSessionInitrd(initrd, img, sf); err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(scratch, h.ScratchSize); err != nil {
		t.Fatal(err)
	}
	stateDir, err := os.MkdirTemp("", "vmtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	g := &Guest{Workspace: ws, Console: filepath.Join(dir, "console.log"), StateDir: stateDir}
	m, c, _, err := boot.Start(ctx, h.Driver, vm.Config{
		Name: "vmtest", Arch: h.Arch, CPUs: h.CPUs, MemoryMiB: h.MemoryMiB,
		Kernel: img.Kernel, Initrd: initrd, Cmdline: "quiet",
		Shares:     []vm.Share{{Tag: "workspace", HostPath: ws, ReadOnly: true}},
		Disks:      []vm.Disk{{Path: scratch}},
		ConsoleLog: g.Console, StateDir: stateDir,
	}, boot.Options{Client: k.ClientConfig(), Timeout: h.BootTimeout, AccelGrace: h.AccelGrace})
	if m != nil {
		g.Machine = m
		t.Cleanup(func() { _ = m.Kill() })
	}
	if err != nil {
		t.Fatalf("boot the guest: %v", err)
	}
	g.Client = c
	t.Cleanup(func() { g.Client.Close() })
	return g
}

func (h *Harness) defaults() {
	if h.CPUs == 0 {
		h.CPUs = 2
	}
	if h.MemoryMiB == 0 {
		h.MemoryMiB = 512
	}
	if h.BootTimeout == 0 {
		h.BootTimeout = 2 * time.Minute
	}
	info := h.Driver.Info()
	if h.ScratchSize == 0 {
		h.ScratchSize = 1 << 30
	}
	if h.ShareFS == "" {
		h.ShareFS = proto.FS9P
		if info.ShareFS == vm.ShareVirtiofs {
			h.ShareFS = proto.FSVirtiofs
		}
	}
	if h.Transport == "" {
		h.Transport = proto.TransportVirtioSerial
		if info.Transport == vm.TransportVsock {
			h.Transport = proto.TransportVsock
		}
	}
}

// imageCache is shared by the tests of one process so the image is built
// once.
func imageCache(t testing.TB) string {
	if d := os.Getenv("VIBEDOM_TEST_IMAGE_CACHE"); d != "" {
		return d
	}
	d := filepath.Join(os.TempDir(), "vibedom-test-images")
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return "\nconsole:\n" + string(data)
}

// Sh runs a shell command in the guest and returns its stdout; it fails the
// test when the command cannot run. The exit status is returned as well.
func (g *Guest) Sh(t testing.TB, cmd string) (string, guestlink.ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := g.Client.Exec(ctx, cmd, guestlink.ExecOptions{Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q: %v (stderr %q)%s", cmd, err, errb.String(), tail(g.Console))
	}
	return out.String(), st
}

// Run is the conformance suite.
func Run(t *testing.T, h Harness) {
	g := Boot(t, h, map[string]string{"hello.txt": "hello from the host\n", "dir/nested.txt": "nested\n"})
	before := TreeHash(t, g.Workspace)

	t.Run("control channel runs commands", func(t *testing.T) {
		out, st := g.Sh(t, "uname -m; id -u")
		want := map[vm.Arch]string{vm.ArchAMD64: "x86_64", vm.ArchARM64: "aarch64"}[h.Arch]
		if st.Code != 0 || out != want+"\n0\n" {
			t.Errorf("uname -m; id -u: got %q (%v), want %q", out, st, want+"\n0\n")
		}
	})
	t.Run("workspace is read-only even for root", func(t *testing.T) {
		out, _ := g.Sh(t, "cat /mnt/workspace/hello.txt")
		if out != "hello from the host\n" {
			t.Errorf("reading the share: got %q", out)
		}
		for _, cmd := range []string{
			"echo x > /mnt/workspace/new.txt",
			"echo x >> /mnt/workspace/hello.txt",
			"rm /mnt/workspace/hello.txt",
			"mount -o remount,rw /mnt/workspace; echo x > /mnt/workspace/new.txt",
			"umount /mnt/workspace 2>/dev/null; mkdir -p /tmp/m && mount -t " + shareType(h) + " -o rw " + shareOpts(h) + " workspace /tmp/m && echo x > /tmp/m/new.txt",
		} {
			if _, st := g.Sh(t, cmd); st.Code == 0 {
				t.Errorf("%q succeeded in the guest", cmd)
			}
		}
		if got := TreeHash(t, g.Workspace); got != before {
			t.Errorf("the host workspace changed")
		}
	})
	t.Run("overlay takes the writes", func(t *testing.T) {
		script := "cd /work && echo new > added.txt && echo more >> hello.txt && rm dir/nested.txt && mv added.txt renamed.txt && chmod 755 renamed.txt && " +
			"cat hello.txt renamed.txt && stat -c %a renamed.txt && ls dir | wc -l && ls " + proto.UpperDir
		out, st := g.Sh(t, script)
		want := "hello from the host\nmore\nnew\n755\n0\n"
		if st.Code != 0 || !strings.HasPrefix(out, want) {
			t.Errorf("overlay: got %q (%v), want prefix %q", out, st, want)
		}
		if got := TreeHash(t, g.Workspace); got != before {
			t.Errorf("the host workspace changed")
		}
	})
	t.Run("scratch disk is a mounted filesystem", func(t *testing.T) {
		out, _ := g.Sh(t, "grep -c ' "+proto.ScratchMount+" ' /proc/mounts; dd if=/dev/zero of="+proto.ScratchMount+"/f bs=1M count=8 2>/dev/null && sync && stat -c %s "+proto.ScratchMount+"/f")
		if out != "1\n8388608\n" {
			t.Errorf("scratch disk: got %q", out)
		}
	})
	t.Run("sftp reads what the guest wrote", func(t *testing.T) {
		g.Sh(t, "printf 'from the guest' > /work/sftp.txt")
		sc, err := g.Client.SFTP()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		f, err := sc.Open("/work/sftp.txt")
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		_, err = b.ReadFrom(f)
		f.Close()
		if err != nil || b.String() != "from the guest" {
			t.Errorf("sftp read: got %q, %v", b.String(), err)
		}
	})
	t.Run("pause freezes the guest and resume thaws it", func(t *testing.T) {
		p, ok := g.Machine.(vm.Pauser)
		if !ok {
			t.Skip("backend has no pause")
		}
		ctx := context.Background()
		states := g.Machine.StateChanges()
		if err := p.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if s := g.Machine.State(); s != vm.StatePaused {
			t.Errorf("state after Pause: %s", s)
		}
		// A command sent while paused cannot complete until resumed.
		done := make(chan string, 1)
		go func() {
			out, _ := g.Sh(t, "echo thawed")
			done <- out
		}()
		select {
		case out := <-done:
			t.Errorf("a command completed while the VM was paused: %q", out)
		case <-time.After(2 * time.Second):
		}
		if err := p.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case out := <-done:
			if out != "thawed\n" {
				t.Errorf("after resume: got %q", out)
			}
		case <-time.After(time.Minute):
			t.Errorf("the command did not complete after Resume")
		}
		if s := g.Machine.State(); s != vm.StateRunning {
			t.Errorf("state after Resume: %s", s)
		}
		var seen []vm.State
		for len(seen) < 2 {
			select {
			case s := <-states:
				seen = append(seen, s)
			case <-time.After(5 * time.Second):
				t.Fatalf("state changes: got %v, want [paused running]", seen)
			}
		}
		if seen[0] != vm.StatePaused || seen[1] != vm.StateRunning {
			t.Errorf("state changes: got %v, want [paused running]", seen)
		}
	})
	t.Run("poweroff ends the machine cleanly", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		states := g.Machine.StateChanges()
		if err := g.Client.Poweroff(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.Machine.Wait(ctx); err != nil {
			t.Errorf("Wait after a guest power-off: %v", err)
		}
		if s := g.Machine.State(); s != vm.StateStopped {
			t.Errorf("final state: %s", s)
		}
		var last vm.State
		for s := range states {
			last = s
		}
		if last != vm.StateStopped {
			t.Errorf("last state change: %s, want stopped", last)
		}
		if err := g.Machine.Stop(ctx); err != nil {
			t.Errorf("Stop on a stopped machine: %v", err)
		}
		if _, err := g.Machine.DialControl(ctx); !errors.Is(err, vm.ErrNotRunning) {
			t.Errorf("DialControl on a stopped machine: %v", err)
		}
		leftovers(t, g.StateDir)
	})
	if got := TreeHash(t, g.Workspace); got != before {
		t.Errorf("the host workspace changed during the suite")
	}
}

// RunStop checks that Stop (the hypervisor's power button, then force)
// ends a running guest and that Kill on a stopped machine is a no-op, each
// leaving nothing behind.
func RunStop(t *testing.T, h Harness) {
	g := Boot(t, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := g.Machine.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// A guest ready for commands is ready for its power button: Stop
	// ends it cleanly (StateStopped), not by force after its timeout
	// (StateError), even right after the boot.
	if s := g.Machine.State(); s != vm.StateStopped {
		t.Errorf("state after Stop: %s (want stopped: the guest ignored the power button and was stopped by force)", s)
	}
	t.Logf("Stop took %v", time.Since(start).Round(time.Millisecond))
	leftovers(t, g.StateDir)
	if err := g.Machine.Kill(); err != nil {
		t.Errorf("Kill on a stopped machine: %v", err)
	}
}

// leftovers fails when the backend left files in its state directory.
func leftovers(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("left in the state directory: %v", names)
	}
}

func shareType(h Harness) string {
	if h.ShareFS == proto.FSVirtiofs {
		return "virtiofs"
	}
	return "9p"
}

func shareOpts(h Harness) string {
	if h.ShareFS == proto.FSVirtiofs {
		return ""
	}
	return "-o trans=virtio,version=9p2000.L"
}

// TreeHash hashes a directory tree: paths, types, modes, symlink targets
// and contents.
func TreeHash(t testing.TB, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%v\x00", rel, info.Mode())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			h.Write([]byte(target))
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write([]byte(strconv.Itoa(len(data))))
			h.Write(data)
		}
		h.Write([]byte{0})
		return nil
	})
	if err != nil {
		t.Fatalf("hash %s: %v", root, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
