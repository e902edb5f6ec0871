package guest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// SSH agent forwarding (OpenSSH's protocol extension): a session channel's
// requestAgentForwarding asks for it; the command then finds a socket in
// SSH_AUTH_SOCK, and each connection to that socket becomes a channelAgent
// channel opened back to the host over the same SSH connection. The host
// answers with its agent; no key ever enters the guest.
const (
	requestAgentForwarding = "auth-agent-req@openssh.com"
	channelAgent           = "auth-agent@openssh.com"
	// maxAgentConns bounds the agent connections of one session channel
	// served at once; further ones are closed at once.
	maxAgentConns = 8
	agentSockName = "agent.sock"
)

// agentForward is the agent socket of one session channel.
type agentForward struct {
	conn ssh.Conn
	log  *slog.Logger

	mu     sync.Mutex
	dir    string // the socket's folder, as the server sees it
	ln     net.Listener
	closed bool
	wg     sync.WaitGroup
	conns  map[net.Conn]struct{}
}

// agentRequest answers requestAgentForwarding on a session channel: allowed
// once, before the command starts.
func (s *Server) agentRequest(st *sessionState) bool {
	if st.started || st.agent != nil || st.conn == nil {
		return false
	}
	st.agent = &agentForward{conn: st.conn, log: s.log, conns: map[net.Conn]struct{}{}}
	return true
}

// listen makes the agent socket where the command (run as as) can reach it
// and returns the SSH_AUTH_SOCK entry for its environment. The socket is in
// a fresh 0700 folder owned by the command's user: under the root image's
// /run (a tmpfs mount point, so the agent user cannot swap it for a
// symlink) when the command is chrooted, else under the server's temporary
// folder.
func (f *agentForward) listen(as runAs) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln != nil || f.closed {
		return "", errors.New("agent socket already made")
	}
	parent := os.TempDir()
	if as.chroot != "" {
		parent = filepath.Join(as.chroot, "run")
	}
	dir, err := os.MkdirTemp(parent, "vibedom-agent-")
	if err != nil {
		return "", fmt.Errorf("agent socket folder: %w", err)
	}
	path := filepath.Join(dir, agentSockName)
	ln, err := net.Listen("unix", path)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err == nil && as.user != nil {
		if err = os.Lchown(path, int(as.user.UID), int(as.user.GID)); err == nil {
			err = os.Lchown(dir, int(as.user.UID), int(as.user.GID))
		}
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		os.RemoveAll(dir)
		return "", fmt.Errorf("agent socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	f.dir, f.ln = dir, ln
	f.wg.Add(1)
	go f.serve(ln)
	inside := path
	if as.chroot != "" {
		inside = "/" + strings.TrimPrefix(strings.TrimPrefix(path, filepath.Clean(as.chroot)), "/")
	}
	return "SSH_AUTH_SOCK=" + inside, nil
}

func (f *agentForward) serve(ln net.Listener) {
	defer f.wg.Done()
	slots := make(chan struct{}, maxAgentConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			f.log.Debug("agent connection refused: too many at once")
			c.Close()
			continue
		}
		if !f.track(c) {
			c.Close()
			<-slots
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-slots }()
			defer f.untrack(c)
			f.splice(c)
		}()
	}
}

func (f *agentForward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *agentForward) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// splice connects one local agent client to a channelAgent channel to the
// host until either side ends.
func (f *agentForward) splice(c net.Conn) {
	ch, reqs, err := f.conn.OpenChannel(channelAgent, nil)
	if err != nil {
		f.log.Debug("open an agent channel to the host", "err", err)
		return
	}
	go ssh.DiscardRequests(reqs)
	defer ch.Close()
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(ch, c)
		_ = ch.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, ch)
		if uc, ok := c.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	// One side ended: the other ends when the channel or socket closes.
	ch.Close()
	c.Close()
	<-done
}

// close removes the socket and its folder and ends every agent connection
// of the session (nil-safe). It returns once they are gone.
func (f *agentForward) close() {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.closed = true
	ln, dir := f.ln, f.dir
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	f.wg.Wait()
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// keepAgent hands the agent socket of the session that just started the
// kept terminal a to that terminal: the socket then lives as long as the
// command, not the channel that started it (a detached session's agent
// keeps its SSH_AUTH_SOCK when the host detaches). A channel that attaches
// to a running terminal has no socket of its own to hand over.
func keepAgent(st *sessionState, a *keptAttach) {
	f := st.agent
	if f == nil || a == nil {
		return
	}
	f.mu.Lock()
	listening := f.ln != nil
	f.mu.Unlock()
	if !listening {
		return
	}
	st.agent = nil
	go func() {
		<-a.term.proc.done
		f.close()
	}()
}
