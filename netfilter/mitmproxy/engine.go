package mitmproxy

import (
	"github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/netfilter/netstack"
	"slices"

	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibedom/vibedom/childenv"
)

// addonScript is the addon mitmdump runs: a thin client that asks the
// engine for every decision over the control socket.
//
//go:embed addon.py
var addonScript []byte

// DefaultBodyLimit is the largest request body the mitmproxy engine
// passes: mitmdump buffers each request whole so the DLP can read it.
const DefaultBodyLimit = 64 << 20

// Config configures the mitmproxy engine. The embedded
// mitm.EngineConfig means what it means for the Go engine: Policy, Filter,
// Events, the dial guard's fields and the upstream roots all apply.
type Config struct {
	mitm.EngineConfig
	// CAKeyFile is the vibedom CA's key file (keys.CAKeyFile: the key and
	// the certificate, PEM); it is copied, 0600, into mitmdump's private
	// confdir. Required.
	CAKeyFile string
	// Mitmdump is the mitmdump program (a path, or a name looked up on
	// PATH); "" means "mitmdump".
	Mitmdump string
	// RuntimeDir is where the session's private runtime folder (0700) is
	// made; "" means os.TempDir().
	RuntimeDir string
	// Port is the loopback port mitmdump listens on; 0 picks a free one.
	Port int
	// BodyLimit is the largest request body passed (DefaultBodyLimit
	// when 0): a larger declared Content-Length has the flow killed, a
	// larger chunked body is refused once read (mitmdump buffers it).
	BodyLimit int64
	// StartTimeout bounds how long mitmdump may take to come up (60s when
	// 0).
	StartTimeout time.Duration
	// LiveView runs mitmweb instead of mitmdump, with the same addon and
	// options, so the user can watch the requests as sent upstream (after
	// the DLP) in a browser (`vibedom run --inspect`). The web UI listens
	// on 127.0.0.1 (WebURL) and is read-only: nothing replayed, edited,
	// duplicated, resumed or injected from it reaches an upstream.
	LiveView bool
	// Mitmweb is the mitmweb program for LiveView (a path, or a name looked
	// up on PATH); "" means the mitmweb beside Mitmdump when that is a
	// path, else "mitmweb".
	Mitmweb string
	// WebPort is the loopback port of the web UI; 0 picks a free one.
	WebPort int
	// ViewLimit is how many finished requests the live view keeps (the
	// oldest are dropped; mitmweb holds each in memory); 0 means 1000.
	ViewLimit int

	// testOpenUI leaves the web UI's write endpoints open (the addon's
	// and the engine's guards behind them stay): for this package's tests.
	testOpenUI bool
}

// Engine is the netstack.Engine that hands every admitted connection to a
// mitmdump it starts and owns (see docs/network.md, "Proxy engines"). The
// network stack admits connections exactly as for the Go engine; this
// engine opens an authenticated CONNECT to mitmdump for the admitted name
// and port and splices the guest's bytes into it. mitmdump terminates TLS
// with the vibedom CA and runs vibedom's addon, which asks this engine
// about every TLS handshake (SNI), request (Host, the DLP) and WebSocket
// message, and reports each request's outcome for the logs. mitmdump's
// upstream connections go through this engine's dial guard (mitmdump runs
// in upstream-proxy mode against a loopback listener of this engine).
//
// If mitmdump exits while the session runs, every connection is refused
// from then on and an alert is recorded: nothing flows unfiltered.
type Engine struct {
	cfg     Config
	events  egress.EventSink
	log     *slog.Logger
	filter  mitm.RequestFilter
	front   *mitm.GoEngine // the explicit proxy's front end and the dial guard
	guard   *egress.DialGuard
	dir     string
	port    int
	auth    string // Proxy-Authorization vibedom sends to mitmdump
	upAuth  string // Proxy-Authorization mitmdump sends to vibedom
	version string
	webURL  string

	ctlLn, upLn net.Listener
	upSrv       *http.Server
	cmd         *exec.Cmd
	exited      chan struct{}
	exitErr     error
	dead        atomic.Bool
	closing     atomic.Bool
	helloOnce   sync.Once
	hello       chan struct{}

	// lastRefused is the flow id of the last request refused (for tests).
	lastRefused atomic.Pointer[string]

	mu    sync.Mutex
	resv  map[string]reservation // memory budget reservations, by flow id
	conns map[string]*mitmConn   // by vibedom's local address on its connection to mitmdump
	flows map[string]*mitmFlow   // by mitmproxy flow id
	ctls  map[net.Conn]struct{}
	wg    sync.WaitGroup
}

var _ netstack.Engine = (*Engine)(nil)

type mitmConn struct {
	t         netstack.Target
	guest, mc net.Conn
	sniOK     atomic.Bool
	refused   atomic.Pointer[string]
	flows     map[string]struct{} // guarded by Engine.mu
	seen      map[string]struct{} // flow ids asked about; guarded by Engine.mu
	resv      map[string]struct{} // flow ids holding a reservation; guarded by Engine.mu
}

// reservation is a request body's charge to the memory budget.
type reservation struct {
	rel func()
	c   *mitmConn
}

type mitmFlow struct {
	peer string
	ev   egress.Event
	done func() []egress.Finding
	req  *http.Request
	// status is set when the response headers came (a WebSocket's 101).
	status int
	// stream scrubs a provider's response body (guarded by
	// Engine.mu).
	stream *respStream
}

func randomSecret() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func basicAuth(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// NewEngine starts mitmdump for a session and returns once it
// listens and its addon has reached the engine. Close stops it and removes
// the runtime folder.
func NewEngine(ctx context.Context, cfg Config) (_ *Engine, err error) {
	if cfg.CA == nil || cfg.CAKeyFile == "" {
		return nil, errors.New("mitmproxy: Config needs the CA and its key file (run `vibedom init` to create the CA)")
	}
	program := cfg.Mitmdump
	if program == "" {
		program = "mitmdump"
	}
	version, err := MitmdumpVersion(ctx, cfg.Mitmdump)
	if err != nil {
		return nil, err
	}
	if cfg.LiveView {
		program = MitmwebProgram(cfg.Mitmdump, cfg.Mitmweb)
		if version, err = MitmwebVersion(ctx, program); err != nil {
			return nil, err
		}
	}
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = DefaultBodyLimit
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	e := &Engine{
		cfg: cfg, version: version, exited: make(chan struct{}), hello: make(chan struct{}),
		conns: map[string]*mitmConn{}, flows: map[string]*mitmFlow{}, ctls: map[net.Conn]struct{}{},
	}
	fcfg := cfg.EngineConfig
	fcfg.Tunnel = e.HandleConn
	front, err := mitm.NewGoEngine(fcfg)
	if err != nil {
		return nil, err
	}
	fc := front.Config()
	e.events, e.log, e.filter, e.front, e.guard = fc.Events, fc.Logger, fc.Filter, front, front.Guard()
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	parent := cfg.RuntimeDir
	if parent == "" {
		parent = os.TempDir()
	}
	if e.dir, err = os.MkdirTemp(parent, "vibedom-mitm-"); err != nil {
		return nil, fmt.Errorf("make mitmdump's runtime folder: %w", err)
	}
	if err = os.Chmod(e.dir, 0o700); err != nil {
		return nil, err
	}
	conf := filepath.Join(e.dir, "conf")
	if err = os.Mkdir(conf, 0o700); err != nil {
		return nil, err
	}
	if err = e.writeConfdir(conf); err != nil {
		return nil, err
	}
	addon := filepath.Join(e.dir, "vibedom_addon.py")
	if err = os.WriteFile(addon, addonScript, 0o600); err != nil {
		return nil, err
	}
	sock := filepath.Join(e.dir, "ctl.sock")
	if e.ctlLn, err = net.Listen("unix", sock); err != nil {
		return nil, fmt.Errorf("listen on the mitmdump control socket: %w", err)
	}
	if err = os.Chmod(sock, 0o600); err != nil {
		return nil, err
	}
	e.wg.Add(1)
	go e.serveCtl()
	if e.upLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("listen for mitmdump's upstream connections: %w", err)
	}
	upSecret := randomSecret()
	e.upAuth = basicAuth("vibedom", upSecret)
	e.upSrv = &http.Server{Handler: http.HandlerFunc(e.serveUpstream), ReadHeaderTimeout: 30 * time.Second, ErrorLog: front.ErrorLog()}
	e.wg.Add(1)
	go func() { defer e.wg.Done(); e.upSrv.Serve(e.upLn) }()

	if e.port, err = freePort(cfg.Port); err != nil {
		return nil, fmt.Errorf("find a loopback port for mitmdump: %w", err)
	}
	secret := randomSecret()
	e.auth = basicAuth("vibedom", secret)
	var mode any = "upstream:http://" + e.upLn.Addr().String()
	if VersionAtLeast(version, 9, 0) { // a list since 9.0
		mode = []any{mode}
	}
	opts := map[string]any{
		"listen_host":         "127.0.0.1",
		"listen_port":         e.port,
		"mode":                mode,
		"upstream_auth":       "vibedom:" + upSecret,
		"proxyauth":           "vibedom:" + secret,
		"connection_strategy": "lazy",
		"upstream_cert":       false,
		"ssl_insecure":        false,
		"http2":               true,
		"websocket":           true,
		"rawtcp":              true,
		"scripts":             []string{addon},
		"termlog_verbosity":   "info",
		"flow_detail":         0,
		// h2's own check refuses values with surrounding whitespace, which
		// the Go engine passes; vibedom checks every header itself
		// (no control characters, valid names) before anything is sent.
		"validate_inbound_headers": false,
		// mitmdump buffers each request body whole (the DLP reads it):
		// its own limit stops a chunked body at the same size a declared
		// one is refused at, rather than after it was buffered.
		"body_size_limit": strconv.FormatInt(cfg.BodyLimit, 10),
	}
	liveEnv := []string{"VIBEDOM_LIVE_VIEW=0"}
	if cfg.LiveView {
		liveEnv = []string{"VIBEDOM_LIVE_VIEW=1"}
		webPort, perr := freePort(cfg.WebPort)
		if perr != nil {
			return nil, fmt.Errorf("find a loopback port for mitmweb: %w", perr)
		}
		if cfg.ViewLimit <= 0 {
			cfg.ViewLimit = 1000
		}
		liveEnv = append(liveEnv, "VIBEDOM_VIEW_MAX="+strconv.Itoa(cfg.ViewLimit))
		opts["web_host"] = "127.0.0.1"
		opts["web_port"] = webPort
		opts["web_open_browser"] = false
		opts["web_debug"] = false
		// Only what vibedom approved and scrubbed (the addon marks it):
		// never a refused request as the guest wrote it.
		opts["view_filter"] = "~marked"
		opts["intercept"] = nil
		opts["intercept_active"] = false
		// The view is bound to a per-session token: the printed URL
		// carries it and the addon, in mitmweb, answers 403 to any request
		// without it (or the cookie that URL sets). mitmweb 11.1 and later
		// also check it as their own password; 8.1 has none.
		token := randomSecret()
		liveEnv = append(liveEnv, "VIBEDOM_VIEW_TOKEN="+token)
		if VersionAtLeast(version, 11, 1) {
			opts["web_password"] = token
		}
		e.webURL = fmt.Sprintf("http://127.0.0.1:%d/?token=%s", webPort, token)
	}
	if roots, rerr := e.writeRoots(conf); rerr != nil {
		return nil, rerr
	} else if roots != "" {
		opts["ssl_verify_upstream_trusted_ca"] = roots
	}
	// The secrets go in a 0600 file, never on the command line (which
	// every local user can read).
	yml, _ := json.MarshalIndent(opts, "", "  ")
	if err = os.WriteFile(filepath.Join(conf, "config.yaml"), yml, 0o600); err != nil {
		return nil, err
	}
	e.cmd = exec.Command(program, "--set", "confdir="+conf)
	e.cmd.Dir = e.dir
	e.cmd.Env = []string{"VIBEDOM_CTL=" + sock, "HOME=" + e.dir, "PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8",
		"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1",
		"VIBEDOM_BODY_LIMIT=" + strconv.FormatInt(cfg.BodyLimit, 10)}
	e.cmd.Env = append(e.cmd.Env, liveEnv...)
	if cfg.testOpenUI {
		e.cmd.Env = append(e.cmd.Env, "VIBEDOM_TEST_OPEN_UI=1")
	}
	e.cmd.Env = childenv.Filter(e.cmd.Env) // already minimal; no key, whatever is added above
	setMitmProcAttr(e.cmd)
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	e.cmd.Stdout, e.cmd.Stderr = pw, pw
	if err = e.cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("%w: start %s: %v", ErrMitmdump, program, err)
	}
	pw.Close()
	listening := make(chan struct{})
	webUp := make(chan struct{})
	portTaken := make(chan string, 1)
	go e.readOutput(pr, listening, webUp, portTaken)
	want := 2
	if cfg.LiveView {
		want = 3
	}
	go e.watch()
	timer := time.NewTimer(cfg.StartTimeout)
	defer timer.Stop()
	hello := e.hello
	for got := 0; got < want; {
		select {
		case <-listening:
			listening = nil
			got++
		case <-webUp:
			webUp = nil
			got++
		case <-hello:
			hello = nil
			got++
		case line := <-portTaken:
			return nil, fmt.Errorf("%w cannot listen on 127.0.0.1 (%s): the port is taken; free it or let vibedom pick one",
				ErrMitmdump, line)
		case <-e.exited:
			return nil, fmt.Errorf("%w %s exited while starting (%v); run `mitmdump --version` to check it works, or use --proxy-engine go",
				ErrMitmdump, version, e.exitErr)
		case <-timer.C:
			return nil, fmt.Errorf("%w did not come up within %v; use --proxy-engine go", ErrMitmdump, cfg.StartTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	e.log.Info("mitmdump is up", "version", version, "port", e.port, "pid", e.cmd.Process.Pid)
	return e, nil
}

// freePort is port, or when 0 a loopback port free now.
func freePort(port int) (int, error) {
	if port != 0 {
		return port, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// WebURL is the live view's address (LiveView), "" without one. With
// mitmweb 11.1 or later it carries the session's token.
func (e *Engine) WebURL() string { return e.webURL }

// Version is the mitmdump version in use; Port its loopback port.
func (e *Engine) Version() string { return e.version }
func (e *Engine) Port() int       { return e.port }

// Pid is the process id of the mitmdump (or mitmweb) the engine runs.
func (e *Engine) Pid() int { return e.cmd.Process.Pid }

// Guard returns the dial guard mitmdump's upstream connections and the
// spliced ones go through (the Go front end's).
func (e *Engine) Guard() *egress.DialGuard { return e.guard }

// writeConfdir puts the vibedom CA where mitmdump looks for its own
// ("mitmproxy-ca.pem": the key and the certificate, 0600).
func (e *Engine) writeConfdir(conf string) error {
	data, err := os.ReadFile(e.cfg.CAKeyFile)
	if err != nil {
		return fmt.Errorf("read the CA key for mitmdump: %w", err)
	}
	if err := os.WriteFile(filepath.Join(conf, "mitmproxy-ca.pem"), data, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(conf, "mitmproxy-ca-cert.pem"), e.cfg.CA.CertPEM(), 0o600)
}

// systemRootFiles are where hosts keep their CA bundle.
var systemRootFiles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// writeRoots writes the upstream roots mitmdump trusts when they differ
// from its default (certifi): the extra roots, plus the system bundle
// unless NoSystemRoots. "" means the default.
func (e *Engine) writeRoots(conf string) (string, error) {
	if len(e.cfg.ExtraRoots) == 0 && !e.cfg.NoSystemRoots {
		return "", nil
	}
	var buf []byte
	if !e.cfg.NoSystemRoots {
		for _, f := range systemRootFiles {
			if b, err := os.ReadFile(f); err == nil {
				buf = append(buf, b...)
				buf = append(buf, '\n')
				break
			}
		}
	}
	for _, c := range e.cfg.ExtraRoots {
		buf = append(buf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if len(buf) == 0 {
		// An empty bundle would make mitmdump fall back to its default.
		return "", errors.New("netfilter: no upstream root certificates to trust")
	}
	p := filepath.Join(conf, "upstream-roots.pem")
	return p, os.WriteFile(p, buf, 0o600)
}

func (e *Engine) readOutput(r io.ReadCloser, listening, webUp chan struct{}, portTaken chan string) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	said, webSaid := false, false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !webSaid && strings.Contains(line, "Web server listening at"):
			webSaid = true
			close(webUp)
		case !said && strings.Contains(line, "listening at"):
			said = true
			close(listening)
		case strings.Contains(line, "address already in use") || strings.Contains(line, "while attempting to bind"):
			select {
			case portTaken <- strings.TrimSpace(line):
			default:
			}
		}
		// mitmdump's own lines carry no flow contents (flow_detail 0), but
		// for WebSocket control frames, whose payload it prints: never kept.
		// mitmweb 11.1 and later print their password in the UI's URL.
		if i := strings.Index(line, "token="); i >= 0 {
			line = line[:i] + "token=(hidden)"
		}
		if !strings.Contains(line, "WebSocket") {
			e.log.Debug("mitmdump", "line", egress.Shorten(line))
		}
	}
}

// watch waits for mitmdump to exit; an exit the engine did not ask for
// fails every connection closed and is an alert.
func (e *Engine) watch() {
	err := e.cmd.Wait()
	e.exitErr = err
	if err == nil {
		e.exitErr = errors.New("exit status 0")
	}
	e.dead.Store(true)
	close(e.exited)
	if e.closing.Load() {
		return
	}
	reason := fmt.Sprintf("mitmdump exited unexpectedly (%v): every guest connection is refused from now on; end the session and start a new one", e.exitErr)
	e.log.Error("mitmdump exited", "err", e.exitErr)
	e.events.Record(egress.Event{Time: time.Now(), Kind: "proxy", Decision: "deny", Reason: reason})
	e.mu.Lock()
	for _, c := range e.conns {
		c.guest.Close()
		c.mc.Close()
	}
	e.mu.Unlock()
}

// Close stops mitmdump, the listeners and removes the runtime folder.
func (e *Engine) Close() error {
	e.closing.Store(true)
	if e.cmd != nil && e.cmd.Process != nil {
		e.cmd.Process.Signal(os.Interrupt)
		select {
		case <-e.exited:
		case <-time.After(5 * time.Second):
			e.cmd.Process.Kill()
			<-e.exited
		}
	}
	if e.upSrv != nil {
		e.upSrv.Close()
	}
	if e.ctlLn != nil {
		e.ctlLn.Close()
	}
	e.mu.Lock()
	for c := range e.ctls {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
	e.front.Close()
	if e.dir != "" {
		return os.RemoveAll(e.dir)
	}
	return nil
}

// HandleConn implements Engine: the connection, admitted for t, is handed
// to mitmdump through an authenticated CONNECT to t.
func (e *Engine) HandleConn(ctx context.Context, conn net.Conn, t netstack.Target) {
	if slices.Contains(e.cfg.NoMITM, t.Name) {
		// Passed through, never to mitmdump: the Go front end checks
		// the SNI and tunnels the TLS as it is.
		e.front.HandleConn(ctx, conn, t)
		return
	}
	cc := &mitm.CountConn{Conn: conn}
	start := time.Now()
	decision, reason := e.handleConn(ctx, cc, t)
	cc.Close()
	ev := egress.Event{Time: start, Kind: "connect", Name: t.Name, Port: t.Port, Decision: decision, Rule: t.Decision.Rule,
		Reason: reason, BytesUp: cc.Up.Load(), BytesDn: cc.Down.Load(), Src: mitm.AddrString(t.Guest)}
	if t.Dialled.IsValid() {
		ev.Dst = t.Dialled.String()
	}
	e.events.Record(ev)
}

func (e *Engine) handleConn(ctx context.Context, cc *mitm.CountConn, t netstack.Target) (string, string) {
	if t.Name == "" || t.Port == 0 || !t.Decision.Allow {
		return "deny", "connection was not admitted by the policy"
	}
	if e.dead.Load() {
		return "deny", "mitmdump is not running (it exited during the session): nothing is let through unfiltered"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// mitmdump waits for the client's first bytes to choose a layer, so a
	// protocol whose server speaks first (SMTP) would wait forever: as on
	// the Go engine, a guest silent for ServerFirstWait on a port other
	// than 80 and 443 is spliced (bytes mitmdump would relay raw anyway),
	// and what it did send goes on to mitmdump.
	pc := &mitm.PeekConn{Conn: cc}
	if t.Port != 80 && t.Port != 443 {
		cc.SetReadDeadline(time.Now().Add(e.front.Config().ServerFirstWait))
		err := pc.Fill(1)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			cc.SetReadDeadline(time.Time{})
			return e.front.Splice(ctx, pc, t, "spliced (server speaks first)")
		case err != nil:
			return "allow", "closed before sending anything"
		}
		// Neither TLS nor an HTTP request line (an SSH client's
		// "SSH-2.0-…", which mitmdump took for an HTTP method and then
		// waited for a request head that never came; any other protocol
		// whose client speaks first): spliced, exactly as the Go engine
		// decides, so both engines treat a port other than 80 and 443
		// the same way.
		if pc.Peeked()[0] != 0x16 && !mitm.LooksLikeHTTP(pc) {
			cc.SetReadDeadline(time.Time{})
			return e.front.Splice(ctx, pc, t, "spliced (neither TLS nor HTTP)")
		}
		cc.SetReadDeadline(time.Time{})
	}
	var d net.Dialer
	mc, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)))
	if err != nil {
		return "deny", "cannot reach mitmdump: " + err.Error()
	}
	defer mc.Close()
	stop := context.AfterFunc(ctx, func() { cc.Close(); mc.Close() })
	defer stop()
	c := &mitmConn{t: t, guest: cc, mc: mc, flows: map[string]struct{}{}, seen: map[string]struct{}{}}
	key := mc.LocalAddr().String()
	e.mu.Lock()
	e.conns[key] = c
	e.mu.Unlock()
	defer e.forget(key, c)
	mc.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(mc, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", egress.HostPort(t.Name, t.Port), egress.HostPort(t.Name, t.Port), e.auth)
	br := bufio.NewReader(mc)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "deny", "mitmdump did not answer the CONNECT: " + err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "deny", "mitmdump refused the CONNECT: " + resp.Status
	}
	mc.SetDeadline(time.Time{})
	up := mitm.NewPeekConn(mc, br)
	mitm.Relay(pc, up)
	if r := c.refused.Load(); r != nil {
		return "deny", *r
	}
	if e.dead.Load() {
		return "deny", "mitmdump exited during the connection"
	}
	return "allow", "mitmproxy"
}

// forget drops a connection and records what its unfinished requests did.
func (e *Engine) forget(key string, c *mitmConn) {
	e.mu.Lock()
	delete(e.conns, key)
	var rels []func()
	for id := range c.resv {
		rels = append(rels, e.resv[id].rel)
		delete(e.resv, id)
	}
	var left []*mitmFlow
	for id := range c.flows {
		if f, ok := e.flows[id]; ok {
			left = append(left, f)
			delete(e.flows, id)
		}
	}
	e.mu.Unlock()
	for _, rel := range rels {
		rel()
	}
	for _, f := range left {
		if f.status == http.StatusSwitchingProtocols {
			e.finish(f, f.status, 0, "") // a WebSocket ends with its connection
			continue
		}
		e.finish(f, 0, 0, "the connection ended before the response")
	}
}

// HandleProxyConn implements Engine: the explicit proxy's front end is the
// Go engine's (the same CONNECT decisions and answers); each CONNECT tunnel
// is then handed to mitmdump like a transparent connection. Absolute-URI
// requests (plain http:// through HTTP_PROXY) are served by the Go engine's
// forwarder, with the same policy, DLP and dial guard.
func (e *Engine) HandleProxyConn(ctx context.Context, conn net.Conn, src netip.AddrPort) {
	e.front.HandleProxyConn(ctx, conn, src)
}

// serveUpstream is where mitmdump's upstream connections go (it runs in
// upstream-proxy mode): each is authenticated, decided by the policy once
// more and dialled through the dial guard.
func (e *Engine) serveUpstream(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Proxy-Authorization") != e.upAuth {
		w.Header().Set("Proxy-Authenticate", `Basic realm="vibedom"`)
		http.Error(w, "vibedom: not mitmdump", http.StatusProxyAuthRequired)
		return
	}
	var hp string
	if r.Method == http.MethodConnect {
		hp = r.Host
	} else if r.URL.IsAbs() && r.URL.Scheme == "http" {
		hp = r.URL.Host
	} else {
		http.Error(w, "vibedom: CONNECT or absolute http:// URI only", http.StatusBadRequest)
		return
	}
	name, port, ok := mitm.SplitAuthority(hp, 80)
	if !ok || e.cfg.Policy == nil || !egress.Recheck(e.cfg.Policy, name, port).Allow {
		http.Error(w, "vibedom: not an allowed destination", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodConnect && port == 443 {
		// The addon refuses plain HTTP to 443 first; this holds if not.
		http.Error(w, "vibedom: plain HTTP to port 443: use https://", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodConnect {
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.Header.Del("Proxy-Authorization")
				pr.Out.Host = hp
			},
			Transport: e.front.UpstreamTransport(),
			ErrorLog:  e.front.ErrorLog(),
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				http.Error(w, "vibedom: "+mitm.DescribeUpstreamError(hp, err), http.StatusBadGateway)
			},
		}
		rp.ServeHTTP(w, r)
		return
	}
	up, err := e.guard.DialContext(r.Context(), "tcp", egress.HostPort(name, port))
	if err != nil {
		http.Error(w, "vibedom: "+mitm.DescribeUpstreamError(hp, err), http.StatusBadGateway)
		return
	}
	defer up.Close()
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	pc := mitm.NewPeekConn(c, brw.Reader)
	mitm.Relay(pc, up)
}
