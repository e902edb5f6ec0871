package sshagent

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// TestAgentWithOpenSSH: OpenSSH's ssh logs in to an SSH server on loopback
// with the agent (its session-bind request refused, not logged), and
// ssh-add cannot add a key to it.
func TestAgentWithOpenSSH(t *testing.T) {
	for _, bin := range []string{"ssh", "ssh-add", "ssh-keygen"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	signer := newSigner(t)
	rec := &events{}
	a := New(signer, rec)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); agent.ServeAgent(a, c) }()
		}
	}()

	_, hk, _ := ed25519.GenerateKey(rand.Reader)
	hs, _ := ssh.NewSignerFromKey(hk)
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), signer.PublicKey().Marshal()) {
			return nil, nil
		}
		return nil, errors.New("no")
	}}
	cfg.AddHostKey(hs)
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	go func() {
		for {
			c, err := sl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					for r := range creqs {
						r.Reply(r.Type == "exec", nil)
						if r.Type == "exec" {
							io.WriteString(ch, "logged in\n")
							ch.SendRequest("exit-status", false, ssh.Marshal(struct{ S uint32 }{0}))
							ch.Close()
						}
					}
				}
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(sl.Addr().String())
	env := []string{"SSH_AUTH_SOCK=" + sock, "HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	cmd := exec.Command("ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "IdentityFile=/dev/null", "-p", port, "git@127.0.0.1", "x")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "logged in") {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
	ev := rec.all()
	if len(ev) != 1 || ev[0].Op != "sign" || ev[0].Decision != "allow" || ev[0].User != "git" {
		t.Errorf("events after the login: %+v", ev)
	}

	keyFile := filepath.Join(t.TempDir(), "k")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	add := exec.Command("ssh-add", keyFile)
	add.Env = env
	if out, err := add.CombinedOutput(); err == nil {
		t.Errorf("ssh-add succeeded:\n%s", out)
	}
	list := exec.Command("ssh-add", "-l")
	list.Env = env
	if out, err := list.CombinedOutput(); err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("ssh-add -l after the refused add: %v\n%s", err, out)
	}
}
