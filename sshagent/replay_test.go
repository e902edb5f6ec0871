package sshagent

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// recorder keeps every byte that passes through it.
type recorder struct {
	mu  sync.Mutex
	got []byte
}

func (r *recorder) add(b []byte) {
	r.mu.Lock()
	r.got = append(r.got, b...)
	r.mu.Unlock()
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.got...)
}

// relayHalf copies src to dst, recording what passes.
func relayHalf(dst, src net.Conn, rec *recorder) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			rec.add(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestAgentRefusesReplayedKeyExchange: an outsider's own SSH session with a
// real server (real.test, which the user's known_hosts lists) is recorded,
// and an allowed host:22 the attacker runs (evil.test, not listed) replays
// that server's side to the guest's connection. The server's signature
// verifies over the outsider's session id with real.test's genuine key, yet
// the connection is to evil.test: no signature, so the outsider cannot log
// in to real.test as the deploy key. Before the agent required a known_hosts
// entry for the carried name, it signed.
func TestAgentRefusesReplayedKeyExchange(t *testing.T) {
	t.Parallel()
	deploy := newSigner(t)
	realHost := newSigner(t)
	scfg := &ssh.ServerConfig{NoClientAuth: true}
	scfg.AddHostKey(realHost)
	client, relayC := net.Pipe()
	relayS, server := net.Pipe()
	t.Cleanup(func() { client.Close(); relayC.Close(); relayS.Close(); server.Close() })
	go ssh.NewServerConn(server, scfg)
	var fromClient, fromServer recorder
	go relayHalf(relayS, relayC, &fromClient)
	go relayHalf(relayC, relayS, &fromServer)
	cc, _, _, err := ssh.NewClientConn(client, "real.test:22", &ssh.ClientConfig{User: "x", HostKeyCallback: ssh.FixedHostKey(realHost.PublicKey())})
	if err != nil {
		t.Fatal(err)
	}
	outsider := cc.SessionID()

	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(kh, []byte("real.test "+string(ssh.MarshalAuthorizedKey(realHost.PublicKey()))), 0o600); err != nil {
		t.Fatal(err)
	}
	check, _ := KnownHosts(kh)
	set := NewCarried()
	set.CheckHostKeys(check)
	conn := set.Track("evil.test", 22)
	conn.FromGuest(fromClient.bytes())
	conn.FromServer(fromServer.bytes())
	ag := New(deploy, set, nil)
	_, err = ag.Sign(deploy.PublicKey(), userAuthData(outsider, "git", deploy.PublicKey().Type(), deploy.PublicKey()))
	if err == nil {
		t.Fatal("signed the outsider's session id for a connection to evil.test replaying real.test's key exchange")
	}
	t.Logf("refused: %v", err)
}
