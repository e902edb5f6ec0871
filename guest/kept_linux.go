package guest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vibedom/vibedom/guest/proto"
)

// Kept terminals (proto.KeepVar): a command on a terminal the agent owns,
// which outlives the channels attached to it. The host runs a detached
// session's agent on one, so `vibedom attach` can come and go while the
// agent keeps working.
const (
	maxKept        = 16       // kept terminals per agent, ended ones included
	keptReplay     = 64 << 10 // recent output sent to a new attachment
	keptQueue      = 256      // output chunks queued per attachment
	maxAttachments = 8        // channels attached to one terminal at once
)

// keptTerm is one kept terminal.
type keptTerm struct {
	name string
	proc *process

	mu       sync.Mutex
	ring     []byte // the last keptReplay bytes of output
	attached map[*keptAttach]struct{}
	exit     *exitReport // set once the command ended
}

// keptAttach is one channel attached to a kept terminal.
type keptAttach struct {
	term   *keptTerm
	ch     ssh.Channel
	out    chan []byte // closed (under term.mu) when the attachment ends
	closed bool        // out is closed
	report *exitReport // sent after out drains, when the command ended
}

// keepName takes proto.KeepVar out of the client's variables.
func keepName(env []string) (string, []string, bool) {
	var name string
	found := false
	out := env[:0:0]
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == proto.KeepVar {
			name, found = v, true
			continue
		}
		out = append(out, kv)
	}
	return name, out, found
}

// attachKept starts the kept terminal called name with the session's
// command, or attaches ch to it when it exists.
func (s *Server) attachKept(name string, shell bool, command string, st *sessionState, ch ssh.Channel) (*keptAttach, error) {
	if !proto.ValidKeepName(name) {
		return nil, fmt.Errorf("%s=%q: not a kept terminal name", proto.KeepVar, name)
	}
	if st.pty == nil {
		return nil, errors.New("a kept terminal needs a pty-req first")
	}
	s.keptMu.Lock()
	defer s.keptMu.Unlock()
	t := s.kept[name]
	if t == nil {
		if len(s.kept) >= maxKept {
			return nil, fmt.Errorf("%d kept terminals already", maxKept)
		}
		p, err := s.newProcess(shell, command, st)
		if err != nil {
			return nil, err
		}
		if err := p.startOnPTY(st.pty); err != nil {
			return nil, err
		}
		t = &keptTerm{name: name, proc: p, attached: map[*keptAttach]struct{}{}}
		if s.kept == nil {
			s.kept = map[string]*keptTerm{}
		}
		s.kept[name] = t
		p.copying.Add(1)
		go t.pump()
		go t.wait()
		s.log.Debug("kept terminal started", "name", name, "pid", p.cmd.Process.Pid)
	} else {
		t.proc.resize(uint16(st.pty.Columns), uint16(st.pty.Rows))
	}
	return t.attach(ch)
}

// attach adds ch: it is sent the recent output, then what follows, and the
// exit status when the command ends (at once if it has), by a.write, which
// the caller starts.
func (t *keptTerm) attach(ch ssh.Channel) (*keptAttach, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.attached) >= maxAttachments {
		return nil, fmt.Errorf("%d channels attached to %q already", maxAttachments, t.name)
	}
	a := &keptAttach{term: t, ch: ch, out: make(chan []byte, keptQueue)}
	if len(t.ring) > 0 {
		a.out <- append([]byte(nil), t.ring...)
	}
	// The caller starts a.write once the request has its reply.
	if t.exit != nil {
		a.report = t.exit
		a.closed = true
		close(a.out)
		return a, nil
	}
	t.attached[a] = struct{}{}
	go func() {
		// Input from every attached channel reaches the terminal; a
		// channel's EOF ends only its own input.
		_, _ = io.Copy(t.proc.ptmx, ch)
	}()
	return a, nil
}

// pump reads the terminal's output into the replay ring and every
// attachment's queue. An attachment that cannot keep up is dropped
// (detached), never waited for: the command must not stall on a client.
func (t *keptTerm) pump() {
	defer t.proc.copying.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := t.proc.ptmx.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			t.mu.Lock()
			t.ring = append(t.ring, b...)
			if len(t.ring) > keptReplay {
				t.ring = append(t.ring[:0:0], t.ring[len(t.ring)-keptReplay:]...)
			}
			for a := range t.attached {
				select {
				case a.out <- b:
				default:
					t.proc.log.Warn("kept terminal: a client fell behind; detached it", "name", t.name)
					a.endLocked(nil)
				}
			}
			t.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// wait waits for the command and hands its status to every attachment.
func (t *keptTerm) wait() {
	defer close(t.proc.done)
	r := t.proc.waitExit()
	t.mu.Lock()
	t.exit = &r
	for a := range t.attached {
		a.endLocked(&r)
	}
	t.mu.Unlock()
}

// endLocked ends the attachment: its queue drains, then (with report) the
// status is sent and the channel closed. t.mu is held.
func (a *keptAttach) endLocked(report *exitReport) {
	delete(a.term.attached, a)
	if a.closed {
		return
	}
	a.closed = true
	a.report = report
	close(a.out)
}

// detach is called when the attachment's channel has gone.
func (a *keptAttach) detach() {
	a.term.mu.Lock()
	a.endLocked(nil)
	a.term.mu.Unlock()
}

func (a *keptAttach) write() {
	for b := range a.out {
		if _, err := a.ch.Write(b); err != nil {
			for range a.out {
			}
			break
		}
	}
	if a.report != nil {
		a.report.send(a.ch)
		return
	}
	a.ch.Close()
}

// setTime sets the guest's wall clock from a RequestSetTime payload.
func (s *Server) setTime(payload []byte) bool {
	if len(payload) != 8 {
		return false
	}
	ns := int64(binary.BigEndian.Uint64(payload))
	// Refuse nonsense (before 2020 or after 2200): a bug, not a clock.
	if ns < time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano() || ns > time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano() {
		return false
	}
	ts := unix.NsecToTimespec(ns)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		s.log.Warn("set the clock", "err", err)
		return false
	}
	s.log.Debug("clock set by the host")
	return true
}
