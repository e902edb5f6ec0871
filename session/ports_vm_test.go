//go:build linux

package session

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/vibedom/vibedom/boot/vmtest"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/vm/qemu"
)

// TestPublishedPortVM: a dev server (a static binary from the workspace)
// listens on the guest's loopback; the host publishes it and curl on the
// host gets its page, a WebSocket echo works through it, and port rm
// closes it. The guest's network plays no part: the connection is a
// direct-tcpip channel of the control connection.
func TestPublishedPortVM(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	bin := filepath.Join(t.TempDir(), "devserver")
	build := exec.Command("go", "build", "-o", bin, "./testdata/devserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the dev server: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	g := vmtest.Boot(t, vmtest.Harness{
		Driver: qemu.New(qemu.Options{CacheDir: os.TempDir(), ShareFS: string(vm.Share9P)}), Arch: vm.Arch(runtime.GOARCH),
		Transport: proto.TransportVirtioSerial, ShareFS: proto.FS9P, BootTimeout: 5 * time.Minute,
	}, map[string]string{"devserver": string(data)})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const guestPort = 8000
	var serverErr bytes.Buffer
	go g.Client.Exec(ctx, fmt.Sprintf("cp /work/devserver /tmp/devserver && chmod +x /tmp/devserver && exec /tmp/devserver %d", guestPort),
		guestlink.ExecOptions{Stderr: &serverErr})

	pt := newPortTable()
	t.Cleanup(func() { pt.closeAll() })
	pt.start(g.Client.DialPort, slog.New(slog.NewTextHandler(t.Output(), nil)))
	hostPort := freePort(t)
	if err := pt.add(PortSpec{HostAddr: DefaultPortAddr, HostPort: hostPort, GuestPort: guestPort}); err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(hostPort)
	curl := func(path string) (string, error) {
		out, err := exec.Command("curl", "-sS", "--max-time", "20", url+path).CombinedOutput()
		return string(out), err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		body, err := curl("/app.js")
		if err == nil && body == "hello from the guest /app.js\n" {
			break
		}
		if time.Now().After(deadline) {
			diag, _ := g.Client.Output(t.Context(), "ip addr 2>&1; netstat -ltn 2>&1; cat /proc/net/tcp; ls -l /tmp/devserver 2>&1")
			t.Logf("guest:\n%s", diag)
			t.Fatalf("curl through the published port: %q %v (server: %q)", body, err, serverErr.String())
		}
		time.Sleep(200 * time.Millisecond) // the server starts in the guest: poll until it answers
	}
	ws, err := websocket.Dial("ws://127.0.0.1:"+strconv.Itoa(hostPort)+"/ws", "", url)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, msg := range []string{"hot reload", strings.Repeat("x", 100<<10)} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		// The echo may come back in several frames (io.Copy in the server).
		var got string
		ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		for len(got) < len(msg) {
			var part string
			if err := websocket.Message.Receive(ws, &part); err != nil {
				t.Fatalf("WebSocket echo through the guest: %d bytes, %v", len(got), err)
			}
			got += part
		}
		if got != msg {
			t.Fatalf("WebSocket echo through the guest: %d bytes back, not what was sent", len(got))
		}
	}
	if _, err := pt.rm(strconv.Itoa(hostPort)); err != nil {
		t.Fatal(err)
	}
	if _, err := curl("/"); err == nil {
		t.Error("curl got through after port rm")
	}
}
