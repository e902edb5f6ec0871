//go:build linux

package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// Limits on what a client may ask of the server. The client is the host,
// which is trusted, but a bug there must not take the guest agent down.
const (
	maxEnvVars     = 512
	maxEnvBytes    = 1 << 20 // all env names and values of one session
	maxChannels    = 64      // sessions open at once on one connection
	maxTermSize    = 4096    // rows or columns
	maxTermName    = 128
	outputDrainMax = 2 * time.Second // output read after a command exits, at most
	hangupGrace    = 2 * time.Second // SIGHUP to SIGKILL when a client goes away
)

// ServerConfig configures the SSH server of the control channel.
type ServerConfig struct {
	// HostKey signs the server's side of the handshake.
	HostKey ssh.Signer
	// AuthorizedKeys are the public keys allowed to log in, whatever the
	// user name. Certificates are not accepted.
	AuthorizedKeys []ssh.PublicKey
	// Shell runs commands (as Shell -c CMD) and login shells; "" is /bin/sh.
	Shell string
	// WorkDir is the commands' (and SFTP's) working directory when it
	// exists, else /; "" is proto.WorkDir.
	WorkDir string
	// Env is the base environment of every command ("KEY=value"); the
	// terminal type and the client's variables are added to it.
	Env []string
	// Poweroff is called once, in its own goroutine, after a poweroff
	// request was acknowledged. nil refuses poweroff requests.
	Poweroff func()
	// Image, when set, is the root image user commands run in (see
	// proto.RunAsVar); nil runs every command as the server's own user.
	Image *ImageRoot
	// Log receives diagnostics (never command lines or environment
	// values); nil is silent.
	Log *slog.Logger
}

// ImageRoot is where and as whom user commands run inside the root image.
type ImageRoot struct {
	// Dir is the merged root (proto.RootDir) commands are chrooted into.
	Dir string
	// Agent is the unprivileged user (proto.RunAsAgent).
	Agent *ImageUser
}

// ImageUser is who a command runs as inside the root image.
type ImageUser struct {
	Name     string
	UID, GID uint32
	Groups   []uint32
	Home     string
	Shell    string
}

// runAs is how one command runs.
type runAs struct {
	chroot string
	user   *ImageUser // nil: root
}

// Server serves SSH connections from the host: session channels with exec,
// shell (with or without a pseudo-terminal), the SFTP subsystem, signals
// and window changes, and the poweroff global request. Commands run as the
// server's own user (root in the guest). A session may ask for SSH agent
// forwarding: its command then reaches the host's agent through a socket
// in SSH_AUTH_SOCK (agentfwd_linux.go). direct-tcpip channels reach the
// guest's own ports, and only those (published ports, portfwd_linux.go).
// Nothing else is served: no remote forwarding, no other channel types.
type Server struct {
	cfg     ServerConfig
	ssh     *ssh.ServerConfig
	log     *slog.Logger
	powered sync.Once

	keptMu sync.Mutex
	kept   map[string]*keptTerm

	// Bounds, shortened by tests.
	outputDrain time.Duration
	hangupGrace time.Duration
}

// NewServer checks cfg and returns a server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.HostKey == nil {
		return nil, errors.New("ssh server: no host key")
	}
	if len(cfg.AuthorizedKeys) == 0 {
		return nil, errors.New("ssh server: no authorized keys")
	}
	if cfg.Shell == "" {
		cfg.Shell = "/bin/sh"
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = proto.WorkDir
	}
	s := &Server{cfg: cfg, log: cfg.Log, outputDrain: outputDrainMax, hangupGrace: hangupGrace}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	authorized := make([][]byte, len(cfg.AuthorizedKeys))
	for i, k := range cfg.AuthorizedKeys {
		authorized[i] = k.Marshal()
	}
	s.ssh = &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-vibedom-guest",
		MaxAuthTries:  3,
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			got := key.Marshal()
			for _, a := range authorized {
				if bytes.Equal(a, got) {
					return &ssh.Permissions{}, nil
				}
			}
			return nil, errors.New("key not authorized")
		},
	}
	s.ssh.AddHostKey(cfg.HostKey)
	return s, nil
}

// ServeConn announces the agent (proto.ReadyBanner), then serves one SSH
// connection until it ends or ctx is done. It closes conn, and returns
// once every command it started has ended (those still running when the
// connection ends get SIGHUP, then SIGKILL).
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) error {
	defer conn.Close()
	if _, err := conn.Write([]byte(proto.ReadyBanner)); err != nil {
		return fmt.Errorf("announce the agent: %w", err)
	}
	sc, chans, reqs, err := ssh.NewServerConn(conn, s.ssh)
	if err != nil {
		return fmt.Errorf("ssh handshake: %w", err)
	}
	defer sc.Close()
	s.log.Debug("control connection open")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		sc.Close()
	}()
	go s.globalRequests(reqs)
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxChannels)
	fwdSlots := make(chan struct{}, maxForwards)
	for nc := range chans {
		if nc.ChannelType() == ChannelDirectTCPIP {
			s.directTCPIP(ctx, nc, fwdSlots, &wg) // published ports (portfwd_linux.go)
			continue
		}
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only session channels are served")
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			_ = nc.Reject(ssh.ResourceShortage, "too many sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			<-slots
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			s.session(sc, ch, creqs)
		}()
	}
	cancel()
	wg.Wait()
	s.log.Debug("control connection closed")
	return nil
}

func (s *Server) globalRequests(reqs <-chan *ssh.Request) {
	for r := range reqs {
		switch r.Type {
		case proto.RequestPoweroff:
			if s.cfg.Poweroff == nil {
				reply(r, false)
				continue
			}
			reply(r, true)
			s.powered.Do(func() { go s.cfg.Poweroff() })
		case proto.RequestKeepalive:
			reply(r, true)
		case proto.RequestSetTime:
			reply(r, s.setTime(r.Payload))
		case proto.RequestMemInfo:
			mi, err := readMemInfo()
			if err != nil {
				s.log.Warn("read memory info", "err", err)
				reply(r, false)
			} else if r.WantReply {
				_ = r.Reply(true, mi.Marshal())
			}
		default: // tcpip-forward and the like
			reply(r, false)
		}
	}
}

// sessionState is what the requests of one session channel have set up.
type sessionState struct {
	env      []string
	envBytes int
	pty      *ptyRequest
	started  bool
	proc     *process
	kept     *keptAttach
	sftpDone chan struct{}
	after    func()        // run after the current request's reply
	conn     ssh.Conn      // the connection, for channels back to the host
	agent    *agentForward // nil unless agent forwarding was asked for
}

// session serves one session channel: env and pty-req requests, then one of
// shell, exec or subsystem, then signals and window changes. It returns
// when the channel's requests end, after what it started has ended.
func (s *Server) session(conn ssh.Conn, ch ssh.Channel, reqs <-chan *ssh.Request) {
	st := sessionState{conn: conn}
	for r := range reqs {
		reply(r, s.request(ch, &st, r))
		// What may end the channel starts only once the request that
		// began it has its reply: a command that ends at once must not
		// close the channel before the client heard it started.
		if st.after != nil {
			st.after()
			st.after = nil
		}
	}
	// The channel is gone (or the whole connection): end what runs in it.
	ch.Close()
	if st.proc != nil {
		st.proc.hangup()
		<-st.proc.done
	}
	if st.kept != nil {
		st.kept.detach() // the command keeps running
	}
	if st.sftpDone != nil {
		<-st.sftpDone
	}
	st.agent.close()
}

// request handles one channel request and reports whether it succeeded.
func (s *Server) request(ch ssh.Channel, st *sessionState, r *ssh.Request) bool {
	switch r.Type {
	case "env":
		var kv struct{ Name, Value string }
		if st.started || ssh.Unmarshal(r.Payload, &kv) != nil || !validEnvName(kv.Name) || strings.IndexByte(kv.Value, 0) >= 0 ||
			len(st.env) >= maxEnvVars || st.envBytes+len(kv.Name)+len(kv.Value) > maxEnvBytes {
			return false
		}
		st.envBytes += len(kv.Name) + len(kv.Value)
		st.env = append(st.env, kv.Name+"="+kv.Value)
		return true
	case "pty-req":
		var p ptyRequest
		if st.started || st.pty != nil || ssh.Unmarshal(r.Payload, &p) != nil || !validTerm(p.Term) {
			return false
		}
		p.Columns, p.Rows = uint32(clampSize(p.Columns, 80)), uint32(clampSize(p.Rows, 24))
		st.pty = &p
		return true
	case "window-change":
		var w struct{ Columns, Rows, Width, Height uint32 }
		if ssh.Unmarshal(r.Payload, &w) != nil || st.pty == nil {
			return false
		}
		cols, rows := clampSize(w.Columns, 80), clampSize(w.Rows, 24)
		st.pty.Columns, st.pty.Rows = uint32(cols), uint32(rows)
		if st.proc != nil {
			st.proc.resize(cols, rows)
		}
		if st.kept != nil {
			st.kept.term.proc.resize(cols, rows)
		}
		return true
	case "signal":
		var sg struct{ Signal string }
		if ssh.Unmarshal(r.Payload, &sg) != nil || (st.proc == nil && st.kept == nil) {
			return false
		}
		sig, ok := signalByName[sg.Signal]
		if !ok {
			return false
		}
		if st.kept != nil {
			st.kept.term.proc.signal(sig)
		} else {
			st.proc.signal(sig)
		}
		return true
	case "shell", "exec":
		if st.started {
			return false
		}
		var e struct{ Command string }
		if r.Type == "exec" && (ssh.Unmarshal(r.Payload, &e) != nil || strings.IndexByte(e.Command, 0) >= 0) {
			return false
		}
		if name, env, ok := keepName(st.env); ok {
			st.env = env
			a, err := s.attachKept(name, r.Type == "shell", e.Command, st, ch)
			if err != nil {
				s.log.Warn("kept terminal", "name", name, "err", err)
				return false
			}
			st.started, st.kept = true, a
			keepAgent(st, a)
			st.after = func() { go a.write() }
			return true
		}
		p, err := s.start(r.Type == "shell", e.Command, st, ch)
		if err != nil {
			s.log.Warn("start a command", "kind", r.Type, "err", err)
			return false
		}
		st.started, st.proc = true, p
		s.log.Debug("command started", "kind", r.Type, "pty", st.pty != nil, "pid", p.cmd.Process.Pid)
		st.after = func() { go p.wait(ch) }
		return true
	case "subsystem":
		var sub struct{ Name string }
		if st.started || ssh.Unmarshal(r.Payload, &sub) != nil || sub.Name != proto.SubsystemSFTP {
			return false
		}
		st.started = true
		st.sftpDone = make(chan struct{})
		go s.serveSFTP(ch, st.sftpDone)
		return true
	case requestAgentForwarding:
		return s.agentRequest(st)
	}
	return false
}

func (s *Server) serveSFTP(ch ssh.Channel, done chan<- struct{}) {
	defer close(done)
	status := uint32(0)
	srv, err := sftp.NewServer(ch, sftp.WithServerWorkingDirectory(s.workDir()))
	if err != nil {
		status = 1
	} else {
		if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
			s.log.Debug("sftp ended", "err", err)
			status = 1
		}
		srv.Close()
	}
	_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
	_ = ch.CloseWrite()
	ch.Close()
}

func reply(r *ssh.Request, ok bool) {
	if r.WantReply {
		_ = r.Reply(ok, nil)
	}
}

type ptyRequest struct {
	Term          string
	Columns, Rows uint32
	Width, Height uint32
	Modes         string
}

func clampSize(v uint32, def uint16) uint16 {
	if v == 0 {
		return def
	}
	if v > maxTermSize {
		return maxTermSize
	}
	return uint16(v)
}

// validTerm accepts terminal type names: printable ASCII without quotes or
// spaces, short.
func validTerm(t string) bool {
	if len(t) > maxTermName {
		return false
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= ' ' || c > '~' || c == '\'' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// runAs takes proto.RunAsVar out of the client's variables and says where
// the command runs. Without a root image the variable is ignored (the
// Debian test image runs everything as root in the initramfs).
func (s *Server) runAs(clientEnv []string) (runAs, []string, error) {
	var want string
	out := clientEnv[:0:0]
	for _, kv := range clientEnv {
		if k, v, _ := strings.Cut(kv, "="); k == proto.RunAsVar {
			want = v
			continue
		}
		out = append(out, kv)
	}
	img := s.cfg.Image
	if img == nil || want == "" {
		return runAs{}, out, nil
	}
	switch want {
	case proto.RunAsRoot:
		return runAs{chroot: img.Dir}, out, nil
	case proto.RunAsAgent:
		if img.Agent == nil {
			return runAs{}, nil, errors.New("the root image has no agent user")
		}
		return runAs{chroot: img.Dir, user: img.Agent}, out, nil
	}
	return runAs{}, nil, fmt.Errorf("%s=%q: want %q or %q", proto.RunAsVar, want, proto.RunAsAgent, proto.RunAsRoot)
}

func (s *Server) workDir() string {
	if fi, err := os.Stat(s.cfg.WorkDir); err == nil && fi.IsDir() {
		return s.cfg.WorkDir
	}
	return "/"
}

// process is the running command of one session.
type process struct {
	cmd     *exec.Cmd
	ptmx    *os.File // nil without a PTY
	copying sync.WaitGroup
	log     *slog.Logger
	done    chan struct{} // closed once the status is sent
	drain   time.Duration // output read after the command exits, at most
	grace   time.Duration // SIGHUP to SIGKILL

	mu     sync.Mutex
	exited bool

	as runAs
}

// start starts a login shell (shell) or command through the shell, on a
// PTY when the session asked for one.
func (s *Server) start(shell bool, command string, st *sessionState, ch ssh.Channel) (*process, error) {
	p, err := s.newProcess(shell, command, st)
	if err != nil {
		return nil, err
	}
	if st.pty != nil {
		return p, p.startPTY(st.pty, ch)
	}
	cmd := p.cmd
	// Its own process group, so a signal reaches the whole pipeline.
	cmd.SysProcAttr.Setpgid = true
	cmd.Stdout = ch
	cmd.Stderr = ch.Stderr()
	// A background job that keeps stdout open must not hold the session
	// open forever.
	cmd.WaitDelay = s.outputDrain
	// Not cmd.Stdin = ch: Wait would then wait for the client to close its
	// stdin. A pipe is closed when the client's stdin ends (EOF for the
	// command) or when the channel goes.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.cfg.Shell, err)
	}
	go func() {
		_, _ = io.Copy(stdin, ch)
		stdin.Close()
	}()
	return p, nil
}

// newProcess prepares (does not start) a login shell (shell) or command
// through the shell: where and as whom it runs, and its environment.
func (s *Server) newProcess(shell bool, command string, st *sessionState) (*process, error) {
	var cmd *exec.Cmd
	if shell {
		// argv[0] starting with '-' makes sh a login shell that reads
		// /etc/profile.
		cmd = &exec.Cmd{Path: s.cfg.Shell, Args: []string{"-" + baseName(s.cfg.Shell)}}
	} else {
		cmd = exec.Command(s.cfg.Shell, "-c", command)
	}
	cmd.Dir = s.workDir()
	env := append([]string{}, s.cfg.Env...)
	if st.pty != nil && st.pty.Term != "" {
		env = append(env, "TERM="+st.pty.Term)
	}
	as, clientEnv, err := s.runAs(st.env)
	if err != nil {
		return nil, err
	}
	if st.agent != nil {
		sock, err := st.agent.listen(as)
		if err != nil {
			return nil, err
		}
		env = append(env, sock)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if as.chroot != "" {
		cmd.SysProcAttr.Chroot = as.chroot
		if as.user != nil {
			u := as.user
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
			// The workspace's files belong to the host user (root in CI,
			// 501 on a Mac): file-access capabilities let the agent edit
			// them without being root. The VM, not this uid, is the
			// boundary; see docs/image.md.
			agentCaps(cmd.SysProcAttr)
			env = append(env, "HOME="+u.Home, "USER="+u.Name, "LOGNAME="+u.Name, "SHELL="+u.Shell)
			if shell {
				cmd.Path, cmd.Args = u.Shell, []string{"-" + baseName(u.Shell)}
			}
		}
	}
	cmd.Env = append(env, clientEnv...) // later entries win
	return &process{cmd: cmd, log: s.log, done: make(chan struct{}), drain: s.outputDrain, grace: s.hangupGrace, as: as}, nil
}

func (p *process) startPTY(pr *ptyRequest, ch ssh.Channel) error {
	if err := p.startOnPTY(pr); err != nil {
		return err
	}
	p.copying.Add(1)
	go func() {
		defer p.copying.Done()
		_, _ = io.Copy(ch, p.ptmx) // ends with EIO once every holder closed the tty
	}()
	go func() { _, _ = io.Copy(p.ptmx, ch) }()
	return nil
}

// startOnPTY starts the command on a new pseudo-terminal and sets p.ptmx;
// the caller copies its input and output.
func (p *process) startOnPTY(pr *ptyRequest) error {
	ptmx, tty, err := openPTY()
	if err != nil {
		return err
	}
	defer tty.Close()
	if err := setModes(int(tty.Fd()), []byte(pr.Modes)); err != nil {
		p.log.Debug("terminal modes not applied", "err", err)
	}
	if err := setWinsize(ptmx, uint16(pr.Columns), uint16(pr.Rows)); err != nil {
		ptmx.Close()
		return fmt.Errorf("size the pty: %w", err)
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = tty, tty, tty
	if u := p.as.user; u != nil {
		// The terminal belongs to the user the command runs as.
		if err := os.Chown(tty.Name(), int(u.UID), int(u.GID)); err != nil {
			ptmx.Close()
			return fmt.Errorf("give the pty to %s: %w", u.Name, err)
		}
	}
	// A session leader with the pty as its controlling terminal (fd 0 in
	// the child), like a login.
	if p.cmd.SysProcAttr == nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	p.cmd.SysProcAttr.Setsid, p.cmd.SysProcAttr.Setctty, p.cmd.SysProcAttr.Ctty = true, true, 0
	if err := p.cmd.Start(); err != nil {
		ptmx.Close()
		return fmt.Errorf("start %s on a pty: %w", p.cmd.Path, err)
	}
	p.ptmx = ptmx
	return nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// wait waits for the command, flushes its output, reports its status
// (exit-status, or exit-signal when a signal killed it), sends EOF and
// closes the channel.
func (p *process) wait(ch ssh.Channel) {
	defer close(p.done)
	p.waitExit().send(ch)
}

// waitExit waits for the command and for its output to be read (bounded),
// and says how it ended.
func (p *process) waitExit() exitReport {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	if p.ptmx != nil {
		// Output still in the pty is read until every holder of the tty
		// has closed it, bounded so a background job cannot hold the
		// session.
		drained := make(chan struct{})
		go func() { p.copying.Wait(); close(drained) }()
		t := time.NewTimer(p.drain)
		select {
		case <-drained:
		case <-t.C:
		}
		t.Stop()
		p.ptmx.Close()
		<-drained
	}
	return p.status(err)
}

// exitReport is the request that tells a client how its command ended.
type exitReport struct {
	kind    string // "exit-status" or "exit-signal"
	payload []byte
}

// send reports the status, sends EOF and closes ch.
func (r exitReport) send(ch ssh.Channel) {
	_, _ = ch.SendRequest(r.kind, false, r.payload)
	_ = ch.CloseWrite()
	ch.Close()
}

// status describes how the waited-for command ended (err is Wait's).
func (p *process) status(err error) exitReport {
	st := p.cmd.ProcessState
	var ws syscall.WaitStatus
	if st != nil {
		ws, _ = st.Sys().(syscall.WaitStatus)
	}
	switch {
	case st != nil && ws.Signaled():
		msg := ""
		if ws.CoreDump() {
			msg = "core dumped"
		}
		p.log.Debug("command killed", "signal", signalName(ws.Signal()))
		return exitReport{"exit-signal", ssh.Marshal(exitSignal{
			Signal: signalName(ws.Signal()), CoreDumped: ws.CoreDump(), Msg: msg,
		})}
	case st != nil:
		p.log.Debug("command exited", "status", st.ExitCode())
		return exitReport{"exit-status", ssh.Marshal(struct{ Status uint32 }{uint32(st.ExitCode())})}
	default:
		p.log.Warn("command ended without a status", "err", err)
		return exitReport{"exit-status", ssh.Marshal(struct{ Status uint32 }{255})}
	}
}

// exitSignal is the payload of an exit-signal request (RFC 4254 6.10).
type exitSignal struct {
	Signal     string
	CoreDumped bool
	Msg        string
	Lang       string
}

func (p *process) resize(cols, rows uint16) {
	if p.ptmx != nil {
		_ = setWinsize(p.ptmx, cols, rows)
	}
}

// openPTY opens a pseudo-terminal pair. The master is non-blocking and
// registered with the runtime's poller, so closing it ends a pending Read
// (creack/pty leaves it blocking, and a blocked Read would outlive Close).
func openPTY() (ptmx, tty *os.File, err error) {
	m, t, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open a pty: %w", err)
	}
	fd, err := unix.Dup(int(m.Fd()))
	m.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		t.Close()
		return nil, nil, fmt.Errorf("open a pty: %w", err)
	}
	unix.CloseOnExec(fd)
	return os.NewFile(uintptr(fd), "/dev/ptmx"), t, nil
}

// setWinsize sets the terminal size of the pty master f without making it
// blocking (as f.Fd() would).
func setWinsize(f *os.File, cols, rows uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}

// signal sends sig to the command's process group while the command runs.
func (p *process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited || p.cmd.Process == nil {
		return
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
		_ = p.cmd.Process.Signal(sig)
	}
}

// hangup ends a command whose client went away: SIGHUP, then SIGKILL if it
// still runs after a grace period.
func (p *process) hangup() {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited {
		return
	}
	p.signal(syscall.SIGHUP)
	go func() {
		t := time.NewTimer(p.grace)
		defer t.Stop()
		select {
		case <-p.done:
		case <-t.C:
			p.signal(syscall.SIGKILL)
		}
	}()
}

// signalByName maps SSH signal names (RFC 4254 6.10, without "SIG") to
// Linux signals.
var signalByName = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP,
	"WINCH": syscall.SIGWINCH,
}

// signalName names sig the SSH way, without "SIG" ("KILL"); a signal
// without a name (a real-time one) is its number and "@vibedom", in the
// form RFC 4254 gives local extensions.
func signalName(sig syscall.Signal) string {
	for n, s := range signalByName {
		if s == sig {
			return n
		}
	}
	switch sig {
	case syscall.SIGBUS:
		return "BUS"
	case syscall.SIGSYS:
		return "SYS"
	case syscall.SIGTRAP:
		return "TRAP"
	case syscall.SIGXCPU:
		return "XCPU"
	case syscall.SIGXFSZ:
		return "XFSZ"
	case syscall.SIGVTALRM:
		return "VTALRM"
	case syscall.SIGPROF:
		return "PROF"
	case syscall.SIGIO:
		return "IO"
	case syscall.SIGPWR:
		return "PWR"
	case syscall.SIGSTKFLT:
		return "STKFLT"
	}
	return fmt.Sprintf("%d@vibedom", int(sig))
}
