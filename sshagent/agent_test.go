package sshagent

import (
	"bufio"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

type events struct {
	mu sync.Mutex
	ev []Event
}

func (r *events) Record(e Event) { r.mu.Lock(); r.ev = append(r.ev, e); r.mu.Unlock() }
func (r *events) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.ev...)
}

func newSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// userAuthData is what an SSH client signs to log in with pub.
func userAuthData(sessionID []byte, user, algo string, pub ssh.PublicKey) []byte {
	return loginData(sessionID, user, "publickey", algo, pub)
}

// loginData is what an SSH client signs to log in with pub by method
// (publickey, or publickey-hostbound-v00@openssh.com without its host key).
func loginData(sessionID []byte, user, method, algo string, pub ssh.PublicKey) []byte {
	return ssh.Marshal(struct {
		SessionID []byte
		Type      byte
		User      string
		Service   string
		Method    string
		HasSig    bool
		Algorithm string
		PubKey    []byte
	}{sessionID, msgUserAuthRequest, user, "ssh-connection", method, true, algo, pub.Marshal()})
}

// served returns an agent client talking to a over the agent protocol.
func served(t *testing.T, a agent.Agent) agent.ExtendedAgent {
	t.Helper()
	c1, c2 := net.Pipe()
	go agent.ServeAgent(a, c2)
	t.Cleanup(func() { c1.Close(); c2.Close() })
	return agent.NewClient(c1)
}

func TestAgentSignsLogins(t *testing.T) {
	t.Parallel()
	signer := newSigner(t)
	w := newSSHWorld(t, signer.PublicKey())
	rec := &events{}
	c := served(t, New(signer, w.carried, rec))
	keys, err := c.List()
	if err != nil || len(keys) != 1 || string(keys[0].Marshal()) != string(signer.PublicKey().Marshal()) {
		t.Fatalf("List: %v %v", keys, err)
	}
	_, sid := w.probe(t)
	data := userAuthData(sid, "git", ssh.KeyAlgoED25519, signer.PublicKey())
	sig, err := c.Sign(signer.PublicKey(), data)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if err := signer.PublicKey().Verify(data, sig); err != nil {
		t.Errorf("signature does not verify: %v", err)
	}
	ev := rec.all()
	if len(ev) != 1 {
		t.Fatalf("events: %+v", ev)
	}
	e := ev[0]
	if e.Op != "sign" || e.Decision != "allow" || e.User != "git" || e.Service != "ssh-connection" ||
		e.Algorithm != ssh.KeyAlgoED25519 || e.Key != ssh.FingerprintSHA256(signer.PublicKey()) ||
		e.SessionID != hex.EncodeToString(sid) || e.Server != "git.test:22" || e.Time.IsZero() || e.Alert {
		t.Errorf("event: %+v", e)
	}
}

// TestAgentSignsHostboundLogins: OpenSSH ≥ 8.9 signs logins to servers that
// offer it with publickey-hostbound-v00@openssh.com and the server's host
// key appended; the agent signs those and logs the host key.
func TestAgentSignsHostboundLogins(t *testing.T) {
	t.Parallel()
	signer := newSigner(t)
	w := newSSHWorld(t, signer.PublicKey())
	host := w.host
	_, sid := w.probe(t)
	base := loginData(sid, "git", methodHostbound, ssh.KeyAlgoED25519, signer.PublicKey())
	rec := &events{}
	c := served(t, New(signer, w.carried, rec))
	data := append(append([]byte(nil), base...), ssh.Marshal(struct{ K []byte }{host.PublicKey().Marshal()})...)
	sig, err := c.Sign(signer.PublicKey(), data)
	if err != nil || signer.PublicKey().Verify(data, sig) != nil {
		t.Fatalf("Sign: %v", err)
	}
	if _, err := c.Sign(signer.PublicKey(), base); err == nil {
		t.Error("a hostbound request without the host key was signed")
	}
	if _, err := c.Sign(signer.PublicKey(), append(append([]byte(nil), base...), ssh.Marshal(struct{ K []byte }{[]byte("junk")})...)); err == nil {
		t.Error("a hostbound request with a malformed host key was signed")
	}
	ev := rec.all()
	if len(ev) != 3 || ev[0].Decision != "allow" || ev[0].ServerHostKey != ssh.FingerprintSHA256(host.PublicKey()) ||
		ev[1].Decision != "deny" || ev[2].Decision != "deny" {
		t.Errorf("events: %+v", ev)
	}
}

func TestAgentRefuses(t *testing.T) {
	t.Parallel()
	signer := newSigner(t)
	other := newSigner(t)
	sid := []byte("0123456789abcdef")
	tests := []struct {
		name   string
		op     string
		do     func(c agent.ExtendedAgent) error
		reason string
	}{
		{"add", "add", func(c agent.ExtendedAgent) error {
			_, k, _ := ed25519.GenerateKey(rand.Reader)
			return c.Add(agent.AddedKey{PrivateKey: k})
		}, "adding"},
		{"remove", "remove", func(c agent.ExtendedAgent) error { return c.Remove(signer.PublicKey()) }, "removing"},
		{"remove all", "remove-all", func(c agent.ExtendedAgent) error { return c.RemoveAll() }, "removing"},
		{"lock", "lock", func(c agent.ExtendedAgent) error { return c.Lock([]byte("pw")) }, "locking"},
		{"unlock", "unlock", func(c agent.ExtendedAgent) error { return c.Unlock([]byte("pw")) }, "unlocking"},
		{"extension", "extension", func(c agent.ExtendedAgent) error {
			_, err := c.Extension("query", nil)
			return err
		}, "unsupported extension"},
		{"another key", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(other.PublicKey(), userAuthData(sid, "git", ssh.KeyAlgoED25519, other.PublicKey()))
			return err
		}, "not the deploy key"},
		{"arbitrary data", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(signer.PublicKey(), []byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n"))
			return err
		}, "not an SSH user-authentication request"},
		{"git commit signature (SSHSIG)", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(signer.PublicKey(), append([]byte("SSHSIG"), ssh.Marshal(struct{ N, R, H, M string }{"git", "", "sha512", "x"})...))
			return err
		}, "not an SSH user-authentication request"},
		{"login naming another key", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(signer.PublicKey(), userAuthData(sid, "git", ssh.KeyAlgoED25519, other.PublicKey()))
			return err
		}, "another key"},
		{"login with another algorithm", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(signer.PublicKey(), userAuthData(sid, "git", ssh.KeyAlgoRSA, signer.PublicKey()))
			return err
		}, "algorithm"},
		{"trailing bytes", "sign", func(c agent.ExtendedAgent) error {
			_, err := c.Sign(signer.PublicKey(), append(userAuthData(sid, "git", ssh.KeyAlgoED25519, signer.PublicKey()), 0))
			return err
		}, "not an SSH user-authentication request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &events{}
			c := served(t, New(signer, nil, rec))
			if err := tt.do(c); err == nil {
				t.Fatalf("got no error, want a refusal")
			}
			ev := rec.all()
			if len(ev) != 1 || ev[0].Op != tt.op || ev[0].Decision != "deny" || !strings.Contains(ev[0].Reason, tt.reason) {
				t.Errorf("events: %+v, want one %s deny with %q", ev, tt.op, tt.reason)
			}
		})
	}
	t.Run("signers", func(t *testing.T) {
		rec := &events{}
		s, err := New(signer, nil, rec).Signers()
		if s != nil || !errors.Is(err, ErrRefused) {
			t.Errorf("Signers: %v %v", s, err)
		}
		if ev := rec.all(); len(ev) != 1 || ev[0].Op != "signers" {
			t.Errorf("events: %+v", ev)
		}
	})
	t.Run("session-bind: refused, not logged", func(t *testing.T) {
		rec := &events{}
		c := served(t, New(signer, nil, rec))
		if _, err := c.Extension("session-bind@openssh.com", nil); err == nil {
			t.Error("session-bind answered")
		}
		if ev := rec.all(); len(ev) != 0 {
			t.Errorf("events: %+v", ev)
		}
	})
	t.Run("still one key", func(t *testing.T) {
		c := served(t, New(signer, nil, nil))
		if keys, err := c.List(); err != nil || len(keys) != 1 {
			t.Errorf("List after refusals: %v %v", keys, err)
		}
	})
}

func TestLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := OpenLog(dir)
	if err != nil {
		t.Fatal(err)
	}
	signer := newSigner(t)
	w := newSSHWorld(t, signer.PublicKey())
	a := New(signer, w.carried, l)
	_, sid := w.probe(t)
	if _, err := a.Sign(signer.PublicKey(), userAuthData(sid, "git\x1b[2J", ssh.KeyAlgoED25519, signer.PublicKey())); err != nil {
		t.Fatal(err)
	}
	a.Sign(signer.PublicKey(), []byte("junk"))
	l.limit = l.size + 10 // the next line does not fit
	a.Add(agent.AddedKey{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, LogFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("log mode: %v %v", fi, err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	var lines []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, e)
	}
	if len(lines) != 3 || lines[0].Decision != "allow" || lines[0].User != "git\x1b[2J" || lines[1].Decision != "deny" ||
		lines[2].Op != "dropped" || !strings.Contains(lines[2].Reason, "1 events") {
		t.Errorf("lines: %+v", lines)
	}
}
