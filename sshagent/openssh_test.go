package sshagent

import (
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh/agent"
)

// TestAgentWithOpenSSH: OpenSSH's ssh logs in to an SSH server on loopback
// through a splice with the agent (its session-bind request refused, not
// logged), but not on its own connection (OpenSSH's key exchange, a
// post-quantum hybrid, is read by Carried), and
// ssh-add cannot add a key to it.
func TestAgentWithOpenSSH(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"ssh", "ssh-add", "ssh-keygen"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	signer := newSigner(t)
	rec := &events{}
	w := newSSHWorld(t, signer.PublicKey())
	a := New(signer, w.carried, rec)
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

	_, port, _ := net.SplitHostPort(w.spliced)
	_, directPort, _ := net.SplitHostPort(w.direct)
	env := []string{"SSH_AUTH_SOCK=" + sock, "HOME=" + t.TempDir(), "PATH=/usr/bin:/bin"}
	login := func(port string) *exec.Cmd {
		cmd := exec.Command("ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
			"-o", "UserKnownHostsFile=/dev/null", "-o", "IdentityFile=/dev/null", "-p", port, "git@127.0.0.1", "x")
		cmd.Env = env
		return cmd
	}
	// Outside the VM: the same login on the client's own connection.
	if out, err := login(directPort).CombinedOutput(); err == nil {
		t.Fatalf("ssh outside the splice logged in:\n%s", out)
	}
	wantRefusal(t, rec, "no SSH connection to an allowed host:22 is open")
	out, err := login(port).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "logged in") {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
	ev := rec.all()
	if len(ev) != 2 || ev[1].Op != "sign" || ev[1].Decision != "allow" || ev[1].User != "git" || ev[1].Server != "git.test:22" {
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
