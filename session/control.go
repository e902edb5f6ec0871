package session

import (
	"bufio"
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
)

// The control socket: every session host listens on a unix socket in its
// private runtime folder (0700, recorded in state.json), and the commands
// that reach a running session (attach, status, exec, stop, pause, resume)
// speak to it. Only the user who started the session may connect: the
// folder's mode and, on each connection, the peer's uid (SO_PEERCRED /
// LOCAL_PEERCRED) see to it.
//
// A client sends one JSON request line and reads one JSON reply line. For
// attach and exec an accepted reply is followed by frames both ways: one
// type byte, a 4-byte big-endian length, the payload.

// controlSocket is the socket's name in the runtime folder.
const controlSocket = "session.sock"

// Control operations.
const (
	OpStatus = "status"
	OpPause  = "pause"
	OpResume = "resume"
	OpStop   = "stop"
	OpExec   = "exec"
	OpAttach = "attach"
	OpEgress = "egress" // live egress policy: allow, deny, show, check, answer (egress_live.go)
	OpWatch  = "watch"  // ask mode's questions, streamed (egress_ask.go)
)

// ControlRequest is a client's request.
type ControlRequest struct {
	Op string `json:"op"`
	// ToDisk asks pause to save the VM's state to disk and stop it.
	ToDisk bool `json:"to_disk,omitempty"`
	// Argv is exec's command.
	Argv []string `json:"argv,omitempty"`
	// Root runs exec's command as root in the root image.
	Root bool `json:"root,omitempty"`
	// Term, Cols and Rows describe attach's terminal.
	Term string `json:"term,omitempty"`
	Cols int    `json:"cols,omitempty"`
	Rows int    `json:"rows,omitempty"`
	// Egress is OpEgress's request.
	Egress *EgressRequest `json:"egress,omitempty"`
	// Port is OpPort's request (ports.go).
	Port *PortRequest `json:"port,omitempty"`
}

// ControlReply is the host's reply.
type ControlReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Status is set by status.
	Status *HostStatus `json:"status,omitempty"`
	// Took is how long pause or resume took.
	Took time.Duration `json:"took_ns,omitempty"`
	// Egress is set by OpEgress.
	Egress *EgressReply `json:"egress,omitempty"`
	// Ports is OpPort's answer: the published ports after the request.
	Ports []PortInfo `json:"ports,omitempty"`
}

// HostStatus is what a session host reports about its session.
type HostStatus struct {
	Name      string    `json:"name"`
	Status    Status    `json:"status"`
	Workspace string    `json:"workspace"`
	Driver    string    `json:"driver"`
	Arch      string    `json:"arch"`
	PID       int       `json:"pid"`
	Created   time.Time `json:"created"`
	// VM is the hypervisor's own view (running, paused …).
	VM string `json:"vm"`
	// Agent says what runs on the kept terminal ("" for a foreground
	// command without one).
	Agent string `json:"agent,omitempty"`
	// Attached counts the clients attached through this socket now.
	Attached int `json:"attached"`
	// PausedAt is when the VM was paused, zero when it runs.
	PausedAt time.Time `json:"paused_at,omitzero"`
	LogDir   string    `json:"log_dir"`
	// Ports are the published ports.
	Ports []PortInfo `json:"ports,omitempty"`
}

// Frame types.
const (
	frameData   = 'd' // stdin (client to host) or stdout (host to client)
	frameStderr = 'e' // host to client
	frameResize = 'r' // client to host: cols, rows (uint16 each)
	frameEOF    = 'c' // client to host: stdin ended
	frameExit   = 'x' // host to client: JSON ExitFrame, last frame
)

// maxFrame bounds one frame's payload.
const maxFrame = 1 << 20

// ExitFrame ends an attach or exec stream.
type ExitFrame struct {
	Code   int    `json:"code"`
	Signal string `json:"signal,omitempty"`
	// Detached: the client's attachment ended and the agent goes on.
	Detached bool `json:"detached,omitempty"`
	// Error: the host could not run or follow the command.
	Error string `json:"error,omitempty"`
}

// frameWriter writes frames; safe for concurrent use.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(typ byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		n := min(len(p), maxFrame)
		var h [5]byte
		h[0] = typ
		binary.BigEndian.PutUint32(h[1:], uint32(n))
		if _, err := f.w.Write(h[:]); err != nil {
			return err
		}
		if _, err := f.w.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// streamWriter is an io.Writer that sends frames of one type.
type streamWriter struct {
	f   *frameWriter
	typ byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := s.f.frame(s.typ, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// readFrame reads one frame from r.
func readFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("control frame of %d bytes", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return h[0], p, nil
}

// ErrNotRunning means the session has no live host to talk to.
var ErrNotRunning = errors.New("session is not running")

// ControlConn is a client's connection to a session host.
type ControlConn struct {
	conn net.Conn
	r    *bufio.Reader
	fw   *frameWriter
}

// DialControl connects to the host of the session i. It refuses a socket
// in a folder that is not the user's own private one, and a host process
// that is not the one state.json names.
func DialControl(i *Info) (*ControlConn, error) {
	switch {
	case i.Live == StatusCrashed:
		return nil, fmt.Errorf("%w: session %s crashed (its host process is gone): `vibedom recover %s` brings its work to review", ErrNotRunning, i.Name, i.Name)
	case i.Live == StatusFailed && i.Recoverable():
		return nil, fmt.Errorf("%w: session %s ended without collecting its changes: `vibedom recover %s` brings its work to review", ErrNotRunning, i.Name, i.Name)
	case i.Live == StatusRecovering:
		return nil, fmt.Errorf("%w: session %s is being recovered (`vibedom recover %s` runs): wait for it to finish", ErrNotRunning, i.Name, i.Name)
	case !i.Live.live():
		hint := ""
		if i.PatchPending() {
			hint = fmt.Sprintf(": its changes wait for `vibedom review %s`", i.Name)
		}
		return nil, fmt.Errorf("%w: session %s is %s%s", ErrNotRunning, i.Name, i.Live, hint)
	case i.Control == "":
		return nil, fmt.Errorf("%w: session %s has no control socket yet (it is %s): try again in a moment", ErrNotRunning, i.Name, i.Live)
	}
	if err := checkPrivateDir(filepath.Dir(i.Control)); err != nil {
		return nil, fmt.Errorf("session %s: refusing its control socket: %w", i.Name, err)
	}
	c, err := net.DialTimeout("unix", i.Control, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot reach session %s's host: %v", ErrNotRunning, i.Name, err)
	}
	uc := c.(*net.UnixConn)
	uid, pid, err := peerCred(uc)
	if err != nil || uid != os.Getuid() || (pid != 0 && pid != i.PID) {
		c.Close()
		if err == nil {
			err = fmt.Errorf("it is served by uid %d pid %d, not by this user's session host (pid %d)", uid, pid, i.PID)
		}
		return nil, fmt.Errorf("session %s: refusing its control socket: %w", i.Name, err)
	}
	return &ControlConn{conn: c, r: bufio.NewReader(c), fw: &frameWriter{w: c}}, nil
}

// checkPrivateDir checks dir is a real folder owned by this user and
// reachable by no one else.
func checkPrivateDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a folder", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is open to other users (mode %v)", dir, fi.Mode().Perm())
	}
	if uid, ok := fileUID(fi); ok && uid != os.Getuid() {
		return fmt.Errorf("%s belongs to uid %d", dir, uid)
	}
	return nil
}

// Close closes the connection.
func (c *ControlConn) Close() error { return c.conn.Close() }

// Do sends req and reads the reply; a refused request is an error with the
// host's message.
func (c *ControlConn) Do(req ControlRequest, timeout time.Duration) (*ControlReply, error) {
	if timeout > 0 {
		_ = c.conn.SetDeadline(time.Now().Add(timeout))
		defer c.conn.SetDeadline(time.Time{})
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := c.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send to the session host: %w", err)
	}
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		return nil, fmt.Errorf("no answer from the session host: %w", err)
	}
	var rep ControlReply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("the session host answered nonsense: %w", err)
	}
	if !rep.OK {
		return &rep, errors.New(rep.Error)
	}
	return &rep, nil
}

// Stream carries an accepted attach or exec: stdin and resizes to the host,
// output from it, until the exit frame.
type Stream struct {
	c *ControlConn
}

// Stream returns the frame stream after an accepted attach or exec.
func (c *ControlConn) Stream() *Stream { return &Stream{c: c} }

// Input returns a writer whose bytes reach the command's input.
func (s *Stream) Input() io.Writer { return streamWriter{s.c.fw, frameData} }

// CloseInput tells the command its input ended.
func (s *Stream) CloseInput() error { return s.c.fw.frame(frameEOF, nil) }

// Resize sends a new terminal size.
func (s *Stream) Resize(cols, rows int) error {
	var p [4]byte
	binary.BigEndian.PutUint16(p[:2], uint16(min(max(cols, 1), 0xffff)))
	binary.BigEndian.PutUint16(p[2:], uint16(min(max(rows, 1), 0xffff)))
	return s.c.fw.frame(frameResize, p[:])
}

// Copy copies the command's output to stdout and stderr until the exit
// frame, which it returns.
func (s *Stream) Copy(stdout, stderr io.Writer) (*ExitFrame, error) {
	for {
		typ, p, err := readFrame(s.c.r)
		if err != nil {
			return nil, fmt.Errorf("the session host went away: %w", err)
		}
		switch typ {
		case frameData:
			if _, err := stdout.Write(p); err != nil {
				return nil, err
			}
		case frameStderr:
			if _, err := stderr.Write(p); err != nil {
				return nil, err
			}
		case frameExit:
			var x ExitFrame
			if err := json.Unmarshal(p, &x); err != nil {
				return nil, fmt.Errorf("bad exit frame: %w", err)
			}
			return &x, nil
		default:
			return nil, fmt.Errorf("unknown frame type %q from the session host", typ)
		}
	}
}
