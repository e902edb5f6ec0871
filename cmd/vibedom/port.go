package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

// Published ports: `vibedom run -p` and `vibedom port NAME add|rm|list`
// (session/ports.go).

func init() {
	commands = append(commands, &cli.Command{
		Name:      "port",
		Usage:     "publish a running session's guest port on the host (add), stop (rm), or list them",
		ArgsUsage: "NAME add|rm|list [[HOSTADDR:][HOSTPORT:]GUESTPORT]",
		Description: `Publishes a port of the guest (a dev server in the VM) on the host, as run -p does:
the host listens on 127.0.0.1 (another address only when you name it; vibedom warns) and
carries each connection to the guest's loopback over the control channel, never the
guest's network. HTTP, WebSocket and long-lived connections work; at most 128 at once per
port. rm takes the host port, the spec add took, or HOSTADDR:HOSTPORT as list shows it,
and closes its connections.`,
		Flags:  []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the ports as JSON"}},
		Action: portAction,
	})
}

// publishFlag is run's -p.
func publishFlag() cli.Flag {
	return &cli.StringSliceFlag{Name: "publish", Aliases: []string{"p"}, Usage: "publish the guest's `[HOSTADDR:][HOSTPORT:]GUESTPORT` on the host (127.0.0.1 unless an address is named; repeatable), e.g. -p 3000 or -p 8080:3000"}
}

// publishedPorts reads run's -p flags, warning about every port that
// listens beyond this machine's loopback.
func publishedPorts(c *cli.Command) ([]session.PortSpec, error) {
	var out []session.PortSpec
	for _, s := range c.StringSlice("publish") {
		p, err := parsePort(s, os.Stderr)
		if err != nil {
			return nil, fmt.Errorf("-p: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parsePort(s string, warn io.Writer) (session.PortSpec, error) {
	p, err := session.ParsePortSpec(s)
	if err != nil {
		return p, err
	}
	if p.Exposed() {
		fmt.Fprintf(warn, "vibedom: warning: %s listens beyond this machine's loopback: whoever reaches that address reaches the guest's server on port %d\n", termtext.Line(p.Host()), p.GuestPort)
	}
	return p, nil
}

func portAction(ctx context.Context, c *cli.Command) error {
	args := c.Args().Slice()
	if len(args) < 2 {
		return errors.New("usage: vibedom port NAME add|rm|list [[HOSTADDR:][HOSTPORT:]GUESTPORT]")
	}
	name, action := args[0], args[1]
	req := session.PortRequest{Action: action}
	switch action {
	case session.PortAdd, session.PortRm:
		if len(args) != 3 {
			return fmt.Errorf("vibedom port %s %s takes one port, e.g. 3000 or 8080:3000", name, action)
		}
		req.Spec = args[2]
		if action == session.PortAdd {
			if _, err := parsePort(req.Spec, os.Stderr); err != nil {
				return err
			}
		}
	case session.PortList:
		if len(args) != 2 {
			return errors.New("vibedom port NAME list takes nothing more")
		}
	default:
		return fmt.Errorf("vibedom port: %q is not add, rm or list", action)
	}
	h, err := home.Default()
	if err != nil {
		return err
	}
	i, err := session.FindSession(h, name)
	if err != nil {
		return err
	}
	conn, err := session.DialControl(i)
	if err != nil {
		return err
	}
	defer conn.Close()
	rep, err := conn.Do(session.ControlRequest{Op: session.OpPort, Port: &req}, 30*time.Second)
	if err != nil {
		return err
	}
	w := c.Root().Writer
	if c.Bool("json") {
		return writeJSON(w, map[string]any{"name": i.Name, "ports": rep.Ports})
	}
	writePorts(w, rep.Ports, "")
	return nil
}

// writePorts prints published ports, one a line, each after prefix.
func writePorts(w io.Writer, ports []session.PortInfo, prefix string) {
	if len(ports) == 0 && prefix == "" {
		fmt.Fprintln(w, "no published ports")
	}
	for _, p := range ports {
		fmt.Fprintf(w, "%s%s -> guest port %d (%d open)\n", prefix, termtext.Line(p.Host), p.Guest, p.Open)
	}
}
