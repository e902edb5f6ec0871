package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/sshagent"
)

// SSHAgentOptions configures SSH agent forwarding to the guest.
type SSHAgentOptions struct {
	// Enabled serves the deploy key's agent (sshagent) to the guest: the
	// command or shell gets SSH_AUTH_SOCK, so git can push over SSH where
	// the policy allows host:22. The agent signs one login per SSH
	// connection the proxy carries to an allowed host:22, for that
	// connection only. The key never enters the VM; every signature and
	// refusal is logged to the session's sshagent.LogFile. Off by default.
	Enabled bool
}

// startSSHAgent serves the deploy key's agent to the guest when the
// session asked for it. The deploy key is made now if `vibedom init` has
// not made it.
func (s *sess) startSSHAgent() error {
	if !s.opts.SSHAgent.Enabled {
		return nil
	}
	dk, created, err := keys.EnsureDeployKey(s.opts.Home.Keys())
	if err != nil {
		return fmt.Errorf("SSH agent: %w", err)
	}
	if created {
		s.progress("made a deploy key: add it to your git host (vibedom auth ssh-key prints it): %s", dk.AuthorizedKey())
	}
	l, err := sshagent.OpenLog(s.logDir)
	if err != nil {
		return err
	}
	s.cleanup.add("close the SSH agent log", l.Close)
	if err := s.client.ServeAgent(sshagent.New(dk.Signer(), s.carried, redactedRecorder{s, l})); err != nil {
		return fmt.Errorf("SSH agent: %w", err)
	}
	s.log.Info("SSH agent forwarded to the guest", "key", dk.Fingerprint())
	s.progress("SSH agent: the deploy key %s signs one SSH login per connection the guest makes to an allowed host:22 (each one logged in %s)", dk.Fingerprint(), filepath.Join(s.logDir, sshagent.LogFile))
	return nil
}

// sshTap makes the set of carried SSH connections and returns the egress
// tap that fills it, or nil without --ssh-agent.
func (s *sess) sshTap() func(netfilter.Target) netfilter.ConnTap {
	if !s.opts.SSHAgent.Enabled {
		return nil
	}
	s.carried = sshagent.NewCarried()
	// The user's own record of SSH host keys: a carried connection whose
	// server shows another key of the same type for its name gets no
	// signature (an impostor, or a "server" that echoes the guest's bytes).
	files := []string{"/etc/ssh/ssh_known_hosts"}
	if h, err := os.UserHomeDir(); err == nil {
		files = append([]string{filepath.Join(h, ".ssh", "known_hosts")}, files...)
	}
	check, notes := sshagent.KnownHosts(files...)
	if !anyFile(files) {
		notes = append(notes, "no known_hosts file ("+strings.Join(files, ", ")+"): the agent signs for no server until the user's known_hosts lists its key")
	}
	for _, n := range notes {
		s.log.Warn("SSH agent", "note", n)
		s.progress("SSH agent: %s", n)
	}
	s.carried.CheckHostKeys(check)
	return func(t netfilter.Target) netfilter.ConnTap {
		if cc := s.carried.Track(t.Name, t.Port); cc != nil {
			return carriedTap{cc}
		}
		return nil
	}
}

// carriedTap shows a spliced connection's bytes to the agent's tracker.
type carriedTap struct{ *sshagent.CarriedConn }

func (c carriedTap) ToGuest(p []byte) { c.FromServer(p) }

// redactedRecorder passes the guest-chosen strings of agent events through
// the session's log redactor (a known secret put in an SSH user name must
// not reach the log in clear).
type redactedRecorder struct {
	s    *sess
	next sshagent.Recorder
}

func (r redactedRecorder) Record(e sshagent.Event) {
	if red := r.s.redact; red != nil {
		e.User, e.Service, e.Algorithm, e.Reason = red(e.User), red(e.Service), red(e.Algorithm), red(e.Reason)
	}
	r.next.Record(e)
}

// DeployKeyInfo is the public side of the deploy key.
type DeployKeyInfo struct {
	// PublicKey is the authorized_keys line to register with a git host.
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
	// Path is the private key file (0600, never enters a VM).
	Path string `json:"path"`
	// Created reports that the key was made by this call.
	Created bool `json:"created"`
}

// DeployKey returns the deploy key of h, making it on first use.
func DeployKey(h home.Home) (*DeployKeyInfo, error) {
	dk, created, err := keys.EnsureDeployKey(h.Keys())
	if err != nil {
		return nil, fmt.Errorf("deploy key: %w", err)
	}
	return &DeployKeyInfo{PublicKey: dk.AuthorizedKey(), Fingerprint: dk.Fingerprint(), Path: dk.Path(), Created: created}, nil
}

// anyFile reports whether one of files exists.
func anyFile(files []string) bool {
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			return true
		}
	}
	return false
}
