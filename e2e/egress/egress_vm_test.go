package egress

import (
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vibedom/vibedom/e2e/clitest"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
)

// TestEgressVM drives the egress boundary the way an agent running as root
// would: a probe inside the guest tries the allowed way out and every other
// way, then flushes what it can of the guest's network set-up (routes,
// resolv.conf, iptables where it exists) and tries again. The host's
// allowlist must hold both times, and each refusal must be in alerts.jsonl.
func TestEgressVM(t *testing.T) { testEgressVM(t) }

// TestEgressVMMitmproxy is TestEgressVM with --proxy-engine mitmproxy.
func TestEgressVMMitmproxy(t *testing.T) {
	if _, err := mitmproxy.MitmdumpVersion(t.Context(), ""); err != nil {
		t.Skipf("mitmproxy engine not tested: %v", err)
	}
	testEgressVM(t, "--proxy-engine", "mitmproxy")
}

func testEgressVM(t *testing.T, extra ...string) {
	clitest.RequireVM(t)
	c := clitest.New(t)
	ws := clitest.SampleWorkspace(t)

	// The "internet": loopback servers with their own CA, reached through
	// --resolve for example.com (which the allowlist names).
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw host=%s path=%s", r.Host, r.URL.Path)
	})
	tlsSrv := httptest.NewTLSServer(upstream)
	defer tlsSrv.Close()
	plainSrv := httptest.NewServer(upstream)
	defer plainSrv.Close()
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644)

	// A host service on loopback the guest must never reach, whatever
	// the rules say (the run allows 0.0.0.0:* and 127.0.0.1:*).
	var hostHits atomic.Int64
	hostSvc := httptest.NewUnstartedServer(upstream)
	hostSvc.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			hostHits.Add(1)
		}
	}
	hostSvc.Start()
	defer hostSvc.Close()
	_, hostPort, _ := strings.Cut(strings.TrimPrefix(hostSvc.URL, "http://"), ":")

	buildProbe(t, ws)
	// The repository allows the denied name: ignored, with a notice, until
	// the user approves the file.
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	os.WriteFile(filepath.Join(ws, ".vibedom", "trusted_domains.txt"), []byte("denied.example.net:*\n"), 0o644)

	probes := []string{
		"https:https://example.com/allowed",
		"proxy:https://example.com/via-proxy",
		"resolve:example.com",
		"resolve:denied.example.net",
		"tcp:93.184.216.34:443",
		"tcp:$gw:22",
		"tcp:$gw:8080",
		"tcp:10.0.0.1:80",
		"tcp:192.168.1.1:443",
		"tcp:1.1.1.1:443",
		"udp:8.8.8.8:53",
		"udp:1.1.1.1:53",
		"icmp:1.1.1.1",
		"icmp:10.0.0.1",
		"icmp:$gw",
		"sni:example.com:443:denied.example.net",
		"host:http://example.com/spoof:denied.example.net",
		"proxy:http://0.0.0.0:" + hostPort + "/",
		"proxy:https://0.0.0.0:" + hostPort + "/",
		"proxy:http://127.0.0.1:" + hostPort + "/",
		"proxy:http://[::ffff:127.0.0.1]:" + hostPort + "/",
		"tcp:127.0.0.1:" + hostPort,
	}
	script := `set -u
P=/mnt/workspace/probe
gw=$(ip route | awk '/^default/ {print $3; exit}')
all() { PROBE_PARALLEL=1 $P ` + strings.Join(probes, " ") + `; }
echo "ROUND 1 gw=$gw"; all
# What root would try: flush the firewall, route around the gateway,
# point DNS elsewhere.
iptables -F 2>/dev/null; iptables -P OUTPUT ACCEPT 2>/dev/null
ip route add 0.0.0.0/1 via "$gw" 2>/dev/null; ip route add 128.0.0.0/1 via "$gw" 2>/dev/null
ip route add 8.8.8.8/32 dev eth0 2>/dev/null
echo "nameserver 8.8.8.8" > /etc/resolv.conf
echo "ROUND 2"; all
`
	_, tlsPort, _ := strings.Cut(strings.TrimPrefix(tlsSrv.URL, "https://"), ":")
	_, plainPort, _ := strings.Cut(strings.TrimPrefix(plainSrv.URL, "http://"), ":")
	args := append([]string{"run", ws, "--preflight=off", "--no-review"}, extra...)
	stdout, stderr, code := c.Run(t, "", append(args,
		"--allow", "example.com",
		"--allow", "0.0.0.0:*", "--allow", "127.0.0.1:*",
		"--resolve", "example.com:443:127.0.0.1:"+tlsPort,
		"--resolve", "example.com:80:127.0.0.1:"+plainPort,
		"--ca-file", caFile,
		"--", "sh", "-c", script)...)
	if code != 0 {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("guest:\n%s", stdout)
	if strings.Contains(strings.Join(extra, " "), "mitmproxy") && !strings.Contains(stderr, "starting mitmdump") {
		t.Errorf("the run did not use the mitmproxy engine:\n%s", stderr)
	}
	if !strings.Contains(stdout+stderr, "ignored 1 allow rule of .vibedom/trusted_domains.txt (not approved)") {
		t.Errorf("no notice of the workspace's ignored allow rule:\n%s", stderr)
	}

	_, after, _ := strings.Cut(stdout, "ROUND 1 gw=")
	gw, _, _ := strings.Cut(after, "\n")
	rounds := strings.Split(stdout, "ROUND 2")
	if len(rounds) != 2 || gw == "" {
		t.Fatalf("the probe script did not find the gateway or did not run both rounds:\n%s", stdout)
	}
	for i, round := range rounds {
		lines := map[string]string{}
		for _, line := range strings.Split(round, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok {
				lines[k] = v
			}
		}
		res := map[string]string{} // by probe as written, $gw and all
		for _, p := range probes {
			if v, ok := lines[strings.ReplaceAll(p, "$gw", gw)]; ok {
				res[p] = v
			}
		}
		check := func(p string, ok func(string) bool, want string) {
			t.Helper()
			got, found := res[p]
			if !found {
				t.Errorf("round %d: no result for %s", i+1, p)
			} else if !ok(got) {
				t.Errorf("round %d: %s: got %q, want %s", i+1, p, got, want)
			}
		}
		has := func(s ...string) func(string) bool {
			return func(got string) bool {
				for _, x := range s {
					if strings.Contains(got, x) {
						return true
					}
				}
				return false
			}
		}
		refused := func(got string) bool { return strings.HasPrefix(got, "ERR ") }
		// Round 1 uses the network as set up. In round 2 resolv.conf
		// points at 8.8.8.8, which nothing reaches: the transparent path
		// loses its DNS (nothing answers, nothing leaks) while the proxy
		// still works; nowhere does an outside answer come back.
		for _, p := range []string{"https:https://example.com/allowed", "proxy:https://example.com/via-proxy"} {
			if i == 1 && strings.HasPrefix(p, "https:") {
				check(p, func(got string) bool { return refused(got) || strings.Contains(got, `root="vibedom`) }, "no answer but the MITM's")
				continue
			}
			path := p[strings.LastIndex(p, "/"):]
			check(p, has(`HTTP 200 root="vibedom`), "200 through the MITM (chain ending at the vibedom CA)")
			check(p, has("upstream saw host=example.com path="+path), "the upstream's answer")
		}
		if i == 0 {
			check("resolve:example.com", has("ADDRS 198.18."), "a synthetic address")
			check("resolve:denied.example.net", has("no such host"), "NXDOMAIN")
		} else {
			check("resolve:example.com", refused, "no DNS answer from 8.8.8.8")
			check("resolve:denied.example.net", refused, "no DNS answer from 8.8.8.8")
		}
		for _, p := range []string{"tcp:93.184.216.34:443", "tcp:$gw:22", "tcp:$gw:8080", "tcp:10.0.0.1:80", "tcp:192.168.1.1:443", "tcp:1.1.1.1:443"} {
			check(p, refused, "the connect refused")
		}
		for _, p := range []string{"udp:8.8.8.8:53", "udp:1.1.1.1:53", "icmp:1.1.1.1", "icmp:10.0.0.1", "icmp:$gw"} {
			check(p, func(got string) bool { return !strings.HasPrefix(got, "REPLY") }, "no answer")
		}
		check("sni:example.com:443:denied.example.net", func(got string) bool {
			return refused(got) || !strings.Contains(got, "upstream saw")
		}, "the TLS session refused")
		check("host:http://example.com/spoof:denied.example.net", func(got string) bool {
			return refused(got) || (!strings.Contains(got, "upstream saw") && !strings.HasPrefix(got, "HTTP 2"))
		}, "the request refused")
		for _, p := range probes[len(probes)-5:] {
			check(p, func(got string) bool { return !strings.Contains(got, "upstream saw") }, "the host's loopback never reached")
		}
	}

	if n := hostHits.Load(); n != 0 {
		t.Errorf("the host's loopback service got %d connections from the guest", n)
	}
	// Every refusal is an alert the user can read.
	alerts := readSessionFile(t, c, "alerts.jsonl")
	for _, want := range []string{`"denied.example.net`, `"93.184.216.34`, `"10.0.0.1`, `"192.168.1.1`, `"1.1.1.1`, `"8.8.8.8`, "spoof"} {
		if !strings.Contains(alerts, want) {
			t.Errorf("alerts.jsonl has no entry for %s", want)
		}
	}
	if t.Failed() {
		t.Logf("alerts.jsonl:\n%s", alerts)
	}
	c.AssertNothingLeft(t)
}

// readSessionFile returns a file of the only session's log folder.
func readSessionFile(t *testing.T, c *clitest.CLI, name string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(c.Home, "logs", "*", name))
	if len(matches) != 1 {
		t.Fatalf("want one session log folder with %s, found %v", name, matches)
	}
	f, err := os.Open(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return string(b)
}

// buildProbe builds testdata/egressprobe for the guest into ws/probe
// (/mnt/workspace/probe in the VM).
func buildProbe(t *testing.T, ws string) {
	t.Helper()
	buildForGuest(t, "./testdata/egressprobe", filepath.Join(ws, "probe"))
}

// buildForGuest builds the Go package pkg, static, for the guest's Linux
// on this arch, into out.
func buildForGuest(t *testing.T, pkg, out string) {
	t.Helper()
	build := exec.Command("go", "build", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, b)
	}
}
