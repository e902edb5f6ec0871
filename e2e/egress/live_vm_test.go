package egress

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// liveRig is a detached session with network, its upstream servers (the
// "internet": loopback servers reached through --resolve) and a loopback
// service on the host that the guest must never reach.
type liveRig struct {
	c        *clitest.CLI
	name     string
	tlsPort  string
	hostPort string
	hostHits atomic.Int64
	streams  chan string // paths of streams the upstream started
}

const liveProbe = "/mnt/workspace/liveprobe"

func startLiveRig(t *testing.T, names []string, extra ...string) *liveRig {
	t.Helper()
	clitest.RequireVM(t)
	r := &liveRig{c: clitest.New(t), streams: make(chan string, 16)}
	ws := clitest.SampleWorkspace(t)
	buildGuestTool(t, ws, "liveprobe")

	upstream := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasPrefix(req.URL.Path, "/stream") {
			// A long answer, for a connection that stays open.
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			r.streams <- req.Host + req.URL.Path
			for i := 0; i < 1200; i++ {
				if _, err := fmt.Fprintf(w, "chunk %d\n", i); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-req.Context().Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
			return
		}
		fmt.Fprintf(w, "upstream saw host=%s path=%s", req.Host, req.URL.Path)
	})
	tlsSrv := httptest.NewTLSServer(upstream)
	t.Cleanup(tlsSrv.Close)
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644)
	// The guest gets it too: a client that pins the upstream's certificate.
	os.WriteFile(filepath.Join(ws, "upstream-ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644)
	_, r.tlsPort, _ = strings.Cut(strings.TrimPrefix(tlsSrv.URL, "https://"), ":")

	hostSvc := httptest.NewUnstartedServer(upstream)
	hostSvc.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.hostHits.Add(1)
		}
	}
	hostSvc.Start()
	t.Cleanup(hostSvc.Close)
	_, r.hostPort, _ = strings.Cut(strings.TrimPrefix(hostSvc.URL, "http://"), ":")

	args := []string{"run", ws, "--memory", "512M", "--preflight=off", "--detach", "--json", "--ca-file", caFile}
	for _, n := range names {
		args = append(args, "--resolve", n+":443:127.0.0.1:"+r.tlsPort)
	}
	args = append(args, extra...)
	out, stderr, code := r.c.Run(t, "", args...)
	if code != 0 {
		t.Fatalf("run --detach: exit %d\n%s", code, stderr)
	}
	var st struct {
		Name string `json:"name"`
		PID  int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Name == "" {
		t.Fatalf("run --detach --json printed %q: %v", out, err)
	}
	r.name = st.Name
	t.Cleanup(func() {
		if t.Failed() {
			more, _ := filepath.Glob(filepath.Join(r.c.Home, "logs", "session-*", "session.log"))
			for _, p := range more {
				b, _ := os.ReadFile(p)
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("%s:\n%s", p, b)
			}
		}
		if p, err := os.FindProcess(st.PID); err == nil {
			_ = p.Signal(syscall.SIGKILL)
		}
	})
	return r
}

// probe runs liveprobe in the guest and returns its line.
func (r *liveRig) probe(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, code := r.c.Run(t, "", append([]string{"exec", r.name, "--", liveProbe}, args...)...)
	if code != 0 {
		t.Fatalf("exec liveprobe %v: exit %d\n%s%s", args, code, out, stderr)
	}
	return strings.TrimSpace(out)
}

// vibedom runs a command and wants the exit code.
func (r *liveRig) vibedom(t *testing.T, want int, args ...string) (string, string) {
	t.Helper()
	out, stderr, code := r.c.Run(t, "", args...)
	if code != want {
		t.Fatalf("vibedom %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, stderr)
	}
	return out, stderr
}

// oneLineError checks a refused command printed one line saying why.
func oneLineError(t *testing.T, stderr, want string) {
	t.Helper()
	if strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, want) {
		t.Errorf("want one line with %q, got %q", want, stderr)
	}
}

// TestLiveRulesVM drives vibedom allow/deny against a running session as a
// user in a second terminal would: an allow admits a new name for the next
// connection; a deny refuses new connections and closes open ones; no live
// rule makes the host's loopback or metadata reachable; bad input changes
// nothing.
func TestLiveRulesVM(t *testing.T) { testLiveRules(t) }

// TestLiveRulesVMMitmproxy is TestLiveRulesVM with --proxy-engine mitmproxy.
func TestLiveRulesVMMitmproxy(t *testing.T) {
	if _, err := mitmproxy.MitmdumpVersion(t.Context(), ""); err != nil {
		t.Skipf("mitmproxy engine not tested: %v", err)
	}
	testLiveRules(t, "--proxy-engine", "mitmproxy")
}

func testLiveRules(t *testing.T, extra ...string) {
	r := startLiveRig(t, []string{"new.example.com", "held.example.com"}, append([]string{"--allow", "held.example.com"}, extra...)...)

	// The guest carries the sandbox note, outside the workspace.
	out, stderr, code := r.c.Run(t, "", "exec", r.name, "--", "cat", "/etc/vibedom/README")
	if code != 0 || !strings.Contains(out, "vibedom allow "+r.name+" HOST") || !strings.Contains(out, "Do not work around it") {
		t.Errorf("/etc/vibedom/README: exit %d\n%s%s", code, out, stderr)
	}

	// Not allowed yet: no DNS answer (transparent), 403 (proxy).
	if got := r.probe(t, "get", "https://new.example.com/a"); !strings.Contains(got, "no such host") {
		t.Errorf("before allow, transparent: %s", got)
	}
	if got := r.probe(t, "pget", "https://new.example.com/a"); !strings.Contains(got, "Forbidden") && !strings.Contains(got, "403") {
		t.Errorf("before allow, proxy: %s", got)
	}

	t0 := time.Now()
	out, _ = r.vibedom(t, 0, "allow", r.name, "new.example.com")
	t.Logf("allow took %v", time.Since(t0))
	if !strings.Contains(out, "allowed new.example.com (session scope)") {
		t.Errorf("allow printed %q", out)
	}
	// The very next connection sees it, on both paths.
	if got := r.probe(t, "get", "https://new.example.com/a"); !strings.Contains(got, `HTTP 200`) || !strings.Contains(got, "upstream saw host=new.example.com path=/a") {
		t.Errorf("after allow, transparent: %s", got)
	}
	if got := r.probe(t, "pget", "https://new.example.com/b"); !strings.Contains(got, "upstream saw host=new.example.com path=/b") {
		t.Errorf("after allow, proxy: %s", got)
	}
	out, _ = r.vibedom(t, 0, "policy", "show", r.name)
	if !strings.Contains(out, "new.example.com") || !strings.Contains(out, "session") || !strings.Contains(out, "since") {
		t.Errorf("policy show:\n%s", out)
	}
	out, _ = r.vibedom(t, 0, "policy", "check", "--session", r.name, "new.example.com")
	if !strings.Contains(out, "allow  new.example.com:443") || !strings.Contains(out, "scope   session") {
		t.Errorf("policy check --session:\n%s", out)
	}

	// Open connections to held.example.com, transparent and through the
	// proxy's CONNECT tunnel; a deny closes both.
	var streams []*exec.Cmd
	var outs []*lockedBuf
	for _, mode := range []string{"stream", "pstream"} {
		cmd := r.c.Command(t, nil, "exec", r.name, "--", liveProbe, mode, "https://held.example.com/stream-"+mode)
		b := &lockedBuf{}
		cmd.Stdout, cmd.Stderr = b, b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		streams, outs = append(streams, cmd), append(outs, b)
		select {
		case <-r.streams:
		case <-time.After(3 * time.Minute):
			t.Fatalf("the %s never reached the upstream: %s", mode, b.String())
		}
		// The upstream answered; the deny below must find the stream open
		// at the guest's end too, so wait until the answer got there (the
		// proxy may still be passing the headers on).
		for deadline := time.Now().Add(3 * time.Minute); !strings.Contains(b.String(), "STARTED"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the %s's answer never reached the guest: %s", mode, b.String())
			}
		}
	}
	out, _ = r.vibedom(t, 0, "deny", r.name, "held.example.com")
	if !strings.Contains(out, "closed 2 open connections") {
		t.Errorf("deny printed %q", out)
	}
	for i, cmd := range streams {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(60 * time.Second): // the stream itself lasts 120 s
			cmd.Process.Kill()
			t.Errorf("an open connection to the denied name was not closed: %s", outs[i])
		}
		if o := outs[i].String(); !strings.Contains(o, "STREAM") || strings.Contains(o, "<nil>") {
			t.Errorf("stream %d ended as %q", i, o)
		}
	}
	if got := r.probe(t, "get", "https://held.example.com/again"); strings.Contains(got, "upstream saw") {
		t.Errorf("after deny, transparent: %s", got)
	}
	if got := r.probe(t, "pget", "https://held.example.com/again"); !strings.Contains(got, "Forbidden") && !strings.Contains(got, "403") {
		t.Errorf("after deny, proxy: %s", got)
	}

	// Guards: no live rule reaches loopback, metadata or the host.
	_, stderr = r.vibedom(t, 2, "allow", r.name, "127.0.0.1:"+r.hostPort)
	oneLineError(t, stderr, "never connects to")
	_, stderr = r.vibedom(t, 2, "allow", r.name, "169.254.169.254:80")
	oneLineError(t, stderr, "never connects to")
	_, stderr = r.vibedom(t, 2, "allow", r.name, "localhost:"+r.hostPort)
	oneLineError(t, stderr, "host-local")
	if host, err := os.Hostname(); err == nil && resolvesToLoopback(host) && !strings.Contains(host, "_") {
		// A name the host resolves to loopback: the rule is taken (it is
		// a name), the dial guard refuses where it leads.
		r.vibedom(t, 0, "allow", r.name, host+":"+r.hostPort)
		for _, mode := range []string{"get", "pget"} {
			if got := r.probe(t, mode, "http://"+host+":"+r.hostPort+"/"); strings.Contains(got, "upstream saw") {
				t.Errorf("%s of %s (loopback) through a live rule: %s", mode, host, got)
			}
		}
	}
	for _, u := range []string{"http://127.0.0.1:" + r.hostPort + "/", "http://169.254.169.254/"} {
		if got := r.probe(t, "pget", u); strings.Contains(got, "upstream saw") {
			t.Errorf("pget %s: %s", u, got)
		}
	}
	if n := r.hostHits.Load(); n != 0 {
		t.Errorf("the host's loopback service got %d connections from the guest", n)
	}

	// Bad input: one line, exit 2, nothing changed.
	_, stderr = r.vibedom(t, 2, "allow", "no-such-session", "x.example")
	oneLineError(t, stderr, "no-such-session")
	_, stderr = r.vibedom(t, 2, "allow", r.name, "https://x.example/")
	oneLineError(t, stderr, "without a scheme")
	_, stderr = r.vibedom(t, 2, "allow", r.name, "held.example.com")
	oneLineError(t, stderr, "still be denied")

	r.vibedom(t, 0, "stop", r.name)
	_, stderr = r.vibedom(t, 2, "allow", r.name, "x.example")
	oneLineError(t, stderr, "not running")
	network := readSessionFile(t, r.c, "network.jsonl")
	for _, want := range []string{`"kind":"policy"`, `"rule":"new.example.com"`, `"rule":"!held.example.com"`} {
		if !strings.Contains(network, want) {
			t.Errorf("network.jsonl has no %s", want)
		}
	}
}

func resolvesToLoopback(host string) bool {
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// buildGuestTool builds testdata/NAME for the guest into ws/NAME
// (/mnt/workspace/NAME in the VM).
func buildGuestTool(t *testing.T, ws, name string) {
	t.Helper()
	build := exec.Command("go", "build", "-o", filepath.Join(ws, name), "./testdata/"+name)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
}

// TestNoMITMVM: a client in the guest that pins its server's certificate
// (it trusts only that server's CA, not vibedom's) works through
// --no-mitm, the log marks the connection uninspected, and other names are
// still intercepted; --no-mitm of a model provider's host is refused.
func TestNoMITMVM(t *testing.T) {
	r := startLiveRig(t, []string{"pinned.example.com", "other.example.com"},
		"--allow", "pinned.example.com", "--allow", "other.example.com", "--no-mitm", "pinned.example.com")
	if got := r.probe(t, "pinned", "/mnt/workspace/upstream-ca.pem", "https://pinned.example.com/p"); !strings.Contains(got, "upstream saw host=pinned.example.com path=/p") {
		t.Errorf("pinned client through --no-mitm: %s", got)
	}
	if got := r.probe(t, "pinned", "/mnt/workspace/upstream-ca.pem", "https://other.example.com/p"); strings.Contains(got, "upstream saw") {
		t.Errorf("pinned client to an intercepted name: %s", got)
	}
	r.vibedom(t, 0, "stop", r.name)
	if network := readSessionFile(t, r.c, "network.jsonl"); !strings.Contains(network, "tunnelled uninspected (no-mitm)") {
		t.Errorf("network.jsonl does not mark the tunnel uninspected:\n%s", network)
	}

	ws := clitest.SampleWorkspace(t)
	_, stderr, code := r.c.Run(t, "", "run", ws, "--preflight=off", "--no-review", "--no-mitm", "api.anthropic.com", "--", "true")
	if code == 0 || !strings.Contains(stderr, "no-mitm api.anthropic.com: refused") {
		t.Errorf("--no-mitm api.anthropic.com: exit %d, %s", code, stderr)
	}
}
