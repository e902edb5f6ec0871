package session

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/wstrust"
)

// `vibedom run --detach`: detach checks what it can on the user's terminal
// (the workspace, the name, the secrets preflight, once), reserves the
// session folder and writes the host's options there (hostFile), then
// starts the program again as the session host (HostCommand), in its own
// session and process group with its output in the host log, and returns
// once the host says the session runs. The host reports progress and
// readiness over an inherited pipe (fd 3) and reads the preflight's secret
// values, which never touch the disk, from another (fd 4).

// HostCommand is the hidden `vibedom` command that runs a detached session's
// host: `vibedom session-host SESSION-FOLDER`, started by detach only.
const HostCommand = "session-host"

// hostFileName is the host's options in the session folder: written by
// detach, read once (and removed) by Host.
const hostFileName = "host.json"

// Limits of what the host reads from its parent.
const (
	maxHostFile    = 16 << 20
	maxHostSecrets = 64 << 20
)

// Lines the host writes on the readiness pipe besides progress.
const (
	readyPrefix = "\x00ready "
	errorPrefix = "\x00error "
)

// HostInfo is a detached session's host, as run --detach started it.
type HostInfo struct {
	PID       int    // the host process
	Log       string // its own output (HostLogName under the logs folder)
	Workspace string // the resolved workspace
}

// HostLogName is the session host's own output file under the logs folder.
func HostLogName(name string) string { return "host-" + name + ".log" }

// hostFile is the session host's options: what a session needs that can
// be written down. The host trusts it no more than a flag: it is decoded
// strictly and checked as Start checks the flags.
type hostFile struct {
	Version   int               `json:"version"`
	Name      string            `json:"name"`
	Workspace string            `json:"workspace"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int               `json:"memory_mib"`
	Arch      vm.Arch           `json:"arch"`
	Command   []string          `json:"command,omitempty"`
	Agent     *AgentOptions     `json:"agent,omitempty"`
	AsRoot    bool              `json:"as_root,omitempty"`
	Egress    hostEgress        `json:"egress"`
	DLP       policy.DLPOptions `json:"dlp"`
	Review    hostReview        `json:"review"`
	SSHAgent  bool              `json:"ssh_agent,omitempty"`
	Ports     []PortSpec        `json:"ports,omitempty"`
	// Preflight is the mode the parent scanned with; Report the scan's
	// report (secrets redacted), absent when the mode was off.
	Preflight string          `json:"preflight"`
	Report    json.RawMessage `json:"report,omitempty"`
}

type hostEgress struct {
	Disabled    bool     `json:"disabled,omitempty"`
	Allow       []string `json:"allow,omitempty"`
	Resolve     []string `json:"resolve,omitempty"`
	CAFiles     []string `json:"ca_files,omitempty"`
	ProxyEngine string   `json:"proxy_engine"`
	Inspect     bool     `json:"inspect,omitempty"`
	// Live egress (egress_live.go, egress_ask.go).
	Mode       string        `json:"mode,omitempty"`
	AskTimeout time.Duration `json:"ask_timeout_ns,omitempty"`
	NoMITM     []string      `json:"no_mitm,omitempty"`
}

type hostReview struct {
	Skip     bool `json:"skip,omitempty"`
	ApplyAll bool `json:"apply_all,omitempty"`
}

const hostFileVersion = 1

// scanResult is what the secrets preflight hands on to the session.
type scanResult struct {
	// report is gitleaks_report.json (secrets redacted).
	report []byte
	// secrets are the values found, for the DLP: in memory only, never
	// logged or stored.
	secrets []string
}

func newScanResult(rep *preflight.Report) (*scanResult, error) {
	if rep == nil {
		return nil, nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode preflight report: %w", err)
	}
	return &scanResult{report: append(b, '\n'), secrets: rep.Secrets()}, nil
}

// detach starts the session of o in the background and returns once it
// runs: Result.Host says where. o's checks are Start's; detach runs the
// secrets preflight here, on the user's terminal, and the host does not
// run it again. relay prints the host's progress lines while it starts.
func detach(ctx context.Context, o Options, relay bool) (*Result, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	// The host finds its home from the session folder's path.
	abs, err := filepath.Abs(string(o.Home))
	if err != nil {
		return nil, err
	}
	o.Home = home.Home(abs)
	ws, err := wstrust.CheckWorkspace(o.Workspace)
	if err != nil {
		return nil, err
	}
	o.Workspace = ws
	name := o.Name
	if name == "" {
		name = newName(ws)
	} else if !ValidName(name) {
		return nil, fmt.Errorf("session name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	o.Name = name
	dir := o.Home.Session(name)
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("a session named %q already exists: pick another --name", name)
	}
	// The secrets preflight asks here, on the user's terminal.
	var scan *scanResult
	if o.Preflight.Mode != preflight.ModeOff {
		in, _ := o.Stdin.(*os.File)
		errw, _ := o.Stderr.(*os.File)
		o.Terminal = NewTerminal(in, errw)
		rep, err := (&sess{opts: o, plan: plan{workspace: ws}}).runPreflight(ctx)
		if err != nil {
			return nil, err
		}
		if scan, err = newScanResult(rep); err != nil {
			return nil, err
		}
	}
	// Reserve the name: the folder is the host's from here on.
	for _, d := range []string{string(o.Home), o.Home.Sessions(), o.Home.Logs()} {
		if err := ensureDir(d); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("a session named %q already exists: pick another --name", name)
		}
		return nil, fmt.Errorf("create session folder: %w", err)
	}
	started := false
	defer func() {
		if !started {
			// Nothing ran: leave no folder behind (one the host filled
			// with its state stays, to say why it failed).
			os.Remove(filepath.Join(dir, hostFileName))
			os.Remove(dir)
		}
	}()
	if err := writeHostFile(dir, o, scan); err != nil {
		return nil, err
	}
	pid, logPath, err := startHost(o, dir, scan, relay)
	if err != nil {
		return nil, err
	}
	started = true
	return &Result{Name: name, SessionDir: dir, Host: &HostInfo{PID: pid, Log: logPath, Workspace: ws}}, nil
}

// writeHostFile writes the host's options into the session folder.
func writeHostFile(dir string, o Options, scan *scanResult) error {
	hf := hostFile{
		Version: hostFileVersion, Name: o.Name, Workspace: o.Workspace, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB,
		Arch: o.Arch, Command: o.Command, Agent: o.Agent, AsRoot: o.AsRoot,
		Egress: hostEgress{Disabled: o.Egress.Disabled, Allow: o.Egress.Allow, CAFiles: o.Egress.CAFiles,
			ProxyEngine: o.Egress.ProxyEngine, Inspect: o.Egress.Inspect,
			Mode: o.Egress.Mode, AskTimeout: o.Egress.AskTimeout, NoMITM: o.Egress.NoMITM},
		DLP:       o.DLP,
		Review:    hostReview{Skip: o.Review.Skip, ApplyAll: o.Review.ApplyAll},
		SSHAgent:  o.SSHAgent.Enabled,
		Ports:     o.Ports,
		Preflight: o.Preflight.Mode.String(),
	}
	for _, r := range o.Egress.Resolve {
		hf.Egress.Resolve = append(hf.Egress.Resolve, resolveSpec(r))
	}
	if scan != nil {
		hf.Report = scan.report
	}
	b, err := json.Marshal(hf)
	if err != nil {
		return fmt.Errorf("encode the session host's options: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, hostFileName), b, 0o600); err != nil {
		return fmt.Errorf("write the session host's options: %w", err)
	}
	return nil
}

// startHost starts the session host and relays its progress until it is
// ready or gone.
func startHost(o Options, dir string, scan *scanResult, relay bool) (int, string, error) {
	logPath := filepath.Join(o.Home.Logs(), HostLogName(o.Name))
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, "", fmt.Errorf("open the session host's log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, "", err
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, "", err
	}
	defer pr.Close()
	sr, sw, err := os.Pipe()
	if err != nil {
		pw.Close()
		return 0, "", err
	}
	self, err := os.Executable()
	if err != nil {
		pw.Close()
		sr.Close()
		sw.Close()
		return 0, "", fmt.Errorf("find the vibedom program: %w", err)
	}
	cmd := exec.Command(self, HostCommand, dir)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.ExtraFiles = []*os.File{pw, sr}
	cmd.SysProcAttr = detachAttr()
	err = cmd.Start()
	pw.Close()
	sr.Close()
	if err != nil {
		sw.Close()
		return 0, "", fmt.Errorf("start the session host: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The secret values go over the pipe; a host that died early makes
	// the write fail, which the readiness pipe then explains.
	var secrets []string
	if scan != nil {
		secrets = scan.secrets
	}
	go func() {
		defer sw.Close()
		json.NewEncoder(sw).Encode(secrets)
	}()

	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, readyPrefix):
			return cmd.Process.Pid, logPath, nil
		case strings.HasPrefix(line, errorPrefix):
			<-exited
			return 0, "", errors.New(strings.TrimPrefix(line, errorPrefix))
		case relay:
			fmt.Fprintln(o.Stderr, termtext.Line(line))
		}
	}
	err = <-exited
	return 0, "", fmt.Errorf("the session host exited while starting (%v): see %s", err, logPath)
}

// HostOptions are what the hidden HostCommand passes to Host.
type HostOptions struct {
	// Dir is the session folder detach reserved (its argument).
	Dir string
	// Interrupts: see Options.Interrupts.
	Interrupts <-chan os.Signal
}

// Host is the detached session host: it reads its options from the
// session folder (once), no terminal, progress and readiness to the parent
// over fd 3, SIGINT and SIGTERM ask the session to stop (its changes are
// collected) rather than abandon it.
func Host(ctx context.Context, ho HostOptions) (*Result, error) {
	ready, secrets := hostPipes()
	if ready == nil {
		return nil, errors.New("the session host needs its readiness pipe: it is started by `vibedom run --detach` only")
	}
	fail := func(err error) (*Result, error) {
		fmt.Fprintf(ready, "%s%s\n", errorPrefix, strings.ReplaceAll(err.Error(), "\n", " "))
		ready.Close()
		return nil, err
	}
	o, err := readHostFile(ho.Dir)
	if err != nil {
		return fail(err)
	}
	if o.scanned != nil {
		if o.scanned.secrets, err = readHostSecrets(secrets); err != nil {
			return fail(err)
		}
	} else if secrets != nil {
		secrets.Close()
	}
	o.Detached, o.Terminal = true, nil
	o.Stdin = strings.NewReader("")
	o.Stdout, o.Stderr = os.Stdout, os.Stderr
	prog := &switchWriter{w: ready}
	o.Progress = prog
	var readyOnce sync.Once
	o.Ready = func(name string) {
		readyOnce.Do(func() {
			prog.set(os.Stderr)
			fmt.Fprintf(ready, "%s%s\n", readyPrefix, name)
			ready.Close()
		})
	}
	// The first SIGINT or SIGTERM asks the session to stop; while it
	// collects, the next two warn and then abort (Options.Interrupts).
	o.Interrupts = ho.Interrupts
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	// The caller's ctx ends on the first signal, which here asks the
	// session to stop instead.
	res, err := Run(context.WithoutCancel(ctx), o)
	if err != nil {
		readyOnce.Do(func() {
			fmt.Fprintf(ready, "%s%s\n", errorPrefix, strings.ReplaceAll(err.Error(), "\n", " "))
			ready.Close()
		})
	}
	return res, err
}

// readHostFile reads, removes and checks the host's options in dir, which
// must be a session folder under its home.
func readHostFile(dir string) (Options, error) {
	var o Options
	dir = filepath.Clean(dir)
	name := filepath.Base(dir)
	h := home.Home(filepath.Dir(filepath.Dir(dir)))
	if !filepath.IsAbs(dir) || !ValidName(name) || h.Session(name) != dir {
		return o, fmt.Errorf("session host: %q is not a session folder", dir)
	}
	// Both detach made, 0700 and 0600: anything else (a home under a
	// folder another user can write to) was swapped in by someone else.
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || !ownFile(fi) {
		return o, fmt.Errorf("session host: %s is not a private folder of yours (run the session again)", dir)
	}
	path := filepath.Join(dir, hostFileName)
	fi, err := os.Lstat(path)
	if err != nil {
		return o, fmt.Errorf("session host: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return o, fmt.Errorf("session host: %s is not a regular file", path)
	}
	b, err := readHostOptions(path)
	if err != nil {
		return o, fmt.Errorf("session host: read its options: %w", err)
	}
	// Read once: the options are the host's alone.
	if err := os.Remove(path); err != nil {
		return o, fmt.Errorf("session host: %w", err)
	}
	var hf hostFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hf); err != nil {
		return o, fmt.Errorf("session host: its options: %w", err)
	}
	if dec.More() {
		return o, errors.New("session host: its options: data after the object")
	}
	if hf.Version != hostFileVersion {
		return o, fmt.Errorf("session host: its options are version %d, want %d", hf.Version, hostFileVersion)
	}
	if hf.Name != name {
		return o, fmt.Errorf("session host: its options name session %q, its folder %q", hf.Name, name)
	}
	mode, err := preflight.ParseMode(hf.Preflight)
	if err != nil {
		return o, fmt.Errorf("session host: %w", err)
	}
	o = Options{
		Home: h, Name: hf.Name, Workspace: hf.Workspace, CPUs: hf.CPUs, MemoryMiB: hf.MemoryMiB, Arch: hf.Arch,
		Command: hf.Command, Agent: hf.Agent, AsRoot: hf.AsRoot,
		Egress: EgressOptions{Disabled: hf.Egress.Disabled, Allow: hf.Egress.Allow, CAFiles: hf.Egress.CAFiles,
			ProxyEngine: hf.Egress.ProxyEngine, Inspect: hf.Egress.Inspect,
			Mode: hf.Egress.Mode, AskTimeout: hf.Egress.AskTimeout, NoMITM: hf.Egress.NoMITM},
		DLP:       hf.DLP,
		Review:    ReviewOptions{Skip: hf.Review.Skip, ApplyAll: hf.Review.ApplyAll},
		SSHAgent:  SSHAgentOptions{Enabled: hf.SSHAgent},
		Ports:     hf.Ports,
		Preflight: PreflightOptions{Mode: mode},
		reserved:  true,
	}
	if mode != preflight.ModeOff {
		if len(hf.Report) == 0 {
			return o, errors.New("session host: its options hold no preflight report")
		}
		var report bytes.Buffer
		if err := json.Indent(&report, hf.Report, "", "  "); err != nil {
			return o, fmt.Errorf("session host: the preflight report: %w", err)
		}
		report.WriteByte('\n')
		o.scanned = &scanResult{report: report.Bytes()}
	}
	// The same checks as the flags had.
	if err := checkHostOptions(&o, hf.Egress.Resolve); err != nil {
		return o, fmt.Errorf("session host: %w", err)
	}
	return o, nil
}

// readHostOptions reads the host file at path through one descriptor
// (not through a symlink, never waiting on a FIFO swapped in after the
// Lstat) that must be a regular file of this user's, mode 0600 or less.
func readHostOptions(path string) ([]byte, error) {
	f, err := openNoFollow(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 || !ownFile(fi) {
		return nil, fmt.Errorf("%s is not a private file of yours (mode %v)", path, fi.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxHostFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxHostFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxHostFile)
	}
	return b, nil
}

// ownFile: fi's file is this user's (or its owner is not known here).
func ownFile(fi fs.FileInfo) bool {
	uid, ok := fileUID(fi)
	return !ok || uid == os.Getuid()
}

// checkHostOptions checks the host's options as Start checked the flags
// they came from, and parses the --resolve specs.
func checkHostOptions(o *Options, resolve []string) error {
	if o.CPUs < 1 || o.CPUs > 64 {
		return fmt.Errorf("--cpus must be between 1 and 64, got %d", o.CPUs)
	}
	if o.MemoryMiB < 128 || o.MemoryMiB > 1<<20 {
		return fmt.Errorf("--memory %dM is out of range", o.MemoryMiB)
	}
	if o.Arch == "" {
		return errors.New("no guest architecture")
	}
	if err := checkArch(o.Arch); err != nil {
		return err
	}
	if err := checkPorts(o.Ports); err != nil {
		return err
	}
	if !slices.Contains(ProxyEngines, o.Egress.ProxyEngine) {
		return fmt.Errorf("--proxy-engine must be go or mitmproxy, got %q", o.Egress.ProxyEngine)
	}
	if a := o.Agent; a != nil {
		if a.Name == "" {
			return errors.New("an agent without a name")
		}
		if _, err := chooseAgent(a.Name, nil); err != nil {
			return err
		}
	}
	for _, spec := range resolve {
		r, err := nfegress.ParseResolve(spec)
		if err != nil {
			return err
		}
		o.Egress.Resolve = append(o.Egress.Resolve, r)
	}
	return nil
}

// resolveSpec writes r as ParseResolve reads it.
func resolveSpec(r nfegress.Resolve) string {
	return fmt.Sprintf("%s:%d:%s", r.Name, r.Port, r.Addr)
}

// readHostSecrets reads the preflight's secret values from the parent.
func readHostSecrets(f *os.File) ([]string, error) {
	if f == nil {
		return nil, errors.New("session host: no pipe for the preflight's secrets")
	}
	defer f.Close()
	var secrets []string
	dec := json.NewDecoder(io.LimitReader(f, maxHostSecrets))
	if err := dec.Decode(&secrets); err != nil {
		return nil, fmt.Errorf("session host: the preflight's secrets: %w", err)
	}
	return secrets, nil
}

// switchWriter writes to w, which can be changed.
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *switchWriter) set(w io.Writer) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}

// checkReserved checks that the folder detach reserved is there, a real
// folder only this user can enter, and empty.
func checkReserved(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("the session folder: %w", err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("the session folder %s is not a private folder (mode %v)", dir, fi.Mode())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("the session folder: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("the session folder %s is not empty: another session uses the name", dir)
	}
	return nil
}
