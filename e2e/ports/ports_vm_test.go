package ports

import (
	"encoding/json"
	"net"
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

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// curl gets url with curl, the way a user checks a dev server.
func curl(url string) (string, error) {
	out, err := exec.Command("curl", "-sS", "--max-time", "20", url).CombinedOutput()
	return string(out), err
}

// TestPublishedPortsVM: `vibedom run --detach -p HOSTPORT:8000` on a
// workspace holding a static dev server; `vibedom exec` starts it in the
// guest; curl on the host gets its page; status lists the port; a second
// session asking for the same host port is refused with one line before
// it boots; `vibedom port add` publishes another, `port rm` closes it;
// after `vibedom stop` the port is gone and `vibedom port` says the
// session is not running.
func TestPublishedPortsVM(t *testing.T) {
	clitest.RequireVM(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	build := exec.Command("go", "build", "-o", filepath.Join(ws, "devserver"), "../../session/testdata/devserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the dev server: %v\n%s", err, out)
	}
	hostPort := freePort(t)
	out, stderr, code := c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--preflight=off", "--detach", "--json",
		"-p", strconv.Itoa(hostPort)+":8000")
	if code != 0 {
		t.Fatalf("run --detach -p: exit %d\n%s", code, stderr)
	}
	var r struct {
		Name string `json:"name"`
		PID  int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Name == "" {
		t.Fatalf("run --detach --json printed %q: %v", out, err)
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(r.PID); err == nil {
			_ = p.Signal(syscall.SIGKILL)
		}
	})
	server := c.Command(t, nil, "exec", r.Name, "--", "sh", "-c", "cp /work/devserver /tmp/devserver && chmod +x /tmp/devserver && exec /tmp/devserver 8000")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })

	url := "http://127.0.0.1:" + strconv.Itoa(hostPort)
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) { // until the server in the guest answers
		body, err := curl(url + "/index.html")
		if err == nil && body == "hello from the guest /index.html\n" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("curl %s: %q %v", url, body, err)
		}
	}
	if out, _, _ := c.Run(t, "", "status", r.Name); !strings.Contains(out, "127.0.0.1:"+strconv.Itoa(hostPort)+" -> guest port 8000") {
		t.Errorf("status does not list the port:\n%s", out)
	}

	// A second session cannot take the same host port; it fails before it boots.
	_, stderr, code = c.Run(t, "", "run", ws, "--memory", "512M", "--no-network", "--preflight=off", "--detach", "-p", strconv.Itoa(hostPort)+":8000")
	if code != 2 || !strings.Contains(stderr, "is taken") {
		t.Errorf("a second session on host port %d: exit %d\n%s", hostPort, code, stderr)
	}

	other := freePort(t)
	if _, stderr, code := c.Run(t, "", "port", r.Name, "add", strconv.Itoa(other)+":8000"); code != 0 {
		t.Fatalf("port add: exit %d\n%s", code, stderr)
	}
	if body, err := curl("http://127.0.0.1:" + strconv.Itoa(other) + "/x"); err != nil || body != "hello from the guest /x\n" {
		t.Errorf("curl through the added port: %q %v", body, err)
	}
	if out, _, code := c.Run(t, "", "port", r.Name, "rm", strconv.Itoa(other)); code != 0 || strings.Contains(out, strconv.Itoa(other)) {
		t.Errorf("port rm: exit %d\n%s", code, out)
	}
	if _, err := curl("http://127.0.0.1:" + strconv.Itoa(other) + "/x"); err == nil {
		t.Error("the removed port still answers")
	}

	if _, stderr, code := c.Run(t, "", "stop", r.Name); code != 0 {
		t.Fatalf("stop: exit %d\n%s", code, stderr)
	}
	if _, err := curl(url); err == nil {
		t.Error("the port answers after the session stopped")
	}
	if _, stderr, code := c.Run(t, "", "port", r.Name, "list"); code != 2 || !strings.Contains(stderr, "not running") {
		t.Errorf("port list on a stopped session: exit %d\n%s", code, stderr)
	}
}
