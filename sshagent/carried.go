package sshagent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// SSHPort is the only port whose spliced connections the agent signs for.
const SSHPort = 22

// SSH transport message numbers (RFC 4253 §12, RFC 4419, RFC 5656).
const (
	msgKexInit      = 20
	msgNewKeys      = 21
	msgKexReply     = 31 // KEXDH_REPLY, KEX_ECDH_REPLY, the hybrid replies
	msgKexGexReply  = 33 // KEX_DH_GEX_REPLY
	maxPreKexPacket = 64 << 10
	maxVersionLine  = 255
	// keepClosed is how many closed connections are remembered, so a
	// late signature request is refused with the right reason.
	keepClosed = 32
)

// Carried is the set of SSH connections the host carries for the guest: the
// guest's TCP connections to an allowed host:22, spliced by the proxy. The
// agent signs a login only for one of them (see Agent.SignWithFlags).
//
// Nothing in an SSH connection's clear text names its session identifier
// (the exchange hash H of RFC 4253 §8): H covers the shared secret, which
// only the two ends know. But the server signs H with its host key in its
// key exchange reply (KEXDH/KEX_ECDH/GEX reply: host key K_S, its ephemeral
// value, signature of H), which crosses the host in clear. So a login
// request's session identifier is the H of a carried connection exactly
// when that connection's server signature verifies over it with that
// connection's host key. The session identifier is fixed by the first key
// exchange (re-keying keeps it), and the first key exchange is the one in
// clear. A Carried is safe for concurrent use.
type Carried struct {
	mu     sync.Mutex
	open   map[*CarriedConn]struct{}
	closed []*CarriedConn
	check  HostKeyCheck // nil: host keys are not checked
}

// NewCarried returns an empty set.
func NewCarried() *Carried {
	return &Carried{open: map[*CarriedConn]struct{}{}}
}

// Track starts watching one spliced guest connection to name:port. The
// caller shows it every byte of both directions, in order and before the
// bytes are passed on (FromGuest, FromServer), and calls Close when the
// connection ends. Connections to ports other than SSHPort are not
// tracked: Track returns nil.
func (c *Carried) Track(name string, port uint16) *CarriedConn {
	if port != SSHPort {
		return nil
	}
	cc := &CarriedConn{set: c, server: net.JoinHostPort(name, strconv.Itoa(int(port)))}
	cc.guest.fromServer, cc.srv.fromServer = false, true
	c.mu.Lock()
	c.open[cc] = struct{}{}
	c.mu.Unlock()
	return cc
}

// CarriedConn is one spliced connection being watched.
type CarriedConn struct {
	set    *Carried
	server string // name:port

	mu         sync.Mutex
	guest, srv sshStream
	guestKex   []string // the client's kex_algorithms
	serverKex  []string
	hostKey    ssh.PublicKey // K_S from the server's reply
	sig        *ssh.Signature
	failed     string // why the key exchange could not be read
	signed     bool
	closed     bool
}

// FromGuest observes bytes the guest sent toward the server.
func (cc *CarriedConn) FromGuest(p []byte) { cc.observe(&cc.guest, p) }

// FromServer observes bytes the server sent toward the guest.
func (cc *CarriedConn) FromServer(p []byte) { cc.observe(&cc.srv, p) }

// Close marks the connection ended: no signature is given for it any more.
func (cc *CarriedConn) Close() {
	cc.mu.Lock()
	cc.closed = true
	cc.guest.done, cc.srv.done = true, true
	cc.guest.buf, cc.srv.buf = nil, nil
	cc.mu.Unlock()
	c := cc.set
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.open[cc]; !ok {
		return
	}
	delete(c.open, cc)
	if len(c.closed) == keepClosed {
		c.closed = append(c.closed[:0], c.closed[1:]...)
	}
	c.closed = append(c.closed, cc)
}

// sshStream is the parse state of one direction's clear text.
type sshStream struct {
	fromServer bool
	buf        []byte
	versioned  bool // the version line has been read
	done       bool
}

func (cc *CarriedConn) observe(s *sshStream, p []byte) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if s.done || len(p) == 0 {
		return
	}
	s.buf = append(s.buf, p...)
	for !s.done {
		n, err := cc.step(s)
		if err != nil {
			cc.fail(err.Error())
			return
		}
		if n == 0 {
			break // need more bytes
		}
		s.buf = s.buf[n:]
	}
	switch {
	case s.done:
		s.buf = nil
	case len(s.buf) > maxPreKexPacket+maxVersionLine+2:
		cc.fail("the key exchange is longer than vibedom reads")
	case cap(s.buf) > 2*len(s.buf)+4096:
		// Do not pin a large read; copying only then keeps a packet fed a
		// byte at a time linear, not quadratic.
		s.buf = append([]byte(nil), s.buf...)
	}
}

// fail gives up on the connection: no signature will be given for it.
func (cc *CarriedConn) fail(reason string) {
	if cc.failed == "" && cc.sig == nil {
		cc.failed = reason
	}
	cc.guest.done, cc.srv.done = true, true
	cc.guest.buf, cc.srv.buf = nil, nil
}

// step consumes one version line or one packet from s.buf; it returns 0
// when more bytes are needed.
func (cc *CarriedConn) step(s *sshStream) (int, error) {
	if !s.versioned {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			if len(s.buf) > maxVersionLine+2 {
				return 0, errors.New("not SSH: no version line")
			}
			return 0, nil
		}
		// RFC 4253 §4.2 lets a server send other lines first; vibedom
		// does not: the first line of each side must be its version.
		line := strings.TrimSuffix(string(s.buf[:i]), "\r")
		if !strings.HasPrefix(line, "SSH-2.0-") && !strings.HasPrefix(line, "SSH-1.99-") {
			return 0, errors.New("not SSH: the first line is not an SSH-2.0 version")
		}
		s.versioned = true
		return i + 1, nil
	}
	if len(s.buf) < 5 {
		return 0, nil
	}
	plen := binary.BigEndian.Uint32(s.buf)
	if plen < 5 || plen > maxPreKexPacket {
		return 0, fmt.Errorf("SSH packet of %d bytes before the keys are set", plen)
	}
	if len(s.buf) < 4+int(plen) {
		return 0, nil
	}
	pad := int(s.buf[4])
	if pad+1 >= int(plen) {
		return 0, errors.New("malformed SSH packet padding")
	}
	payload := s.buf[5 : 4+int(plen)-pad]
	if err := cc.packet(s, payload); err != nil {
		return 0, err
	}
	return 4 + int(plen), nil
}

// packet handles one clear-text payload.
func (cc *CarriedConn) packet(s *sshStream, payload []byte) error {
	switch payload[0] {
	case msgKexInit:
		kex, err := kexAlgorithms(payload)
		if err != nil {
			return err
		}
		if s.fromServer {
			if cc.serverKex != nil {
				return errors.New("two KEXINITs from the server")
			}
			cc.serverKex = kex
		} else {
			if cc.guestKex != nil {
				return errors.New("two KEXINITs from the guest")
			}
			cc.guestKex = kex
			s.done = true // nothing more from the guest is needed
		}
	case msgNewKeys:
		if s.fromServer {
			return errors.New("the server's key exchange reply was not seen")
		}
	case msgKexReply, msgKexGexReply:
		if !s.fromServer {
			return nil
		}
		if cc.serverKex == nil || cc.guestKex == nil {
			return errors.New("a key exchange reply before both KEXINITs")
		}
		algo := negotiate(cc.guestKex, cc.serverKex)
		if algo == "" {
			return errors.New("no key exchange algorithm in common")
		}
		want := byte(msgKexReply)
		if strings.Contains(algo, "group-exchange") {
			want = msgKexGexReply
		}
		if payload[0] != want {
			return nil // e.g. KEX_DH_GEX_GROUP, also numbered 31
		}
		hk, sig, err := parseKexReply(payload[1:])
		if err != nil {
			return fmt.Errorf("the server's %s reply: %v", algo, err)
		}
		cc.hostKey, cc.sig = hk, sig
		s.done = true
		cc.guest.done = true
		cc.guest.buf = nil
	}
	return nil
}

// kexAlgorithms reads the kex_algorithms name-list of a KEXINIT payload.
func kexAlgorithms(payload []byte) ([]string, error) {
	if len(payload) < 1+16+4 {
		return nil, errors.New("short KEXINIT")
	}
	list, _, ok := sshString(payload[17:])
	if !ok || len(list) == 0 {
		return nil, errors.New("malformed KEXINIT")
	}
	return strings.Split(string(list), ","), nil
}

// negotiate is RFC 4253 §7.1's choice: the first of the client's algorithms
// the server also offers.
func negotiate(client, server []string) string {
	for _, c := range client {
		for _, s := range server {
			if c == s {
				return c
			}
		}
	}
	return ""
}

// parseKexReply reads string K_S, the server's ephemeral value (a string
// or an mpint: both length-prefixed), string signature.
func parseKexReply(b []byte) (ssh.PublicKey, *ssh.Signature, error) {
	ks, b, ok := sshString(b)
	if !ok {
		return nil, nil, errors.New("malformed host key")
	}
	_, b, ok = sshString(b)
	if !ok {
		return nil, nil, errors.New("malformed ephemeral key")
	}
	sb, _, ok := sshString(b)
	if !ok {
		return nil, nil, errors.New("malformed signature")
	}
	hk, err := ssh.ParsePublicKey(ks)
	if err != nil {
		return nil, nil, fmt.Errorf("host key: %v", err)
	}
	var sig ssh.Signature
	if err := ssh.Unmarshal(sb, &sig); err != nil {
		return nil, nil, fmt.Errorf("signature: %v", err)
	}
	return hk, &sig, nil
}

func sshString(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 4 {
		return nil, nil, false
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, false
	}
	return b[4 : 4+n], b[4+n:], true
}

// matches reports whether sessionID is this connection's exchange hash: the
// server's signature in the clear key exchange verifies over it.
func (cc *CarriedConn) matches(sessionID []byte) bool {
	return cc.sig != nil && cc.hostKey.Verify(sessionID, cc.sig) == nil
}

// claim finds the open carried connection whose exchange hash is
// sessionID and takes its one signature. hostKey, when the request names
// one (hostbound logins), must be that connection's server host key, and
// the host key must pass the HostKeyCheck if one is set. It returns the
// connection's name:port, the server's host key and whether known_hosts
// lists it, or why the request is refused.
func (c *Carried) claim(sessionID, hostKey []byte) (server string, hk ssh.PublicKey, known bool, refusal string) {
	if c == nil {
		return "", nil, false, "the session has no network: the agent signs only logins on an SSH connection vibedom carries"
	}
	c.mu.Lock()
	check := c.check
	open := make([]*CarriedConn, 0, len(c.open))
	for cc := range c.open {
		open = append(open, cc)
	}
	closed := append([]*CarriedConn(nil), c.closed...)
	c.mu.Unlock()
	var unread []string
	for _, cc := range open {
		cc.mu.Lock()
		if cc.closed || !cc.matches(sessionID) {
			if cc.failed != "" && !cc.closed {
				unread = append(unread, cc.server+": "+cc.failed)
			}
			cc.mu.Unlock()
			continue
		}
		defer cc.mu.Unlock()
		switch {
		case cc.signed:
			return "", nil, false, "this SSH connection to " + cc.server + " already had its one signature"
		case hostKey != nil && !bytes.Equal(hostKey, cc.hostKey.Marshal()):
			return "", nil, false, "the request names another server host key than the one " + cc.server + " signed its key exchange with"
		}
		// The server's key must be one the user's known_hosts lists for
		// that name. A valid signature over the session id alone proves
		// nothing: an allowed server the attacker runs can replay another
		// server's recorded key exchange, and the outsider whose exchange
		// it was would log in with the signature.
		cc.signed = true // refused or not, the connection's one chance is used
		if check == nil {
			return "", nil, false, "no known_hosts check is set: the agent signs only for a server whose host key the user's known_hosts lists"
		}
		var err error
		if known, err = check(cc.server, cc.hostKey); err != nil {
			return "", nil, false, "the SSH server " + cc.server + " is not trusted: " + err.Error()
		}
		if !known {
			name, _, _ := strings.Cut(cc.server, ":")
			return "", nil, false, "the SSH server " + cc.server + " showed host key " + ssh.FingerprintSHA256(cc.hostKey) +
				", which no known_hosts file lists for that name: check that fingerprint with the host's owner, add the key to ~/.ssh/known_hosts (e.g. ssh-keyscan " +
				name + " >> ~/.ssh/known_hosts), then retry"
		}
		return cc.server, cc.hostKey, known, ""
	}
	for _, cc := range closed {
		cc.mu.Lock()
		m := cc.matches(sessionID)
		cc.mu.Unlock()
		if m {
			return "", nil, false, "the SSH connection to " + cc.server + " this login was for has closed"
		}
	}
	switch {
	case len(open) == 0:
		return "", nil, false, "no SSH connection to an allowed host:22 is open through vibedom: the agent signs only logins on such a connection"
	case len(unread) > 0:
		return "", nil, false, fmt.Sprintf("the session id is not that of any SSH connection vibedom carries (%d open; key exchange not understood on %s)", len(open), strings.Join(unread, "; "))
	default:
		return "", nil, false, fmt.Sprintf("the session id is not that of any SSH connection vibedom carries (%d open): a login relayed from elsewhere?", len(open))
	}
}
