// Package sshagent is the SSH agent a session serves to its guest over the
// control channel (SSH agent forwarding), so git in the VM can push over SSH
// with the user's deploy key while the private key stays on the host.
//
// The agent holds exactly one key, the deploy key, and does one thing with
// it: sign an SSH user-authentication request (RFC 4252 §7) for that key.
// It lists only that key; it refuses to add, remove or export keys, to lock
// or unlock, to answer extensions, and to sign anything that is not a
// user-authentication request for its own key (so the guest cannot use it
// to sign commits, tags or arbitrary data). Every signature and every
// refusal is one line of the session's agent log (LogFile).
//
// It signs only for an SSH connection the host itself carries: the
// request's session identifier must be the exchange hash of a guest
// connection to an allowed host:22 that is open and spliced through the
// proxy (Carried), and each such connection gets one signature. A login
// relayed from outside the VM (its session identifier is that of another
// connection) is refused. Which hosts are reachable is the session's egress
// policy; the user decides where the deploy key is registered.
package sshagent

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// ErrRefused is returned for every operation the agent does not perform.
var ErrRefused = errors.New("refused by vibedom's SSH agent")

// msgUserAuthRequest is SSH_MSG_USERAUTH_REQUEST (RFC 4252).
const msgUserAuthRequest = 50

// maxLoggedField bounds a guest-chosen string (user, service) in a log line.
const maxLoggedField = 256

// Recorder receives one Event per operation. Record must not block for
// long: it is called while the guest waits for the answer.
type Recorder interface {
	Record(Event)
}

// Event is one line of the agent log.
type Event struct {
	// Time is when the request arrived, UTC.
	Time time.Time `json:"time"`
	// Op is the agent operation: "sign", "list", "add", "remove",
	// "remove-all", "lock", "unlock", "signers", "extension".
	Op string `json:"op"`
	// Decision is "allow" or "deny".
	Decision string `json:"decision"`
	// Key is the SHA256 fingerprint of the key concerned.
	Key string `json:"key,omitempty"`
	// User, Service and Algorithm are read from the signed
	// user-authentication request: the account on the server ("git"), the
	// service ("ssh-connection") and the signature algorithm.
	User      string `json:"user,omitempty"`
	Service   string `json:"service,omitempty"`
	Algorithm string `json:"algorithm,omitempty"`
	// SessionID is the SSH session identifier (exchange hash) the
	// signature is bound to, in hex: it names one SSH connection.
	SessionID string `json:"session_id,omitempty"`
	// Server is the carried connection's name:port the signature was given
	// for.
	Server string `json:"server,omitempty"`
	// ServerHostKey is the SHA256 fingerprint of that connection's server
	// host key (the key that signed its key exchange).
	ServerHostKey string `json:"server_host_key,omitempty"`
	// KnownHost reports that known_hosts lists that key for Server.
	KnownHost bool `json:"known_host,omitempty"`
	// Reason says why a request was refused.
	Reason string `json:"reason,omitempty"`
	// Alert is set on every refusal.
	Alert bool `json:"alert,omitempty"`
}

// Agent is the deploy-key agent. It is safe for concurrent use.
type Agent struct {
	signer  ssh.Signer
	carried *Carried
	pub     []byte
	fp      string
	rec     Recorder
	now     func() time.Time
}

var _ agent.ExtendedAgent = (*Agent)(nil)

// New returns an agent that signs with signer (the deploy key) logins on the
// connections in carried (nil: none) and records every operation to rec
// (nil records nothing).
func New(signer ssh.Signer, carried *Carried, rec Recorder) *Agent {
	pub := signer.PublicKey()
	return &Agent{signer: signer, carried: carried, pub: pub.Marshal(), fp: ssh.FingerprintSHA256(pub), rec: rec, now: time.Now}
}

func (a *Agent) record(e Event) {
	if a.rec == nil {
		return
	}
	e.Time = a.now().UTC()
	e.Alert = e.Decision == "deny"
	a.rec.Record(e)
}

func (a *Agent) refuse(op, reason string) error {
	a.record(Event{Op: op, Decision: "deny", Reason: reason})
	return fmt.Errorf("%w: %s", ErrRefused, reason)
}

// List returns the deploy key's public half, commented "vibedom deploy key".
// Listing is not logged: clients list before every signature.
func (a *Agent) List() ([]*agent.Key, error) {
	return []*agent.Key{{Format: a.signer.PublicKey().Type(), Blob: a.pub, Comment: "vibedom deploy key"}}, nil
}

// Sign signs data with the deploy key when data is an SSH
// user-authentication request for that key whose session identifier is the
// exchange hash of an open carried connection that has not had its
// signature yet; anything else is refused.
func (a *Agent) Sign(key ssh.PublicKey, data []byte) (*ssh.Signature, error) {
	return a.SignWithFlags(key, data, 0)
}

// SignWithFlags is Sign; the flags (RSA hash choices) do not apply to an
// ed25519 key and are ignored.
func (a *Agent) SignWithFlags(key ssh.PublicKey, data []byte, _ agent.SignatureFlags) (*ssh.Signature, error) {
	if key == nil || !bytes.Equal(key.Marshal(), a.pub) {
		fp := ""
		if key != nil {
			fp = ssh.FingerprintSHA256(key)
		}
		a.record(Event{Op: "sign", Decision: "deny", Key: fp, Reason: "not the deploy key"})
		return nil, fmt.Errorf("%w: not the deploy key", ErrRefused)
	}
	req, err := parseUserAuth(data)
	if err != nil {
		a.record(Event{Op: "sign", Decision: "deny", Key: a.fp, Reason: err.Error()})
		return nil, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	e := Event{Op: "sign", Key: a.fp, User: req.User, Service: req.Service, Algorithm: req.Algorithm, SessionID: hex.EncodeToString(req.SessionID)}
	if req.HostKey != nil {
		if hk, err := ssh.ParsePublicKey(req.HostKey); err == nil {
			e.ServerHostKey = ssh.FingerprintSHA256(hk)
		} else {
			e.Decision, e.Reason = "deny", "malformed server host key in the request"
			a.record(e)
			return nil, fmt.Errorf("%w: %s", ErrRefused, e.Reason)
		}
	}
	if !bytes.Equal(req.PubKey, a.pub) {
		e.Decision, e.Reason = "deny", "the request names another key"
		a.record(e)
		return nil, fmt.Errorf("%w: %s", ErrRefused, e.Reason)
	}
	if req.Algorithm != a.signer.PublicKey().Type() {
		e.Decision, e.Reason = "deny", "algorithm does not match the deploy key"
		a.record(e)
		return nil, fmt.Errorf("%w: %s", ErrRefused, e.Reason)
	}
	server, hk, known, refusal := a.carried.claim(req.SessionID, req.HostKey)
	if refusal != "" {
		e.Decision, e.Reason = "deny", refusal
		a.record(e)
		return nil, fmt.Errorf("%w: %s", ErrRefused, refusal)
	}
	e.Server, e.ServerHostKey, e.KnownHost = server, ssh.FingerprintSHA256(hk), known
	sig, err := a.signer.Sign(nil, data)
	if err != nil {
		e.Decision, e.Reason = "deny", "sign: "+err.Error()
		a.record(e)
		return nil, err
	}
	e.Decision = "allow"
	a.record(e)
	return sig, nil
}

// Add refuses: the agent holds only the deploy key.
func (a *Agent) Add(agent.AddedKey) error { return a.refuse("add", "adding keys is not allowed") }

// Remove refuses.
func (a *Agent) Remove(ssh.PublicKey) error {
	return a.refuse("remove", "removing keys is not allowed")
}

// RemoveAll refuses.
func (a *Agent) RemoveAll() error { return a.refuse("remove-all", "removing keys is not allowed") }

// Lock refuses: the guest cannot lock the host's agent.
func (a *Agent) Lock([]byte) error { return a.refuse("lock", "locking is not allowed") }

// Unlock refuses.
func (a *Agent) Unlock([]byte) error { return a.refuse("unlock", "unlocking is not allowed") }

// Signers refuses: the key never leaves the agent.
func (a *Agent) Signers() ([]ssh.Signer, error) {
	return nil, a.refuse("signers", "exporting signers is not allowed")
}

// Extension answers no extension (session-bind@openssh.com included, which
// OpenSSH clients send and do without); each request but session-bind is
// logged as refused.
func (a *Agent) Extension(typ string, _ []byte) ([]byte, error) {
	if typ != extSessionBind { // asked on every OpenSSH connection: not news
		a.record(Event{Op: "extension", Decision: "deny", Reason: "unsupported extension " + clip(typ)})
	}
	return nil, agent.ErrExtensionUnsupported
}

// extSessionBind is the extension OpenSSH's ssh sends before it signs,
// binding the agent connection to the server's host key. The agent does not
// keep such bindings; it is refused without a log line.
const extSessionBind = "session-bind@openssh.com"

// userAuth is the signed part of a publickey user-authentication request
// (RFC 4252 §7, or OpenSSH's publickey-hostbound-v00@openssh.com, which
// appends the server's host key).
type userAuth struct {
	SessionID []byte
	User      string
	Service   string
	Algorithm string
	PubKey    []byte
	HostKey   []byte // hostbound requests only
}

// Methods whose signed requests the agent accepts.
const (
	methodPublicKey = "publickey"
	methodHostbound = "publickey-hostbound-v00@openssh.com"
)

// parseUserAuth parses data as the blob an SSH client signs to
// authenticate with a public key, and nothing else.
func parseUserAuth(data []byte) (*userAuth, error) {
	var m struct {
		SessionID []byte
		Type      byte
		User      string
		Service   string
		Method    string
		HasSig    bool
		Algorithm string
		PubKey    []byte
		Rest      []byte `ssh:"rest"`
	}
	notLogin := errors.New("not an SSH user-authentication request (the agent signs only SSH logins)")
	if err := ssh.Unmarshal(data, &m); err != nil || m.Type != msgUserAuthRequest || !m.HasSig {
		return nil, notLogin
	}
	var hostKey []byte
	switch m.Method {
	case methodPublicKey:
		if len(m.Rest) != 0 {
			return nil, notLogin
		}
	case methodHostbound:
		var h struct{ HostKey []byte }
		if ssh.Unmarshal(m.Rest, &h) != nil {
			return nil, notLogin
		}
		hostKey = h.HostKey
	default:
		return nil, notLogin
	}
	if len(m.SessionID) == 0 || len(m.SessionID) > 64 {
		return nil, errors.New("malformed SSH session identifier")
	}
	return &userAuth{SessionID: m.SessionID, User: clip(m.User), Service: clip(m.Service), Algorithm: clip(m.Algorithm), PubKey: m.PubKey, HostKey: hostKey}, nil
}

// clip bounds a guest-chosen string for a log line and keeps it valid UTF-8.
func clip(s string) string {
	if len(s) > maxLoggedField {
		s = s[:maxLoggedField]
	}
	return string(bytes.ToValidUTF8([]byte(s), []byte(string(utf8.RuneError))))
}
