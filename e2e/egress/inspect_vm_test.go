package egress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// TestInspectVM: `vibedom run --inspect` prints the live view's URL; while
// the session runs, the web UI lists the request the guest made (the
// upstream got it once) and refuses a replay; the session then ends
// cleanly.
func TestInspectVM(t *testing.T) {
	clitest.RequireVM(t)
	if _, err := mitmproxy.MitmwebVersion(t.Context(), ""); err != nil {
		t.Skipf("live view not tested: %v", err)
	}
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)
	var hits atomic.Int64
	port, caFile := clitest.ServeTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, "ok")
	}), "api.anthropic.com")
	buildProbe(t, ws)

	// The guest makes one request, then waits (at most 60 s) for the test
	// to have looked at the live view.
	guest := "/mnt/workspace/probe https:https://api.anthropic.com/inspect-vm; " +
		"for i in $(seq 120); do [ -e /mnt/workspace/looked ] && break; sleep 0.5; done"
	cmd := exec.Command(clitest.Bin(t), "run", ws, "--preflight=warn", "--no-review", "--inspect",
		"--resolve", "api.anthropic.com:443:127.0.0.1:"+port, "--ca-file", caFile, "--", "sh", "-c", guest)
	cmd.Env = c.Env
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	var stderr strings.Builder
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			stderr.WriteString(line + "\n")
			if _, u, ok := strings.Cut(line, "live view (read-only) of the requests as sent upstream: "); ok {
				urls <- u
			}
		}
		close(urls)
	}()
	u := <-urls
	if !strings.HasPrefix(u, "http://127.0.0.1:") {
		cmd.Wait()
		t.Fatalf("no live view URL printed:\n%s", stderr.String())
	}
	listed := false
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && !listed; time.Sleep(200 * time.Millisecond) {
		base, token, _ := strings.Cut(u, "?") // the view answers only with the session's token
		resp, err := http.Get(base + "flows?" + token)
		if err != nil {
			continue
		}
		var flows []struct {
			Request struct {
				Path string `json:"path"`
			} `json:"request"`
		}
		json.NewDecoder(resp.Body).Decode(&flows)
		resp.Body.Close()
		for _, f := range flows {
			listed = listed || f.Request.Path == "/inspect-vm"
		}
	}
	if !listed {
		t.Error("the live view never listed the guest's request")
	}
	resp, err := http.Post(u+"clear", "application/json", nil)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST /clear: %d, want 403", resp.StatusCode)
		}
	}
	os.WriteFile(filepath.Join(ws, "looked"), nil, 0o644)
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "/inspect-vm HTTP 200") {
		t.Errorf("the guest's request did not get through:\n%s", stdout.String())
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("the upstream got %d requests, want 1", n)
	}
	c.AssertNothingLeft(t)
}
