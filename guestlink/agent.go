package guestlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// channelAgent is the channel type the guest opens to reach the forwarded
// agent (OpenSSH's agent forwarding).
const channelAgent = "auth-agent@openssh.com"

// maxAgentChannels bounds the agent channels served at once: the guest
// opens them, and the guest is not trusted to open few. Further ones are
// refused.
const maxAgentChannels = 16

// maxAgentMessage bounds one agent request from the guest. An SSH login's
// sign request is well under 1 KiB; x/crypto's ServeAgent would otherwise
// allocate whatever length (up to 16 MiB) the guest announces, per channel.
const maxAgentMessage = 64 << 10

// ErrNoAgent is returned by Exec and Shell when ForwardAgent is set but
// ServeAgent was never called.
var ErrNoAgent = errors.New("agent forwarding asked for, but no agent is served to the guest")

// agentState is the client's agent, served once ServeAgent was called.
type agentState struct {
	mu     sync.Mutex
	served bool
}

// ServeAgent answers the guest's agent channels with a, for the rest of the
// connection: commands started with ForwardAgent reach it through
// SSH_AUTH_SOCK. At most 16 agent channels are served at once. It may be
// called once per client.
func (c *Client) ServeAgent(a agent.Agent) error {
	c.agent.mu.Lock()
	defer c.agent.mu.Unlock()
	if c.agent.served {
		return errors.New("an agent is already served to the guest")
	}
	chans := c.conn.HandleChannelOpen(channelAgent)
	if chans == nil {
		return errors.New("agent channels are already handled")
	}
	c.agent.served = true
	go func() {
		slots := make(chan struct{}, maxAgentChannels)
		for nc := range chans {
			select {
			case slots <- struct{}{}:
			default:
				_ = nc.Reject(ssh.ResourceShortage, "too many agent connections")
				continue
			}
			ch, reqs, err := nc.Accept()
			if err != nil {
				<-slots
				continue
			}
			go ssh.DiscardRequests(reqs)
			go func() {
				defer func() { <-slots }()
				defer ch.Close()
				_ = agent.ServeAgent(a, struct {
					io.Reader
					io.Writer
				}{&boundedFrames{r: ch, max: maxAgentMessage}, ch})
			}()
		}
	}()
	return nil
}

// requestAgent asks the guest to forward the agent for sess's command.
func (c *Client) requestAgent(sess *ssh.Session) error {
	c.agent.mu.Lock()
	served := c.agent.served
	c.agent.mu.Unlock()
	if !served {
		return ErrNoAgent
	}
	if err := agent.RequestAgentForwarding(sess); err != nil {
		return fmt.Errorf("ask the guest to forward the SSH agent: %w", err)
	}
	return nil
}

// boundedFrames passes an agent protocol stream (4-byte big-endian length,
// then the message) through, failing at the header of a message longer than
// max, before anything allocates room for it.
type boundedFrames struct {
	r    io.Reader
	max  uint32
	hdr  [4]byte
	nhdr int    // header bytes read of the next message
	left uint32 // body bytes of the current message still to come
}

var errAgentMessageTooLong = errors.New("agent message too long")

func (b *boundedFrames) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.left == 0 {
		n, err := b.r.Read(p[:min(len(p), 4-b.nhdr)])
		copy(b.hdr[b.nhdr:], p[:n])
		b.nhdr += n
		if b.nhdr == 4 {
			b.nhdr = 0
			b.left = binary.BigEndian.Uint32(b.hdr[:])
			if b.left > b.max {
				return n, errAgentMessageTooLong
			}
		}
		return n, err
	}
	n, err := b.r.Read(p[:min(uint32(len(p)), b.left)])
	b.left -= uint32(n)
	return n, err
}
