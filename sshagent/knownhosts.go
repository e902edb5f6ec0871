package sshagent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyCheck says whether key is a host key the user knows for server
// (name:port): known reports a match; an error means the user knows
// another key of the same type for it (or revoked this one), and the agent
// refuses. A server with no key of that type on record is neither.
type HostKeyCheck func(server string, key ssh.PublicKey) (known bool, err error)

// CheckHostKeys makes the agent check the host key of a carried
// connection with check before it signs for it.
func (c *Carried) CheckHostKeys(check HostKeyCheck) {
	c.mu.Lock()
	c.check = check
	c.mu.Unlock()
}

// KnownHosts returns a HostKeyCheck against OpenSSH known_hosts files. A
// file that does not exist is skipped; notes say which files could not be
// used and why.
func KnownHosts(files ...string) (check HostKeyCheck, notes []string) {
	var use []string
	for _, f := range files {
		if _, err := knownhosts.New(f); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("known_hosts file %s not used: %v", f, err))
			}
			continue
		}
		use = append(use, f)
	}
	if len(use) == 0 {
		return func(string, ssh.PublicKey) (bool, error) { return false, nil }, notes
	}
	cb, err := knownhosts.New(use...)
	if err != nil {
		return func(string, ssh.PublicKey) (bool, error) { return false, nil }, append(notes, "known_hosts: "+err.Error())
	}
	return func(server string, key ssh.PublicKey) (bool, error) {
		// The address is the name: no IP entry is consulted (the guest
		// dialled a name; the host's resolver chose the address).
		err := cb(server, fakeAddr(server), key)
		var ke *knownhosts.KeyError
		var re *knownhosts.RevokedError
		switch {
		case err == nil:
			return true, nil
		case errors.As(err, &re):
			return false, fmt.Errorf("its host key %s is revoked in %s:%d", ssh.FingerprintSHA256(key), re.Revoked.Filename, re.Revoked.Line)
		case errors.As(err, &ke):
			var lines []string
			for _, w := range ke.Want {
				// Only a known key of the same type is a mismatch: the guest's
				// client may have preferred a type the user has not recorded.
				if w.Key.Type() == key.Type() {
					lines = append(lines, fmt.Sprintf("%s:%d", w.Filename, w.Line))
				}
			}
			if len(lines) == 0 {
				return false, nil
			}
			return false, fmt.Errorf("its host key %s is not the one known_hosts lists for it (%s): an impostor, or the key changed (check, then update known_hosts)",
				ssh.FingerprintSHA256(key), strings.Join(lines, ", "))
		default:
			return false, err
		}
	}, notes
}

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

var _ net.Addr = fakeAddr("")
