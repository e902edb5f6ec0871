package qemu

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// TestChildrenHoldNoAPIKey (issue 18, item 15): qemu-system-* and
// virtiofsd, started the way a session starts them with the host's API keys
// in vibedom's environment, hold none of them in /proc/PID/environ (which
// every process of the same user can read).
func TestChildrenHoldNoAPIKey(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("virtiofsd's read-only helper needs root for its mount namespace")
	}
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	if _, err := findVirtiofsd(); err != nil {
		t.Skipf("no virtiofsd: %v", err)
	}
	keys := map[string]string{
		"ANTHROPIC_API_KEY": "sk-ant-api03-" + "ChildEnvRealKey0123456789abcdef", // gitleaks:allow
		"OPENAI_API_KEY":    "sk-proj-" + "ChildEnvRealKey0123456789abcdef",      // gitleaks:allow
	}
	for k, v := range keys {
		t.Setenv(k, v)
	}
	dir, err := os.MkdirTemp("", "vbd-env")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	share := t.TempDir()
	p := &plan{bin: bin, qmpSock: filepath.Join(dir, "qmp.sock"),
		args: []string{"-M", "none", "-nodefaults", "-nographic", "-display", "none",
			"-qmp", "unix:" + escape(filepath.Join(dir, "qmp.sock")) + ",server=on,wait=off"},
		virtiofs: []vm.Share{{Tag: "ws", HostPath: share, ReadOnly: true}},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, err := start(ctx, p, &vm.Config{StateDir: dir}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Kill(); m.Wait(context.Background()) }()
	pids := map[string]int{"qemu": m.cmd.Process.Pid}
	for i, d := range m.daemons {
		pids["virtiofsd "+strconv.Itoa(i)] = d.cmd.Process.Pid
	}
	if len(pids) != 2 {
		t.Fatalf("children: %v", pids)
	}
	for who, pid := range pids {
		env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if !bytes.Contains(env, []byte("PATH=")) {
			t.Fatalf("%s: read no environment: %q", who, env)
		}
		for k, v := range keys {
			if bytes.Contains(env, []byte(v)) || bytes.Contains(env, []byte(k+"=")) {
				t.Errorf("%s (pid %d) holds $%s in its environment", who, pid, k)
			}
		}
	}
}
