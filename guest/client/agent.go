package client

import (
	"errors"
	"fmt"
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
				_ = agent.ServeAgent(a, ch)
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
