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

	"github.com/vibedom/vibedom/guest/proto"
)

// Limits on what a client may ask of the server.
const (
	maxEnvVars     = 512
	maxEnvBytes    = 1 << 20 // all env names and values of one session
	maxChannels    = 64      // sessions open at once on one connection
	maxTermSize    = 4096    // rows or columns
	outputDrainMax = 2 * time.Second
)

// ServerConfig configures the SSH server of the control channel.
type ServerConfig struct {
	// HostKey signs the server's side of the handshake.
	HostKey ssh.Signer
	// AuthorizedKeys are the public keys allowed to log in.
	AuthorizedKeys []ssh.PublicKey
	// Shell runs commands (as Shell -c CMD) and login shells; "" is /bin/sh.
	Shell string
	// WorkDir is the commands' working directory when it exists, else /.
	WorkDir string
	// Env is the base environment of every command ("KEY=value").
	Env []string
	// Poweroff is called once, in its own goroutine, after a poweroff
	// request was acknowledged. nil refuses poweroff requests.
	Poweroff func()
	// Log receives diagnostics; nil is silent.
	Log *slog.Logger
}

// Server serves SSH connections from the host.
type Server struct {
	cfg     ServerConfig
	ssh     *ssh.ServerConfig
	log     *slog.Logger
	powered sync.Once
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
	s := &Server{cfg: cfg, log: cfg.Log}
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

// ServeConn runs one SSH connection until it ends. It closes conn.
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) error {
	defer conn.Close()
	sc, chans, reqs, err := ssh.NewServerConn(conn, s.ssh)
	if err != nil {
		return fmt.Errorf("ssh handshake: %w", err)
	}
	defer sc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		sc.Close()
	}()
	go s.globalRequests(reqs)
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxChannels)
	for nc := range chans {
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
			s.session(ctx, ch, creqs)
		}()
	}
	cancel()
	wg.Wait()
	return nil
}

func (s *Server) globalRequests(reqs <-chan *ssh.Request) {
	for r := range reqs {
		switch r.Type {
		case proto.RequestPoweroff:
			if s.cfg.Poweroff == nil {
				_ = r.Reply(false, nil)
				continue
			}
			_ = r.Reply(true, nil)
			s.powered.Do(func() { go s.cfg.Poweroff() })
		case "keepalive@openssh.com":
			_ = r.Reply(true, nil)
		default:
			_ = r.Reply(false, nil)
		}
	}
}

// session serves one session channel: env and pty requests, then one of
// shell, exec or subsystem, then signals and window changes.
func (s *Server) session(ctx context.Context, ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	var (
		env      []string
		envBytes int
		ptyReq   *ptyRequest
		started  bool
		proc     *process
	)
	defer func() {
		if proc != nil {
			proc.hangup()
		}
	}()
	for r := range reqs {
		switch r.Type {
		case "env":
			var kv struct{ Name, Value string }
			if started || ssh.Unmarshal(r.Payload, &kv) != nil || !validEnvName(kv.Name) ||
				len(env) >= maxEnvVars || envBytes+len(kv.Name)+len(kv.Value) > maxEnvBytes || strings.IndexByte(kv.Value, 0) >= 0 {
				reply(r, false)
				continue
			}
			envBytes += len(kv.Name) + len(kv.Value)
			env = append(env, kv.Name+"="+kv.Value)
			reply(r, true)
		case "pty-req":
			var p ptyRequest
			if started || ptyReq != nil || ssh.Unmarshal(r.Payload, &p) != nil {
				reply(r, false)
				continue
			}
			p.Columns, p.Rows = uint32(clampSize(p.Columns, 80)), uint32(clampSize(p.Rows, 24))
			ptyReq = &p
			reply(r, true)
		case "window-change":
			var w struct{ Columns, Rows, Width, Height uint32 }
			if ssh.Unmarshal(r.Payload, &w) != nil {
				reply(r, false)
				continue
			}
			if proc != nil {
				proc.resize(clampSize(w.Columns, 80), clampSize(w.Rows, 24))
			}
			reply(r, true)
		case "signal":
			var sg struct{ Signal string }
			if ssh.Unmarshal(r.Payload, &sg) != nil || proc == nil {
				reply(r, false)
				continue
			}
			sig, ok := signalByName[sg.Signal]
			if !ok {
				reply(r, false)
				continue
			}
			proc.signal(sig)
			reply(r, true)
		case "shell", "exec":
			var cmd string
			if r.Type == "exec" {
				var e struct{ Command string }
				if ssh.Unmarshal(r.Payload, &e) != nil || strings.IndexByte(e.Command, 0) >= 0 {
					reply(r, false)
					continue
				}
				cmd = e.Command
			}
			if started {
				reply(r, false)
				continue
			}
			p, err := s.start(cmd, r.Type == "shell", env, ptyReq, ch)
			if err != nil {
				s.log.Warn("start command", "err", err)
				reply(r, false)
				continue
			}
			started, proc = true, p
			reply(r, true)
			go p.wait(ch)
		case "subsystem":
			var sub struct{ Name string }
			if started || ssh.Unmarshal(r.Payload, &sub) != nil || sub.Name != proto.SubsystemSFTP {
				reply(r, false)
				continue
			}
			started = true
			reply(r, true)
			go func() {
				srv, err := sftp.NewServer(ch)
				status := uint32(0)
				if err == nil {
					if err := srv.Serve(); err != nil && !errors.Is(err, io.EOF) {
						status = 1
					}
					srv.Close()
				} else {
					status = 1
				}
				_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{status}))
				ch.Close()
			}()
		default:
			reply(r, false)
		}
	}
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

func validEnvName(n string) bool {
	if n == "" || len(n) > 256 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// process is a running command of one session.
type process struct {
	cmd     *exec.Cmd
	ptmx    *os.File // nil without a PTY
	copying sync.WaitGroup
	log     *slog.Logger
	mu      sync.Mutex
	exited  bool
}

func (s *Server) start(command string, shell bool, clientEnv []string, pr *ptyRequest, ch ssh.Channel) (*process, error) {
	var cmd *exec.Cmd
	if command == "" {
		// A login shell: argv[0] starting with '-' makes sh read /etc/profile.
		cmd = &exec.Cmd{Path: s.cfg.Shell, Args: []string{"-" + baseName(s.cfg.Shell)}}
	} else {
		cmd = exec.Command(s.cfg.Shell, "-c", command)
	}
	cmd.Dir = s.cfg.WorkDir
	if fi, err := os.Stat(cmd.Dir); err != nil || !fi.IsDir() {
		cmd.Dir = "/"
	}
	env := append([]string{}, s.cfg.Env...)
	if pr != nil && pr.Term != "" {
		env = append(env, "TERM="+pr.Term)
	}
	cmd.Env = append(env, clientEnv...)
	p := &process{cmd: cmd, log: s.log}
	if pr != nil {
		ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Cols: uint16(pr.Columns), Rows: uint16(pr.Rows)},
			&syscall.SysProcAttr{Setsid: true, Setctty: true})
		if err != nil {
			return nil, fmt.Errorf("start on a pty: %w", err)
		}
		p.ptmx = ptmx
		p.copying.Add(1)
		go func() {
			defer p.copying.Done()
			_, _ = io.Copy(ch, ptmx) // ends with EIO once every writer closed the tty
		}()
		go func() { _, _ = io.Copy(ptmx, ch) }()
		return p, nil
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout = ch
	cmd.Stderr = ch.Stderr()
	// Background processes that keep stdout open must not hold the session
	// open forever.
	cmd.WaitDelay = outputDrainMax
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	go func() {
		_, _ = io.Copy(stdin, ch)
		stdin.Close()
	}()
	return p, nil
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// wait waits for the command, flushes its output, reports its status and
// closes the channel.
func (p *process) wait(ch ssh.Channel) {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	if p.ptmx != nil {
		// Output still in the pty is read until every holder of the tty
		// has closed it, bounded so a background job cannot hold the
		// session.
		done := make(chan struct{})
		go func() { p.copying.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(outputDrainMax):
		}
		p.ptmx.Close()
	}
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
		_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Msg        string
			Lang       string
		}{signalName(ws.Signal()), ws.CoreDump(), msg, ""}))
	case st != nil:
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(st.ExitCode())}))
	default:
		p.log.Warn("command ended without a status", "err", err)
		_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{255}))
	}
	_ = ch.CloseWrite()
	ch.Close()
}

func (p *process) resize(cols, rows uint16) {
	if p.ptmx != nil {
		_ = pty.Setsize(p.ptmx, &pty.Winsize{Cols: cols, Rows: rows})
	}
}

// signal sends sig to the command's process group.
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

// hangup ends the command when its client went away.
func (p *process) hangup() {
	p.signal(syscall.SIGHUP)
	go func() {
		time.Sleep(2 * time.Second)
		p.signal(syscall.SIGKILL)
	}()
}

var signalByName = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2, "CONT": syscall.SIGCONT, "STOP": syscall.SIGSTOP, "TSTP": syscall.SIGTSTP,
	"WINCH": syscall.SIGWINCH,
}

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
	}
	return fmt.Sprintf("%d", int(sig))
}
