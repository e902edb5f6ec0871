package session

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/boot"
	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/image/ext4"
	"github.com/vibedom/vibedom/image/rootfs"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter/mitm"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/sshagent"
	"github.com/vibedom/vibedom/termtext"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/wstrust"
)

// SessionLogFile is the session's own log in its log folder.
const SessionLogFile = "session.log"

// files of a session folder.
const (
	stateFile    = "state.json"
	initrdFile   = "initrd"
	scratchFile  = "scratch.img"
	clientKey    = "client_key"
	hostKey      = "host_key"
	consoleFile  = "console.log"
	sessionLog   = SessionLogFile
	workspaceTag = "workspace"
)

// sess is one session while its process runs it.
type sess struct {
	opts    Options
	name    string
	dir     string // session folder
	logDir  string
	runDir  string // short private folder for sockets
	state   State
	stateMu sync.Mutex // state, once the control socket serves
	ctl     *hostCtl
	ctlUID  int // the only uid the control socket serves
	log     *slog.Logger
	logRed  *logredact.RedactHandler // session.log's choke point; its Redactor is set once the DLP is ready
	redact  logredact.Redactor       // nil until setupDLP
	keys    *keys.Session
	img     *image.Image
	// rootImage is the read-only root image ("" for the Debian test image).
	rootImage string
	guestLibc string      // the root image's C library
	layers    []layerDisk // read-only layers (an agent's binaries)
	agentTTY  bool        // the agent runs on the user's terminal
	creds     *credentials.Session
	machine   vm.Machine
	client    *guestlink.Client
	egress    *egress
	plan      plan              // what prepare worked out from opts
	carried   *sshagent.Carried // SSH connections the agent signs for (--ssh-agent)
	secrets   *scanResult       // nil when the preflight was off
	cleanup   cleanups
	timings   Timings
	// keepScratch: the scratch disk may hold work not yet collected into a
	// verified patch, so the session's end keeps it (for recover).
	keepScratch atomic.Bool
	// intrMu guards collecting and presses (see interrupt).
	intrMu     sync.Mutex
	collecting context.CancelCauseFunc // non-nil while collecting
	presses    int                     // interrupts while collecting
	// stopBalloon ends the balloon policy (balloon.go); nil when it does
	// not run.
	stopBalloon func()
}

func (s *sess) progress(format string, a ...any) {
	fmt.Fprintf(s.opts.Progress, "vibedom: "+format+"\n", a...)
}

func (s *sess) saveState() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if err := writeState(s.dir, &s.state); err != nil {
		s.log.Warn("write session state", "err", err)
	}
}

// updateState changes the state and writes it, safely against the control
// socket's handlers.
func (s *sess) updateState(f func(*State)) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	f(&s.state)
	if err := writeState(s.dir, &s.state); err != nil {
		s.log.Warn("write session state", "err", err)
	}
}

// snapshotState is a copy of the state.
func (s *sess) snapshotState() State {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.state
}

// plan is what prepare works out from the options, which stay as the
// caller gave them.
type plan struct {
	// workspace is Options.Workspace, resolved (wstrust.CheckWorkspace).
	workspace string
	// driver is Options.Driver, else the platform's.
	driver vm.Driver
	// image is the guest image chosen before anything is made.
	image image.Choice
	// command is what runs in the guest: Options.Command, or the agent's
	// (prepareAgent).
	command []string
	// filter rewrites the guest's requests: Options.Egress.Filter, else
	// the DLP and the placeholder swap (setupDLP).
	filter mitm.RequestFilter
	// hostKeyPEM is the guest's host key as written to the session folder
	// (makeKeys), for the initrd.
	hostKeyPEM []byte
}

// prepare does everything before the VM starts, one named step after the
// other; each leaves what it made in the session and registers its undoing
// with the cleanups.
func (s *sess) prepare(ctx context.Context) error {
	s.plan.command = s.opts.Command
	s.plan.filter = s.opts.Egress.Filter
	for _, step := range []struct {
		name string
		run  func(context.Context) error
	}{
		// Checks and the secrets scan come before anything is made: a
		// cancel leaves no trace.
		{"check the host", s.checkHost},
		{"scan for secrets", s.scanSecrets},
		{"make the session folder", s.makeSessionDir},
		{"make the runtime folder", s.makeRunDir},
		{"prepare the image", s.prepareImage},
		{"prepare the agent", s.prepareAgent},
		{"make the session keys", s.makeKeys},
		{"record the workspace baseline", s.takeBaseline},
		{"make the scratch disk", s.makeScratchDisk},
		{"set up the network", s.setupNetwork},
		{"write the session initrd", s.writeInitrd},
	} {
		t := time.Now()
		if err := step.run(ctx); err != nil {
			if s.log != nil {
				s.log.Debug("prepare failed", "step", step.name)
			}
			return err
		}
		s.timings.Steps = append(s.timings.Steps, boot.Step{Name: step.name, Took: time.Since(t)})
	}
	return nil
}

// checkHost resolves the workspace, checks the host can give the VM its
// memory, picks the driver and the image.
func (s *sess) checkHost(ctx context.Context) error {
	o := &s.opts
	ws, err := wstrust.CheckWorkspace(o.Workspace)
	if err != nil {
		return err
	}
	s.plan.workspace = ws
	if err := CheckMemory(o.MemoryMiB); err != nil {
		return err
	}
	s.plan.driver = o.Driver
	if s.plan.driver == nil {
		if s.plan.driver, err = DefaultDriver(o.Home); err != nil {
			return err
		}
	}
	if err := s.plan.driver.Available(ctx, o.Arch); err != nil {
		return err
	}
	s.plan.image, err = image.Choose(o.Home, o.Arch)
	return err
}

// scanSecrets runs the secrets preflight, unless run --detach's parent
// ran it already.
func (s *sess) scanSecrets(ctx context.Context) error {
	if s.opts.scanned != nil {
		s.secrets = s.opts.scanned
		return nil
	}
	rep, err := s.runPreflight(ctx)
	if err != nil {
		return err
	}
	s.secrets, err = newScanResult(rep)
	return err
}

// makeSessionDir makes (or, detached, takes) the session folder, the log
// folder and session.log, and writes the first state.
func (s *sess) makeSessionDir(context.Context) error {
	o := &s.opts
	ws := s.plan.workspace
	if err := ensureDir(string(o.Home)); err != nil {
		return err
	}
	s.name = o.Name
	if s.name == "" {
		s.name = newName(ws)
	} else if !ValidName(s.name) {
		return fmt.Errorf("session name %q: use lower-case letters, digits, '.', '_' and '-'", s.name)
	}
	if err := ensureDir(o.Home.Sessions()); err != nil {
		return err
	}
	s.dir = o.Home.Session(s.name)
	if o.reserved {
		// detach made it, empty but for the options the host has read.
		if err := checkReserved(s.dir); err != nil {
			return err
		}
	} else if err := os.Mkdir(s.dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("a session named %q already exists: pick another --name or remove %s", s.name, s.dir)
		}
		return fmt.Errorf("create session folder: %w", err)
	}
	if err := ensureDir(o.Home.Logs()); err != nil {
		return err
	}
	var err error
	s.logDir, err = makeLogDir(o.Home.Logs(), time.Now())
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(s.logDir, sessionLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open session log: %w", err)
	}
	s.cleanup.add("close session log", logf.Close)
	var h slog.Handler = slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug})
	if o.Log != nil {
		h = teeHandler{h, o.Log.Handler()}
	}
	s.logRed = logredact.NewRedactHandler(h)
	s.log = slog.New(s.logRed).With("session", s.name)
	d := s.plan.driver
	s.state = State{
		Name: s.name, Workspace: ws, WorkspaceID: dirID(ws), Created: time.Now().UTC().Truncate(time.Second), Status: StatusStarting,
		LogDir: s.logDir, PID: os.Getpid(), PIDStart: procStart(os.Getpid()), Driver: d.Name(), Arch: string(o.Arch),
		CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, Command: o.Command, Detached: o.Detached,
	}
	s.saveState()
	if s.secrets != nil {
		if err := atomicfile.WriteFile(filepath.Join(s.logDir, "gitleaks_report.json"), s.secrets.report, 0o600); err != nil {
			s.log.Warn("write gitleaks report", "err", err)
		}
	}
	s.log.Info("session starting", "workspace", ws, "driver", d.Name(), "arch", o.Arch, "cpus", o.CPUs, "memory_mib", o.MemoryMiB)
	return nil
}

// makeRunDir makes the runtime folder for sockets: unix socket paths must
// stay short.
func (s *sess) makeRunDir(context.Context) error {
	var err error
	s.runDir, err = os.MkdirTemp("", "vibedom-")
	if err != nil {
		return fmt.Errorf("create runtime folder: %w", err)
	}
	s.cleanup.add("remove runtime folder", func() error { return os.RemoveAll(s.runDir) })
	return nil
}

// prepareImage makes the chosen guest image ready.
func (s *sess) prepareImage(ctx context.Context) error {
	o := &s.opts
	s.progress("preparing the %s image", o.Arch)
	var err error
	s.img, s.rootImage, s.guestLibc, err = s.plan.image.Prepare(ctx, o.Home, o.Arch, testKeyring())
	if err != nil {
		return fmt.Errorf("prepare the VM image: %w", err)
	}
	s.updateState(func(st *State) { st.RootImage, st.GuestLibc = s.rootImage, s.guestLibc })
	return nil
}

// makeKeys makes the session's SSH keys and writes them to its folder.
func (s *sess) makeKeys(context.Context) error {
	var err error
	s.keys, err = keys.NewSession()
	if err != nil {
		return err
	}
	hostPEM, err := s.keys.HostKeyPEM()
	if err != nil {
		return err
	}
	clientPEM, err := s.keys.ClientKeyPEM()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dir, clientKey), clientPEM, 0o600); err != nil {
		return fmt.Errorf("write session key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, hostKey), hostPEM, 0o600); err != nil {
		return fmt.Errorf("write guest host key: %w", err)
	}
	s.plan.hostKeyPEM = hostPEM
	return nil
}

// takeBaseline records the workspace as it is, so the end of the session
// knows what the user changed meanwhile.
func (s *sess) takeBaseline(ctx context.Context) error {
	if _, err := overlay.TakeBaseline(ctx, s.plan.workspace, filepath.Join(s.dir, overlay.BaselineDir), overlay.BaselineOptions{Logger: s.log}); err != nil {
		return fmt.Errorf("record the workspace baseline: %w", err)
	}
	return nil
}

// makeScratchDisk makes the sparse scratch disk that holds the overlay's
// upper layer; the session's end keeps it while it may hold uncollected
// work.
func (s *sess) makeScratchDisk(context.Context) error {
	scratch := filepath.Join(s.dir, scratchFile)
	if err := makeScratch(scratch, s.opts.ScratchSize); err != nil {
		return err
	}
	s.cleanup.add("remove scratch disk", func() error {
		if s.keepScratch.Load() {
			s.log.Warn("the scratch disk is kept: its changes were not collected", "path", scratch)
			return nil
		}
		return removeIfExists(scratch)
	})
	return nil
}

// setupNetwork sets up the DLP and the guest's egress, unless the guest
// has no network.
func (s *sess) setupNetwork(ctx context.Context) error {
	if s.opts.Egress.Disabled {
		return nil
	}
	if err := s.setupDLP(); err != nil {
		return err
	}
	return s.setupEgress(ctx)
}

// writeInitrd writes the session's boot data (proto.BootConfig, the guest
// host key, the MITM CA) into its initrd.
func (s *sess) writeInitrd(context.Context) error {
	d := s.plan.driver
	bc := &proto.BootConfig{
		Version:        proto.Version,
		SessionID:      s.name,
		Hostname:       "vibedom",
		Control:        controlFor(d),
		Workspace:      proto.Workspace{Tag: workspaceTag, FSType: shareFSFor(d)},
		Scratch:        proto.Scratch{Device: "/dev/vda"},
		Root:           s.rootConfig(),
		Layers:         s.layerConfig(),
		AuthorizedKeys: []string{s.keys.AuthorizedKey()},
		Env:            map[string]string{"VIBEDOM_SESSION": s.name},
	}
	if s.creds != nil {
		for k, v := range s.creds.GuestEnv() {
			bc.Env[k] = v
		}
	}
	var caPEM []byte
	if s.egress != nil {
		bc.Network = &proto.Network{Interface: "eth0", ProxyURL: s.egress.net.ProxyURL(), NoProxy: "localhost,127.0.0.1"}
		caPEM = s.egress.caPEM
	}
	files, err := image.SessionFiles(bc, s.plan.hostKeyPEM, caPEM)
	if err != nil {
		return fmt.Errorf("session boot data: %w", err)
	}
	initrd := filepath.Join(s.dir, initrdFile)
	if err := image.WriteSessionInitrd(initrd, s.img, files); err != nil {
		return fmt.Errorf("session initrd: %w", err)
	}
	s.cleanup.add("remove session initrd", func() error { return removeIfExists(initrd) })
	return nil
}

// GuestCmdline is the guest kernel's command line (the driver adds its
// console). Besides quiet it skips boot work the guest never uses and that
// costs most under emulation: the crypto self-tests of every algorithm
// (cryptomgr.notests), the SP800-108 KDF's self-test, encrypted keys and
// the kprobe tracer (about a second under TCG on a busy host).
const GuestCmdline = "quiet cryptomgr.notests initcall_blacklist=crypto_kdf108_init,init_encrypted,init_kprobe_trace"

// boot starts the VM and connects to the guest agent.
func (s *sess) boot(ctx context.Context) error {
	o := &s.opts
	cfg := vm.Config{
		Name:       s.name,
		Arch:       o.Arch,
		CPUs:       o.CPUs,
		MemoryMiB:  o.MemoryMiB,
		Kernel:     s.img.Kernel,
		Initrd:     filepath.Join(s.dir, initrdFile),
		Cmdline:    GuestCmdline,
		Shares:     []vm.Share{{Tag: workspaceTag, HostPath: s.plan.workspace, ReadOnly: true}},
		Disks:      s.disks(),
		ConsoleLog: filepath.Join(s.logDir, consoleFile),
		StateDir:   s.runDir,
	}
	if s.egress != nil {
		cfg.Network = &vm.Network{Conn: s.egress.net.VMEnd(), MAC: s.egress.mac}
	}
	s.progress("booting the VM (%s, %d CPUs, %d MiB)", s.plan.driver.Name(), o.CPUs, o.MemoryMiB)
	started := func(m vm.Machine) {
		again := s.machine != nil // booted anew emulated (boot.Options.AccelGrace)
		s.machine = m
		if !again {
			s.cleanup.add("stop the VM", func() error { return s.stopMachine() })
		}
		s.updateState(func(st *State) {
			if st.Status != StatusRecovering {
				st.Status = StatusRunning
			}
		})
	}
	notice := func(msg string) {
		s.log.Warn("falling back to emulation", "why", msg)
		s.progress("%s", msg)
	}
	_, c, t, err := boot.Start(ctx, s.plan.driver, cfg, boot.Options{Client: s.keys.ClientConfig(), Timeout: o.BootTimeout,
		Started: started, Notice: notice})
	s.timings.VMStart, s.timings.Ready, s.timings.Handshake = t.VMStart, t.Ready, t.Handshake
	s.timings.Answer, s.timings.Guest = t.Answer, t.Guest
	var be *boot.Error
	switch {
	case errors.As(err, &be):
		return s.bootError(be)
	case err != nil:
		return err
	}
	s.client = c
	s.cleanup.add("close control connection", func() error { return closeQuiet(s.client) })
	s.log.Info("guest ready", "vm_start", s.timings.VMStart, "ready", s.timings.Ready, "handshake", s.timings.Handshake)
	return nil
}

// logTimings writes the breakdown of the time to a ready guest to
// session.log, and with Options.ShowTimings to the progress lines.
func (s *sess) logTimings() {
	t := &s.timings
	s.log.Info("boot timings", "total", t.Total, "prepare", t.Prepare, "vm_start", t.VMStart, "guest_answer", t.Answer,
		"handshake", t.Handshake, "prepare_steps", boot.FormatSteps(t.Steps), "guest", boot.FormatSteps(t.Guest))
	if !s.opts.ShowTimings {
		return
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	s.progress("timings: %s to a ready guest", ms(t.Total))
	s.progress("timings:   host preparation %s (%s)", ms(t.Prepare), boot.FormatSteps(t.Steps))
	s.progress("timings:   VM start %s", ms(t.VMStart))
	s.progress("timings:   guest boot until the agent answered %s", ms(t.Answer))
	if len(t.Guest) > 0 {
		s.progress("timings:     guest clock: %s", boot.FormatSteps(t.Guest))
	}
	s.progress("timings:   SSH handshake %s", ms(t.Handshake))
}

// bootError explains a failed boot with the end of the console log (a
// *boot.Error has it already).
func (s *sess) bootError(err error) error {
	var be *boot.Error
	if !errors.As(err, &be) {
		be = boot.NewError(err, filepath.Join(s.logDir, consoleFile))
	}
	return &bootError{msg: fmt.Sprintf("%v: %v", ErrBootFailed, be), err: be.Err}
}

type bootError struct {
	msg string
	err error
}

func (e *bootError) Error() string { return e.msg }
func (e *bootError) Unwrap() []error {
	return []error{ErrBootFailed, e.err}
}

// stopMachine powers the guest off cleanly when it can, forcefully when it
// must, and waits for the VM to be gone.
func (s *sess) stopMachine() error {
	if s.machine == nil {
		return nil
	}
	m := s.machine
	s.machine = nil
	if st := m.State(); st == vm.StateStopped || st == vm.StateError {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.client != nil {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.client.Poweroff(pctx)
		pcancel()
		if err == nil {
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			werr := m.Wait(wctx)
			wcancel()
			if werr == nil {
				return nil
			}
			if m.State() == vm.StateStopped {
				s.log.Warn("VM stopped with an error after poweroff", "err", werr)
				return nil
			}
		} else {
			s.log.Warn("guest poweroff request failed", "err", err)
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := m.Stop(sctx); err != nil {
		if kerr := m.Kill(); kerr != nil {
			return errors.Join(err, kerr)
		}
	}
	return nil
}

// disks are the VM's block devices: the scratch disk first (/dev/vda), then
// the shared root image, read-only (found in the guest by its label).
func (s *sess) rootConfig() *proto.Root {
	if s.rootImage == "" {
		return nil
	}
	return &proto.Root{Label: rootfs.DefaultLabel}
}

func (s *sess) layerConfig() []proto.Layer {
	var out []proto.Layer
	for _, l := range s.layers {
		out = append(out, proto.Layer{Label: l.label, Mount: l.mount})
	}
	return out
}

func (s *sess) disks() []vm.Disk {
	d := []vm.Disk{{Path: filepath.Join(s.dir, scratchFile)}}
	if s.rootImage != "" {
		d = append(d, vm.Disk{Path: s.rootImage, ReadOnly: true})
	}
	for _, l := range s.layers {
		d = append(d, vm.Disk{Path: l.path, ReadOnly: true})
	}
	return d
}

// makeScratch makes the sparse scratch disk with an empty ext4 file system
// on it, written here rather than by the guest: the guest's busybox may
// have no mke2fs (Alpine's has none), and the host can give it one inode
// per 16 KiB (large npm installs need many) at no cost, since the inode
// tables are zeros and stay holes in the file.
func makeScratch(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create scratch disk: %w", err)
	}
	var uuid [16]byte
	if _, err := rand.Read(uuid[:]); err != nil {
		f.Close()
		return err
	}
	uuid[6], uuid[8] = uuid[6]&0x0f|0x40, uuid[8]&0x3f|0x80
	blocks := uint64(size) / 4096
	_, err = ext4.Write(f, &ext4.Node{Type: ext4.TypeDir, Meta: ext4.Meta{Mode: 0o755}}, ext4.Options{
		Label: "vibedom-scratch", UUID: uuid, Time: time.Now(),
		// Write adds its own metadata on top: ask for a little less.
		FreeBlocks: blocks - blocks/64, FreeInodes: uint64(size) / (16 << 10),
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("format scratch disk: %w", err)
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func closeQuiet(c io.Closer) error {
	if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// makeLogDir makes logs/session-YYYYMMDD-HHMMSS (with a suffix when two
// sessions start in the same second).
func makeLogDir(root string, t time.Time) (string, error) {
	base := filepath.Join(root, "session-"+t.Format("20060102-150405"))
	for i := 0; i < 100; i++ {
		dir := base
		if i > 0 {
			dir = fmt.Sprintf("%s-%d", base, i)
		}
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("create log folder: %w", err)
		}
	}
	return "", fmt.Errorf("create log folder: too many sessions started at %s", t.Format(time.TimeOnly))
}

// sanitizeLine shows the control and invisible characters of guest output
// as escapes (termtext.Text), so it cannot drive the user's terminal.
func sanitizeLine(s string) string { return termtext.Text(s) }

// teeHandler sends records to two handlers.
type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	if t.a.Enabled(ctx, r.Level) {
		errs = append(errs, t.a.Handle(ctx, r.Clone()))
	}
	if t.b.Enabled(ctx, r.Level) {
		errs = append(errs, t.b.Handle(ctx, r.Clone()))
	}
	return errors.Join(errs...)
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{t.a.WithGroup(name), t.b.WithGroup(name)}
}
