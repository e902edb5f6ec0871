package guestlink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"golang.org/x/crypto/ssh"
)

// ErrPortClosed means nothing in the guest accepted the connection on the
// port (the guest's own refusal, not a failure of the control channel).
var ErrPortClosed = errors.New("nothing answers on that port in the guest")

// DialPort opens a connection to TCP port on the guest's loopback, as a
// direct-tcpip channel of the control connection: published ports travel
// only over the control channel, never the guest's network. The returned
// connection's CloseWrite ends the guest's input while its output still
// comes.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("guest port %d out of range", port)
	}
	conn, err := c.conn.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		var oce *ssh.OpenChannelError
		if errors.As(err, &oce) && oce.Reason == ssh.ConnectionFailed {
			return nil, fmt.Errorf("%w (port %d): %s", ErrPortClosed, port, oce.Message)
		}
		return nil, fmt.Errorf("connect to guest port %d: %w", port, err)
	}
	return conn, nil
}
