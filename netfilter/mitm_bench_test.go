package netfilter

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/mitmproxy"
	"github.com/vibedom/vibedom/netfilter/netstack"

	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vibedom/vibedom/keys"
)

// benchEnv is one upstream HTTPS server on loopback and the ways to reach
// it: directly, through the vibedom engine (transparent and explicit
// proxy, each behind a loopback TCP listener) and through mitmdump.
type benchEnv struct {
	b        *testing.B
	upCA     *keys.CA
	upCAPath string
	upAddr   string // 127.0.0.1:port of the upstream
	ca       *keys.CA
	engine   *mitm.GoEngine
	transp   string // listener whose conns go to HandleConn(bench.test:443)
	proxy    string // listener whose conns go to HandleProxyConn
	mitmCfg  mitmproxy.Config
	mitmTr   string // listener whose conns go to the mitmproxy engine's HandleConn
}

// startMitmEngine starts vibedom's mitmproxy engine on the same upstream,
// or returns a reason to skip.
func (v *benchEnv) startMitmEngine() string {
	if _, err := mitmproxy.MitmdumpVersion(context.Background(), ""); err != nil {
		return err.Error()
	}
	m, err := mitmproxy.NewEngine(context.Background(), v.mitmCfg)
	if err != nil {
		v.b.Fatal(err)
	}
	v.b.Cleanup(func() { m.Close() })
	t := netstack.Target{Name: benchName, Port: 443, Decision: v.mitmCfg.Policy.Decide(benchName, 443)}
	v.mitmTr = v.serve(func(ctx context.Context, c net.Conn) { m.HandleConn(ctx, c, t) })
	return ""
}

const benchName = "bench.test"

func newBenchEnv(b *testing.B, h http.Handler) *benchEnv {
	b.Helper()
	dir := b.TempDir()
	v := &benchEnv{b: b}
	var err error
	if v.upCA, err = keys.EnsureCA(filepath.Join(dir, "up")); err != nil {
		b.Fatal(err)
	}
	v.upCAPath = filepath.Join(dir, "up", keys.CACertFile)
	if v.ca, err = keys.EnsureCA(filepath.Join(dir, "ca")); err != nil {
		b.Fatal(err)
	}
	s := httptest.NewUnstartedServer(h)
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.EnableHTTP2 = true
	s.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		n := hi.ServerName
		if n == "" {
			n = "127.0.0.1"
		}
		return v.upCA.IssueLeaf(n, time.Hour)
	}}
	s.StartTLS()
	b.Cleanup(s.Close)
	v.upAddr = s.Listener.Addr().String()

	lw, err := NewLogWriter(filepath.Join(dir, NetworkLogFile), filepath.Join(dir, AlertsLogFile))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lw.Close() })
	rules, _ := egress.ParseRules(strings.NewReader(benchName+"\n"), "bench")
	pol := egress.NewPolicy(rules)
	ecfg := mitm.EngineConfig{
		CA:            v.ca,
		Policy:        pol,
		Events:        lw,
		ExtraRoots:    []*x509.Certificate{v.upCA.Certificate()},
		NoSystemRoots: true,
		Resolve:       []egress.Resolve{{Name: benchName, Port: 443, Addr: netip.MustParseAddrPort(v.upAddr)}},
		LookupIP: func(_ context.Context, name string) ([]netip.Addr, error) {
			return nil, fmt.Errorf("bench: no host %s", name)
		},
	}
	v.mitmCfg = mitmproxy.Config{EngineConfig: ecfg, CAKeyFile: filepath.Join(dir, "ca", keys.CAKeyFile), RuntimeDir: dir}
	v.engine, err = mitm.NewGoEngine(ecfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { v.engine.Close() })
	t := netstack.Target{Name: benchName, Port: 443, Decision: pol.Decide(benchName, 443)}
	v.transp = v.serve(func(ctx context.Context, c net.Conn) { v.engine.HandleConn(ctx, c, t) })
	v.proxy = v.serve(func(ctx context.Context, c net.Conn) {
		v.engine.HandleProxyConn(ctx, c, netip.MustParseAddrPort(c.RemoteAddr().String()))
	})
	return v
}

func (v *benchEnv) serve(handle func(context.Context, net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		v.b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	v.b.Cleanup(func() { cancel(); ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { handle(ctx, c) })
		}
	})
	return ln.Addr().String()
}

// client builds an HTTP/1.1 keep-alive client for one path.
func (v *benchEnv) client(path string, mitm *mitmdump) (*http.Client, string) {
	tr := &http.Transport{
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
		MaxIdleConnsPerHost: 16,
		DisableCompression:  true,
	}
	v.b.Cleanup(tr.CloseIdleConnections)
	base := "https://" + benchName
	var d net.Dialer
	switch path {
	case "direct":
		tr.TLSClientConfig = &tls.Config{RootCAs: v.upCA.Pool()}
		tr.DialContext = func(ctx context.Context, n, _ string) (net.Conn, error) { return d.DialContext(ctx, n, v.upAddr) }
	case "vibedom":
		tr.TLSClientConfig = &tls.Config{RootCAs: v.ca.Pool()}
		tr.DialContext = func(ctx context.Context, n, _ string) (net.Conn, error) { return d.DialContext(ctx, n, v.transp) }
	case "vibedom-mitmproxy":
		tr.TLSClientConfig = &tls.Config{RootCAs: v.ca.Pool()}
		tr.DialContext = func(ctx context.Context, n, _ string) (net.Conn, error) { return d.DialContext(ctx, n, v.mitmTr) }
	case "vibedom-proxy":
		tr.TLSClientConfig = &tls.Config{RootCAs: v.ca.Pool()}
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: v.proxy})
	case "mitmdump":
		tr.TLSClientConfig = &tls.Config{RootCAs: mitm.pool}
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: mitm.addr})
		_, port, _ := net.SplitHostPort(v.upAddr)
		base = "https://localhost:" + port // mitmdump resolves it itself
	}
	return &http.Client{Transport: tr}, base
}

// mitmdump is a running mitmdump in explicit-proxy mode.
type mitmdump struct {
	addr string
	pool *x509.CertPool
}

// startMitmdump runs Debian's mitmdump on a loopback port, trusting the
// upstream CA, or returns a reason to skip.
func startMitmdump(b *testing.B, upCAPath string, extra ...string) (*mitmdump, string) {
	bin, err := exec.LookPath("mitmdump")
	if err != nil {
		return nil, "mitmdump not installed (apt-get install mitmproxy)"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := b.TempDir()
	args := append([]string{"--listen-host", "127.0.0.1", "--listen-port", port, "-q",
		"--set", "confdir=" + conf, "--set", "ssl_verify_upstream_trusted_ca=" + upCAPath}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, "mitmdump does not start: " + err.Error()
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return nil, "mitmdump did not listen within 60s"
		}
		time.Sleep(100 * time.Millisecond)
	}
	pem, err := os.ReadFile(filepath.Join(conf, "mitmproxy-ca-cert.pem"))
	if err != nil {
		return nil, "mitmdump wrote no CA: " + err.Error()
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &mitmdump{addr: addr, pool: pool}, ""
}

// procCPU is the CPU time this process has used so far (user and system):
// a figure of the work a path costs that other load on the machine
// disturbs less than it does wall-clock time. It covers the client, the
// engine and the upstream server (not mitmdump, another process).
func procCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runRequests sends n small GETs over workers keep-alive connections and
// returns the time taken and the process CPU time used.
func runRequests(b *testing.B, c *http.Client, base string, n, workers int) (wall, cpu time.Duration) {
	b.Helper()
	// Warm up: open the connections and mint the certificates.
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { get(b, c, base+"/small") })
	}
	wg.Wait()
	start, cpu0 := time.Now(), procCPU()
	per := n / workers
	for range workers {
		wg.Go(func() {
			for range per {
				get(b, c, base+"/small")
			}
		})
	}
	wg.Wait()
	return time.Since(start), procCPU() - cpu0
}

func get(b *testing.B, c *http.Client, u string) int64 {
	resp, err := c.Get(u)
	if err != nil {
		b.Error(err)
		return 0
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Errorf("GET %s: %d %v", u, resp.StatusCode, err)
	}
	return n
}

func benchHandler(size int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true,"model":"bench","usage":{"input_tokens":12,"output_tokens":34}}`)
		case "/large":
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			io.Copy(w, &mitmtest.PatternReader{N: size})
		}
	})
}

// BenchmarkKeepAliveSmallHTTPS compares small keep-alive HTTPS requests per
// second: direct, through the vibedom engine (transparent, explicit proxy)
// and through mitmdump with and without stream_large_bodies. One iteration
// sends a batch on every path, in rounds that take turns between the paths,
// so that load from elsewhere on a shared machine falls on all of them
// alike rather than on whichever path happened to be running.
func BenchmarkKeepAliveSmallHTTPS(b *testing.B) {
	const batch, workers, rounds = 2000, 4, 5
	const mitmBatch = 400
	v := newBenchEnv(b, benchHandler(0))
	type path struct {
		name       string
		n          int
		mitm       []string
		total, cpu time.Duration
	}
	paths := []*path{{name: "direct", n: batch}, {name: "vibedom", n: batch}, {name: "vibedom-proxy", n: batch},
		{name: "mitmdump", n: mitmBatch, mitm: []string{}}, {name: "mitmdump-stream", n: mitmBatch, mitm: []string{"--set", "stream_large_bodies=1m"}},
		{name: "vibedom-mitmproxy", n: mitmBatch}}
	clients := map[string]*http.Client{}
	bases := map[string]string{}
	skipMitm := ""
	for _, p := range paths {
		if p.name == "vibedom-mitmproxy" {
			if why := v.startMitmEngine(); why != "" {
				b.Logf("vibedom-mitmproxy part skipped: %s", why)
				continue
			}
		}
		var m *mitmdump
		kind := p.name
		if p.mitm != nil {
			if m, skipMitm = startMitmdump(b, v.upCAPath, p.mitm...); m == nil {
				continue
			}
			kind = "mitmdump"
		}
		clients[p.name], bases[p.name] = v.client(kind, m)
	}
	if skipMitm != "" {
		b.Logf("mitmdump part skipped: %s", skipMitm)
	}
	b.ResetTimer()
	for range b.N {
		for range rounds {
			for _, p := range paths {
				if c := clients[p.name]; c != nil {
					wall, cpu := runRequests(b, c, bases[p.name], p.n/rounds, workers)
					p.total += wall
					p.cpu += cpu
				}
			}
		}
	}
	b.StopTimer()
	rate := map[string]float64{}
	for _, p := range paths {
		if p.total > 0 {
			rate[p.name] = float64(p.n*b.N) / p.total.Seconds()
			b.ReportMetric(rate[p.name], p.name+"_req/s")
			if p.mitm == nil && p.name != "vibedom-mitmproxy" {
				b.ReportMetric(float64(p.cpu.Microseconds())/float64(p.n*b.N), p.name+"_cpu-us/req")
			}
		}
	}
	b.ReportMetric(rate["vibedom"]/rate["direct"], "vibedom/direct")
	b.ReportMetric(rate["vibedom-proxy"]/rate["direct"], "vibedom-proxy/direct")
	if r := rate["mitmdump"]; r > 0 {
		b.ReportMetric(rate["vibedom"]/r, "vibedom/mitmdump")
	}
	if r := rate["mitmdump-stream"]; r > 0 {
		b.ReportMetric(rate["vibedom"]/r, "vibedom/mitmdump-stream")
	}
	if r := rate["mitmdump"]; r > 0 && rate["vibedom-mitmproxy"] > 0 {
		// The target: vibedom's mitmproxy engine within 2x of plain mitmdump.
		b.ReportMetric(r/rate["vibedom-mitmproxy"], "mitmdump/vibedom-mitmproxy")
		b.ReportMetric(rate["vibedom"]/rate["vibedom-mitmproxy"], "go/mitmproxy-engine")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkDownload100MB compares the throughput of one 100 MB HTTPS
// download: direct, through the vibedom engine (transparent) and, for
// reference, through mitmdump with stream_large_bodies (without it mitmdump
// buffers the whole body and takes about half a minute).
func BenchmarkDownload100MB(b *testing.B) {
	const size = 100 << 20
	v := newBenchEnv(b, benchHandler(size))
	names := []string{"direct", "vibedom", "mitmdump-stream", "vibedom-mitmproxy"}
	clients := map[string]*http.Client{}
	bases := map[string]string{}
	for _, n := range names[:2] {
		clients[n], bases[n] = v.client(n, nil)
	}
	if why := v.startMitmEngine(); why == "" {
		clients[names[3]], bases[names[3]] = v.client(names[3], nil)
	} else {
		b.Logf("vibedom-mitmproxy part skipped: %s", why)
	}
	if m, why := startMitmdump(b, v.upCAPath, "--set", "stream_large_bodies=1m"); m != nil {
		clients[names[2]], bases[names[2]] = v.client("mitmdump", m)
	} else {
		b.Logf("mitmdump part skipped: %s", why)
	}
	for _, n := range names {
		if c := clients[n]; c != nil {
			get(b, c, bases[n]+"/small") // connect and mint outside the timing
		}
	}
	total, cpu := map[string]time.Duration{}, map[string]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, n := range names {
			c := clients[n]
			if c == nil {
				continue
			}
			start, cpu0 := time.Now(), procCPU()
			if got := get(b, c, bases[n]+"/large"); got != size {
				b.Fatalf("%s: downloaded %d bytes, want %d", n, got, size)
			}
			total[n] += time.Since(start)
			cpu[n] += procCPU() - cpu0
		}
	}
	b.StopTimer()
	mbps := map[string]float64{}
	for n, d := range total {
		mbps[n] = float64(size) * float64(b.N) / d.Seconds() / 1e6
		b.ReportMetric(mbps[n], n+"_MB/s")
		if !strings.Contains(n, "mitm") {
			b.ReportMetric(cpu[n].Seconds()*1e3/(float64(size)*float64(b.N)/1e6), n+"_cpu-ms/MB")
		}
	}
	b.ReportMetric(mbps["vibedom"]/mbps["direct"], "vibedom/direct")
	if r := mbps["vibedom-mitmproxy"]; r > 0 && mbps["mitmdump-stream"] > 0 {
		b.ReportMetric(mbps["mitmdump-stream"]/r, "mitmdump/vibedom-mitmproxy")
		b.ReportMetric(mbps["vibedom"]/r, "go/mitmproxy-engine")
	}
	b.ReportMetric(0, "ns/op")
}
