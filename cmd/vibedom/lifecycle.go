package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

// The commands that reach a running session through its host's control
// socket (session/control.go): attach, status, exec, stop, pause, resume.

// detachKey ends an attachment without ending the agent: Ctrl-].
const detachKey = 0x1d

func init() {
	jsonFlag := &cli.BoolFlag{Name: "json", Usage: "print JSON"}
	commands = append(commands,
		&cli.Command{
			Name:      "attach",
			Usage:     "attach your terminal to a running session's agent (Ctrl-] detaches; the agent keeps running)",
			ArgsUsage: "NAME",
			Description: `Joins the terminal the session's agent (or shell) runs on, first showing its
recent output. Press Ctrl-] to detach: the agent keeps running in the VM, and
a later attach shows what it did meanwhile. Several terminals may attach at
once. When the agent exits the session collects its changes and powers off;
review them with vibedom review NAME.`,
			Action: attachAction,
		},
		&cli.Command{
			Name:      "status",
			Usage:     "show a session's state (running, paused, stopped, crashed …)",
			ArgsUsage: "[NAME]",
			Flags:     []cli.Flag{jsonFlag},
			Action:    statusAction,
		},
		&cli.Command{
			Name:      "exec",
			Usage:     "run a command in a running session's VM, beside its agent",
			ArgsUsage: "NAME -- COMMAND [ARGS…]",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "pass your standard input to the command"},
				&cli.BoolFlag{Name: "root", Usage: "run as root (default: the agent user)"},
			},
			Action: execAction,
		},
		&cli.Command{
			Name:      "stop",
			Usage:     "end a running session: end its agent, collect its changes, power the VM off",
			ArgsUsage: "NAME",
			Description: `The agent gets a hang-up, as when a terminal closes; after 10 seconds the
session goes on without it. The changes wait for vibedom review NAME (a session
in the foreground asks on its own terminal).`,
			Flags:  []cli.Flag{jsonFlag, &cli.BoolFlag{Name: "no-wait", Usage: "return once the session was asked to stop"}},
			Action: stopAction,
		},
		&cli.Command{
			Name:      "pause",
			Usage:     "freeze a running session's VM (its memory stays; nothing in it runs)",
			ArgsUsage: "NAME",
			Flags:     []cli.Flag{jsonFlag, &cli.BoolFlag{Name: "to-disk", Usage: "save the VM's state to disk and stop it (vz on macOS 14+)"}},
			Action:    pauseAction(session.OpPause),
		},
		&cli.Command{
			Name:      "resume",
			Usage:     "thaw a paused session's VM; its clock is set from the host's",
			ArgsUsage: "NAME",
			Flags:     []cli.Flag{jsonFlag},
			Action:    pauseAction(session.OpResume),
		},
	)
}

// findSession reads the named session (one argument required).
func findSession(c *cli.Command, optional bool) (home.Home, *session.Info, error) {
	home, err := home.Default()
	if err != nil {
		return "", nil, err
	}
	name := c.Args().First()
	if name == "" && !optional {
		return "", nil, fmt.Errorf("no session named: run `vibedom %s NAME` (`vibedom list` shows them)", c.Name)
	}
	if c.Args().Len() > 1 && c.Name != "exec" {
		return "", nil, fmt.Errorf("one session at a time: `vibedom %s NAME`", c.Name)
	}
	i, err := session.FindSession(home, name)
	return home, i, err
}

func dial(c *cli.Command) (*session.Info, *session.ControlConn, error) {
	_, i, err := findSession(c, false)
	if err != nil {
		return nil, nil, err
	}
	conn, err := session.DialControl(i)
	return i, conn, err
}

func pauseAction(op string) cli.ActionFunc {
	return func(ctx context.Context, c *cli.Command) error {
		i, conn, err := dial(c)
		if err != nil {
			return err
		}
		defer conn.Close()
		rep, err := conn.Do(session.ControlRequest{Op: op, ToDisk: c.Bool("to-disk")}, 2*time.Minute)
		if err != nil {
			return err
		}
		w := c.Root().Writer
		if c.Bool("json") {
			return writeJSON(w, map[string]any{"name": i.Name, "op": op, "took_ms": rep.Took.Milliseconds()})
		}
		verb := map[string]string{session.OpPause: "paused", session.OpResume: "resumed"}[op]
		fmt.Fprintf(w, "%s %s in %.2fs\n", verb, termtext.Line(i.Name), rep.Took.Seconds())
		return nil
	}
}

func statusAction(ctx context.Context, c *cli.Command) error {
	_, i, err := findSession(c, true)
	if err != nil {
		return err
	}
	out := map[string]any{
		"name": i.Name, "status": statusLabel(i), "workspace": i.Workspace, "created": i.Created,
		"log_dir": i.LogDir, "patch_pending": i.PatchPending(), "detached": i.Detached,
	}
	if i.Live == session.StatusCrashed || i.Live == session.StatusFailed {
		out["recoverable"] = i.Recoverable()
	}
	var hs *session.HostStatus
	if conn, err := session.DialControl(i); err == nil {
		rep, err := conn.Do(session.ControlRequest{Op: session.OpStatus}, 10*time.Second)
		conn.Close()
		if err == nil && rep.Status != nil {
			hs = rep.Status
			out["status"], out["vm"], out["pid"], out["attached"], out["agent"] = string(hs.Status), hs.VM, hs.PID, hs.Attached, hs.Agent
			if !hs.PausedAt.IsZero() {
				out["paused_at"] = hs.PausedAt
			}
			out["ports"] = hs.Ports
		}
	}
	w := c.Root().Writer
	if c.Bool("json") {
		return writeJSON(w, out)
	}
	fmt.Fprintf(w, "session   %s\n", termtext.Line(i.Name))
	fmt.Fprintf(w, "status    %s\n", termtext.Line(fmt.Sprint(out["status"])))
	fmt.Fprintf(w, "workspace %s\n", termtext.Line(i.Workspace))
	fmt.Fprintf(w, "created   %s\n", i.Created.Local().Format("2006-01-02 15:04:05"))
	if hs != nil {
		fmt.Fprintf(w, "vm        %s (pid %d, %s)\n", termtext.Line(hs.VM), hs.PID, termtext.Line(hs.Driver))
		if hs.Agent != "" {
			fmt.Fprintf(w, "agent     %s (%d attached)\n", termtext.Line(hs.Agent), hs.Attached)
		}
		if !hs.PausedAt.IsZero() {
			fmt.Fprintf(w, "paused    since %s (%s)\n", hs.PausedAt.Local().Format("15:04:05"), time.Since(hs.PausedAt).Round(time.Second))
		}
		writePorts(w, hs.Ports, "port      ")
	}
	fmt.Fprintf(w, "logs      %s\n", termtext.Line(i.LogDir))
	switch {
	case i.Live == session.StatusCrashed && i.Recoverable():
		fmt.Fprintf(w, "next      vibedom recover %s (its host died; the agent's work is on its scratch disk)\n", termtext.Line(i.Name))
	case i.Live == session.StatusFailed && i.Recoverable():
		fmt.Fprintf(w, "next      vibedom recover %s (its changes were not collected; the agent's work is on its scratch disk)\n", termtext.Line(i.Name))
	case i.PatchPending():
		fmt.Fprintf(w, "next      vibedom review %s\n", termtext.Line(i.Name))
	}
	return nil
}

// statusLabel is the status a user reads: crashed sessions whose work can
// be recovered say so, and so do sessions that ended without collecting
// it (their scratch disk is kept for the same recovery).
func statusLabel(i *session.Info) string {
	switch {
	case (i.Live == session.StatusCrashed || i.Live == session.StatusFailed) && i.Recoverable():
		return "crashed, recoverable"
	case i.Live == session.StatusRunning && i.Detached:
		return "running, detached"
	case i.Live == session.StatusPaused && i.Detached:
		return "paused, detached"
	}
	return string(i.Live)
}

func execAction(ctx context.Context, c *cli.Command) error {
	args := c.Args().Slice()
	if len(args) < 2 {
		return errors.New("no command given: run `vibedom exec NAME -- COMMAND`")
	}
	argv := args[1:]
	if argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return errors.New("no command given: run `vibedom exec NAME -- COMMAND`")
	}
	_, conn, err := dial(c)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Do(session.ControlRequest{Op: session.OpExec, Argv: argv, Root: c.Bool("root")}, 30*time.Second); err != nil {
		return err
	}
	st := conn.Stream()
	if c.Bool("interactive") {
		go func() {
			_, _ = io.Copy(st.Input(), os.Stdin)
			_ = st.CloseInput()
		}()
	} else {
		// A host that already ended the command has closed its side: its
		// exit frame, read below, says why.
		_ = st.CloseInput()
	}
	x, err := st.Copy(os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	if x.Error != "" {
		return errors.New(x.Error)
	}
	return exitCode(x.Code)
}

func stopAction(ctx context.Context, c *cli.Command) error {
	i, conn, err := dial(c)
	if err != nil {
		return err
	}
	_, err = conn.Do(session.ControlRequest{Op: session.OpStop}, 30*time.Second)
	conn.Close()
	if err != nil {
		return err
	}
	w := c.Root().Writer
	if c.Bool("no-wait") {
		if c.Bool("json") {
			return writeJSON(w, map[string]any{"name": i.Name, "status": "stopping"})
		}
		fmt.Fprintf(w, "asked %s to stop\n", termtext.Line(i.Name))
		return nil
	}
	if !c.Bool("json") {
		fmt.Fprintf(os.Stderr, "vibedom: stopping %s: ending the agent, collecting its changes, powering off\n", termtext.Line(i.Name))
	}
	home, _ := home.Default()
	var last *session.Info
	for end := time.Now().Add(15 * time.Minute); time.Now().Before(end); {
		last, err = session.FindSession(home, i.Name)
		if err != nil {
			return err
		}
		if last.Live != session.StatusStopping && last.Live != session.StatusRunning && last.Live != session.StatusPaused && last.Live != session.StatusStarting {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if c.Bool("json") {
		return writeJSON(w, map[string]any{"name": last.Name, "status": string(last.Live), "patch_pending": last.PatchPending(), "error": last.Error})
	}
	switch {
	case last.Live == session.StatusFailed && last.Recoverable() && !strings.Contains(last.Error, "vibedom recover"):
		return fmt.Errorf("session %s ended with an error: %s (logs: %s); the agent's work is kept: vibedom recover %s", last.Name, last.Error, last.LogDir, last.Name)
	case last.Live == session.StatusFailed:
		return fmt.Errorf("session %s ended with an error: %s (logs: %s)", last.Name, last.Error, last.LogDir)
	case last.PatchPending():
		fmt.Fprintf(w, "stopped %s; review its changes: vibedom review %s\n", termtext.Line(last.Name), termtext.Line(last.Name))
	case last.Live == session.StatusStopped:
		fmt.Fprintf(w, "stopped %s; the agent changed nothing\n", termtext.Line(last.Name))
	default:
		fmt.Fprintf(w, "stopped %s (%s)\n", termtext.Line(last.Name), termtext.Line(string(last.Live)))
	}
	return nil
}

func attachAction(ctx context.Context, c *cli.Command) error {
	i, conn, err := dial(c)
	if err != nil {
		return err
	}
	defer conn.Close()
	t := session.NewTerminal(os.Stdin, os.Stdout)
	req := session.ControlRequest{Op: session.OpAttach, Term: session.TermName(), Cols: 80, Rows: 24}
	if t != nil {
		sz := t.Size()
		req.Cols, req.Rows = sz.Cols, sz.Rows
	}
	if _, err := conn.Do(req, 30*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "vibedom: attached to %s (Ctrl-] detaches; the agent keeps running)\r\n", termtext.Line(i.Name))
	st := conn.Stream()
	if t != nil {
		restore, err := t.MakeRaw()
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer restore()
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			for ws := range t.Resizes(rctx) {
				_ = st.Resize(ws.Cols, ws.Rows)
			}
		}()
	}
	detached := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := os.Stdin.Read(buf)
			if n > 0 {
				p := buf[:n]
				if k := bytes.IndexByte(p, detachKey); k >= 0 {
					_, _ = st.Input().Write(p[:k])
					close(detached)
					conn.Close()
					return
				}
				if _, err := st.Input().Write(p); err != nil {
					return
				}
			}
			if err != nil {
				// End of input: stay attached read-only (a script's
				// attach ends with the agent or with Ctrl-] sent).
				return
			}
		}
	}()
	x, err := st.Copy(os.Stdout, os.Stdout)
	select {
	case <-detached:
		fmt.Fprintf(os.Stderr, "\r\nvibedom: detached from %s; it keeps running (vibedom attach %s)\r\n", termtext.Line(i.Name), termtext.Line(i.Name))
		return nil
	default:
	}
	if err != nil {
		return err
	}
	switch {
	case x.Error != "":
		return errors.New(x.Error)
	case x.Detached:
		fmt.Fprintf(os.Stderr, "\r\nvibedom: detached from %s\r\n", termtext.Line(i.Name))
		return nil
	}
	fmt.Fprintf(os.Stderr, "\r\nvibedom: the agent of %s exited (%d); the session collects its changes and powers off: vibedom review %s\r\n",
		termtext.Line(i.Name), x.Code, termtext.Line(i.Name))
	return exitCode(x.Code)
}

func init() {
	commands = append(commands, &cli.Command{
		Name:      "recover",
		Usage:     "bring a crashed session's work to review: boot a rescue VM on its scratch disk and collect the changes",
		ArgsUsage: "NAME",
		Description: `When a session's host process died (killed, a reboot, power loss), the agent's
work is still on the session's scratch disk: vibedom list shows the session as
"crashed, recoverable". recover boots a rescue VM on that disk with no network
and the project read-only, collects the change set and shows the review prompt
(without a terminal the patch waits for vibedom review NAME). Writes the agent
made in its last seconds before the crash may be missing: the guest's file
system commits every few seconds.`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "apply", Usage: "apply every change at the end without asking"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print no progress lines"},
		},
		Action: func(ctx context.Context, c *cli.Command) error {
			home, i, err := findSession(c, false)
			if err != nil {
				return err
			}
			ro := session.RecoverOptions{Home: home, Name: i.Name, Progress: os.Stderr,
				Terminal: session.NewTerminal(os.Stdin, os.Stdout), Review: session.ReviewOptions{ApplyAll: c.Bool("apply")}}
			if c.Bool("quiet") {
				ro.Progress = nil
			}
			ro.Review.Color = ro.Terminal != nil && os.Getenv("NO_COLOR") == ""
			ro.Interrupts = interrupts()
			_, err = session.Recover(ctx, ro)
			return err
		},
	})
}

// interrupts delivers this process's SIGINT and SIGTERM to a session (see
// session.Options.Interrupts), besides the command's context.
func interrupts() <-chan os.Signal {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	return sigs
}
