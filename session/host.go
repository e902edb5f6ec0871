package session

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
	"github.com/vibedom/vibedom/vm"
)

// The session host's side of the control socket (see control.go): every
// session, foreground or detached, serves it from boot to shutdown.

// keptAgent names the kept terminal the agent (or shell) runs on.
const keptAgent = "agent"

// hostCtl is the session host's lifecycle state shared by the control
// connections and the main flow.
type hostCtl struct {
	ln net.Listener

	mu       sync.Mutex // serialises pause, resume and stop
	paused   bool
	pausedAt time.Time
	attached int

	stopOnce sync.Once
	stopReq  chan struct{} // closed when a client asked the session to stop

	ports *portTable // published ports (ports.go)
}

func newHostCtl() *hostCtl { return &hostCtl{stopReq: make(chan struct{}), ports: newPortTable()} }

// requestStop asks the main flow to end the agent and wind the session up.
func (h *hostCtl) requestStop() { h.stopOnce.Do(func() { close(h.stopReq) }) }

func (h *hostCtl) stopRequested() bool {
	select {
	case <-h.stopReq:
		return true
	default:
		return false
	}
}

// startControl listens on the control socket and records it in state.json.
func (s *sess) startControl() error {
	path := filepath.Join(s.runDir, controlSocket)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	s.ctl.ln = ln
	s.cleanup.add("close control socket", func() error {
		err := ln.Close()
		if errors.Is(err, net.ErrClosed) {
			err = nil
		}
		return err
	})
	s.updateState(func(st *State) { st.Control = path })
	go s.acceptControl(ln)
	return nil
}

func (s *sess) acceptControl(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		uid, pid, err := peerCred(c.(*net.UnixConn))
		if err != nil || uid != s.ctlUID {
			s.log.Warn("alert: control connection refused: not the session's user", "peer_uid", uid, "peer_pid", pid, "err", err)
			c.Close()
			continue
		}
		go s.serveControl(c)
	}
}

// serveControl answers one control connection.
func (s *sess) serveControl(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReaderSize(c, 4096)
	line, err := readLine(r, 64<<10)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	var req ControlRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeReply(c, ControlReply{Error: "bad request: " + err.Error()})
		return
	}
	s.log.Info("control request", "op", req.Op)
	ctx := context.Background()
	switch req.Op {
	case OpStatus:
		writeReply(c, ControlReply{OK: true, Status: s.hostStatus()})
	case OpPause:
		took, err := s.pause(ctx, req.ToDisk)
		writeReply(c, replyFor(err, took))
	case OpResume:
		took, err := s.resume(ctx)
		writeReply(c, replyFor(err, took))
	case OpEgress:
		writeReply(c, s.serveEgress(req.Egress))
	case OpWatch:
		s.serveWatch(c)
	case OpStop:
		s.ctl.requestStop()
		writeReply(c, ControlReply{OK: true})
	case OpPort:
		writeReply(c, s.servePort(req.Port))
	case OpExec, OpAttach:
		if err := s.checkRunning(); err != nil {
			writeReply(c, replyFor(err, 0))
			return
		}
		if req.Op == OpAttach && s.state.Agent == "" {
			writeReply(c, ControlReply{Error: fmt.Sprintf("session %s runs a command without a terminal: nothing to attach to (use `vibedom exec %s -- CMD`, or `vibedom logs`)", s.name, s.name)})
			return
		}
		if req.Op == OpExec && len(req.Argv) == 0 {
			writeReply(c, ControlReply{Error: "exec: no command given"})
			return
		}
		writeReply(c, ControlReply{OK: true})
		s.stream(c, r, &req)
	default:
		writeReply(c, ControlReply{Error: fmt.Sprintf("unknown request %q", req.Op)})
	}
}

func replyFor(err error, took time.Duration) ControlReply {
	if err != nil {
		return ControlReply{Error: err.Error()}
	}
	return ControlReply{OK: true, Took: took}
}

func writeReply(c net.Conn, rep ControlReply) {
	b, _ := json.Marshal(rep)
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write(append(b, '\n'))
	_ = c.SetWriteDeadline(time.Time{})
}

// readLine reads one line of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		b, err := r.ReadSlice('\n')
		out = append(out, b...)
		if len(out) > max {
			return nil, errors.New("line too long")
		}
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}

func (s *sess) checkRunning() error {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	if s.ctl.paused {
		return fmt.Errorf("session %s is paused: `vibedom resume %s` first", s.name, s.name)
	}
	if s.ctl.stopRequested() {
		return fmt.Errorf("session %s is stopping", s.name)
	}
	return nil
}

func (s *sess) hostStatus() *HostStatus {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	st := s.snapshotState()
	hs := &HostStatus{Name: s.name, Status: st.Status, Workspace: st.Workspace, Driver: st.Driver, Arch: st.Arch,
		PID: st.PID, Created: st.Created, Agent: st.Agent, Attached: s.ctl.attached, LogDir: st.LogDir}
	if s.ctl.paused {
		hs.PausedAt = s.ctl.pausedAt
	}
	if m := s.machine; m != nil {
		hs.VM = string(m.State())
	}
	hs.Ports = s.ctl.ports.list()
	return hs
}

// pause freezes the VM in memory. The network stack and the proxy run on;
// the control connection's keepalives are held.
func (s *sess) pause(ctx context.Context, toDisk bool) (time.Duration, error) {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	if s.ctl.stopRequested() {
		return 0, fmt.Errorf("session %s is stopping", s.name)
	}
	if s.ctl.paused {
		return 0, fmt.Errorf("session %s is already paused: `vibedom resume %s` resumes it", s.name, s.name)
	}
	if toDisk {
		if err := vm.SaveStateSupported(s.machine); err != nil {
			return 0, fmt.Errorf("session %s runs on %s: %w", s.name, s.plan.driver.Name(), err)
		}
		// The VM-level save and restore exist (vm.SaveToDisk,
		// vm.RestoreFromDisk); re-attaching the network, the control
		// connection and the agent's terminal after a restore waits for a
		// Mac to test it on (docs/vm.md).
		return 0, fmt.Errorf("pausing to disk is not available for sessions yet: `vibedom pause %s` keeps it paused in memory", s.name)
	}
	t0 := time.Now()
	s.client.Hold(true)
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := vm.Pause(pctx, s.machine); err != nil {
		s.client.Hold(false)
		return 0, fmt.Errorf("pause: %w", err)
	}
	took := time.Since(t0)
	s.ctl.paused, s.ctl.pausedAt = true, time.Now()
	s.updateState(func(st *State) { st.Status, st.PausedAt = StatusPaused, s.ctl.pausedAt.UTC() })
	s.log.Info("paused", "took", took)
	return took, nil
}

// resume thaws the VM and sets its clock, which stood still meanwhile.
func (s *sess) resume(ctx context.Context) (time.Duration, error) {
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	return s.resumeLocked(ctx)
}

func (s *sess) resumeLocked(ctx context.Context) (time.Duration, error) {
	if !s.ctl.paused {
		return 0, fmt.Errorf("session %s is not paused", s.name)
	}
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := vm.Resume(rctx, s.machine); err != nil {
		return 0, fmt.Errorf("resume: %w", err)
	}
	s.client.Hold(false)
	// A guest that does not answer must not hold the control lock long.
	tctx, tcancel := context.WithTimeout(rctx, 5*time.Second)
	defer tcancel()
	if err := s.client.SetTime(tctx, time.Now()); err != nil {
		s.log.Warn("set the guest's clock after resume", "err", err)
	}
	took := time.Since(t0)
	s.log.Info("resumed", "took", took, "paused_for", time.Since(s.ctl.pausedAt))
	s.ctl.paused, s.ctl.pausedAt = false, time.Time{}
	s.updateState(func(st *State) { st.Status, st.PausedAt = StatusRunning, time.Time{} })
	return took, nil
}

// stream serves an accepted exec or attach: frames from the client feed the
// command's input and size; its output and status go back as frames.
func (s *sess) stream(c net.Conn, r *bufio.Reader, req *ControlRequest) {
	fw := &frameWriter{w: c}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inR, inW := io.Pipe()
	defer inR.Close() // input still coming once the command ended is refused, not waited on
	resizes := make(chan guestlink.WindowSize, 4)
	go func() {
		defer cancel() // the client went away: detach (attach) or end the command (exec)
		defer inW.Close()
		for {
			typ, p, err := readFrame(r)
			if err != nil {
				return
			}
			switch typ {
			case frameData:
				if _, err := inW.Write(p); err != nil {
					return
				}
			case frameEOF:
				inW.Close()
			case frameResize:
				if len(p) == 4 {
					ws := guestlink.WindowSize{Cols: int(binary.BigEndian.Uint16(p[:2])), Rows: int(binary.BigEndian.Uint16(p[2:]))}
					select {
					case resizes <- ws:
					default:
					}
				}
			default:
				return
			}
		}
	}()
	var st guestlink.ExitStatus
	var err error
	if req.Op == OpExec {
		env := s.userEnv()
		if req.Root && env != nil {
			env = s.rootEnv()
		}
		s.log.Info("exec from the control socket", "argv", req.Argv)
		st, err = s.client.Exec(ctx, "exec "+shellQuote(req.Argv), guestlink.ExecOptions{
			Stdin: inR, Stdout: streamWriter{fw, frameData}, Stderr: streamWriter{fw, frameStderr}, Env: env,
			ForwardAgent: s.opts.SSHAgent.Enabled,
		})
	} else {
		s.ctl.mu.Lock()
		s.ctl.attached++
		s.ctl.mu.Unlock()
		defer func() {
			s.ctl.mu.Lock()
			s.ctl.attached--
			s.ctl.mu.Unlock()
		}()
		o := s.keptOptions()
		o.Term, o.Cols, o.Rows = req.Term, req.Cols, req.Rows
		if !validTermName(o.Term) {
			o.Term = ""
		}
		out, unnotice := s.noticeOut(streamWriter{fw, frameData})
		defer unnotice()
		o.Stdin, o.Stdout, o.Resize = inR, out, resizes
		st, err = s.client.Shell(ctx, o)
	}
	x := ExitFrame{Code: st.ShellCode(), Signal: st.Signal}
	switch {
	case errors.Is(err, guestlink.ErrDetached),
		req.Op == OpAttach && errors.Is(err, guestlink.ErrNoExitStatus): // it fell behind the output
		x = ExitFrame{Detached: true}
	case err != nil && ctx.Err() != nil:
		return // the client is gone
	case err != nil:
		x = ExitFrame{Error: err.Error()}
	}
	b, _ := json.Marshal(x)
	_ = fw.frame(frameExit, b)
}

// validTermName accepts a $TERM a client sends, as the guest would.
func validTermName(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '+') {
			return false
		}
	}
	return true
}

// rootEnv is userEnv for a command run as root in the root image.
func (s *sess) rootEnv() map[string]string {
	env := s.userEnv()
	if env != nil {
		env[proto.RunAsVar] = proto.RunAsRoot
	}
	return env
}

// keptOptions describe the agent's kept terminal. The first Shell with
// them starts the agent; later ones (attach) join it.
func (s *sess) keptOptions() guestlink.ShellOptions {
	o := guestlink.ShellOptions{Keep: keptAgent, Env: s.userEnv(), Term: TermName(), ForwardAgent: s.opts.SSHAgent.Enabled}
	if len(s.plan.command) > 0 {
		o.Command = "exec " + shellQuote(s.plan.command)
	}
	return o
}

// stopSignal is what ends the agent when the session is asked to stop: a
// terminal's hang-up, which interactive shells and TUIs obey.
var stopSignal = ssh.SIGHUP
