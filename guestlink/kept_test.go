package guestlink

import (
	"context"
	"net"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/guest/proto"
)

// TestKeptShellEndedWhileStarting: when ctx ends while the guest is still
// answering a kept terminal's start (the command may already run, or ran
// before this attach), Shell only closes the channel: the command must go
// on, so it is never signalled. A plain command is killed as before. The
// guest here holds the exec reply until Shell has given up.
func TestKeptShellEndedWhileStarting(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		keep     string
		wantKill bool
	}{
		{name: "kept", keep: "k"},
		{name: "not kept", wantKill: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeGuest(t)
			execSeen, release := make(chan struct{}), make(chan struct{})
			signals := make(chan []string, 1)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				b, err := ln.Accept()
				if err != nil {
					return
				}
				defer b.Close()
				if _, err := b.Write([]byte(proto.ReadyBanner)); err != nil {
					return
				}
				_, chans, reqs, err := ssh.NewServerConn(b, f.cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				nc := <-chans
				ch, creqs, err := nc.Accept()
				if err != nil {
					return
				}
				defer ch.Close()
				var got []string
				for r := range creqs {
					switch r.Type {
					case "exec", "shell":
						close(execSeen)
						<-release
					case "signal":
						var sg struct{ Signal string }
						_ = ssh.Unmarshal(r.Payload, &sg)
						got = append(got, sg.Signal)
					}
					_ = r.Reply(true, nil)
				}
				signals <- got // the client closed the channel
			}()
			a, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			c, err := Dial(t.Context(), a, f.keys.ClientConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := c.Shell(ctx, ShellOptions{Keep: tt.keep, Command: "work"})
				done <- err
			}()
			<-execSeen
			cancel() // detach (kept) or give up (not kept) while the guest answers
			if err := <-done; err == nil {
				t.Error("Shell: no error after ctx ended before the guest answered")
			}
			close(release)
			got := <-signals
			if killed := len(got) > 0; killed != tt.wantKill {
				t.Errorf("signals sent to the command: %q; want a kill: %v", got, tt.wantKill)
			}
		})
	}
}
