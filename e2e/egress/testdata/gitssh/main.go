// Command gitssh is a minimal SSH client for git (GIT_SSH with
// GIT_SSH_VARIANT=simple: `gitssh [user@]host command`), built for the guest
// by TestGitPushSSHAgentVM because the test guest's userland has no SSH
// client (the Debian packages the test mirror is made from hold none; the
// real Alpine image has openssh-client). It authenticates only with the
// agent in $SSH_AUTH_SOCK, pins the server's host key to the fingerprint in
// $GITSSH_HOSTKEY, and connects to port 22.
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		var ee *ssh.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitStatus())
		}
		fmt.Fprintln(os.Stderr, "gitssh:", err)
		os.Exit(255)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: gitssh [user@]host command (got %q)", args)
	}
	user, host, ok := strings.Cut(args[0], "@")
	if !ok {
		user, host = "git", args[0]
	}
	ac, err := net.Dial("unix", os.Getenv("SSH_AUTH_SOCK"))
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer ac.Close()
	ag := agent.NewClient(ac)
	want := os.Getenv("GITSSH_HOSTKEY")
	cfg := &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeysCallback(ag.Signers)},
		HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
			if got := ssh.FingerprintSHA256(k); got != want {
				return fmt.Errorf("host key %s, want %s", got, want)
			}
			return nil
		},
	}
	c, err := ssh.Dial("tcp", net.JoinHostPort(host, "22"), cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		return err
	}
	s.Stdin, s.Stdout, s.Stderr = os.Stdin, os.Stdout, os.Stderr
	return s.Run(args[1])
}
