package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/urfave/cli/v3"

	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/session"
	"github.com/vibedom/vibedom/termtext"
)

// `vibedom run --detach`: this process checks what it can on the user's
// terminal (arguments, the secrets preflight), then starts itself again as
// the session host, in its own session and process group with its output
// in the session's log, and returns once the host says the session runs.
// The host reports progress and readiness over an inherited pipe (fd 3).

// Environment of the session host process.
const (
	envHost          = "VIBEDOM_SESSION_HOST"      // "1" in the host
	envHostName      = "VIBEDOM_SESSION_NAME"      // the session name the parent chose
	envHostPreflight = "VIBEDOM_SESSION_PREFLIGHT" // the mode the host scans with
)

// Lines the host writes on the readiness pipe besides progress.
const (
	readyPrefix = "\x00ready "
	errorPrefix = "\x00error "
)

// hostLogName is the session host's own output file under the logs folder.
func hostLogName(name string) string { return "host-" + name + ".log" }

// detachRun starts the session host in the background.
func detachRun(ctx context.Context, c *cli.Command, o session.Options) error {
	ws, err := session.CheckWorkspace(o.Workspace)
	if err != nil {
		return err
	}
	o.Workspace = ws
	name := o.Name
	if name == "" {
		name = session.NewName(ws)
	} else if !session.ValidName(name) {
		return fmt.Errorf("session name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	if _, err := os.Stat(o.Home.Session(name)); err == nil {
		return fmt.Errorf("a session named %q already exists: pick another --name", name)
	}
	// The secrets preflight asks here, on the user's terminal; the host
	// then only reports (its findings go to its log).
	childMode := o.Preflight.Mode
	if childMode != preflight.ModeOff {
		o.Terminal = session.NewTerminal(os.Stdin, os.Stderr)
		if err := session.Preflight(ctx, o); err != nil {
			return err
		}
		if childMode == preflight.ModePrompt {
			childMode = preflight.ModeWarn
		}
	}
	if err := os.MkdirAll(o.Home.Logs(), 0o700); err != nil {
		return err
	}
	logPath := filepath.Join(o.Home.Logs(), hostLogName(name))
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open the session host's log: %w", err)
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the vibedom program: %w", err)
	}
	cmd := exec.Command(self, hostArgs(os.Args[1:])...)
	cmd.Env = append(os.Environ(), envHost+"=1", envHostName+"="+name, envHostPreflight+"="+childMode.String())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = detachAttr()
	if err := cmd.Start(); err != nil {
		pw.Close()
		return fmt.Errorf("start the session host: %w", err)
	}
	pw.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	quiet := c.Bool("quiet") || c.Bool("json")
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, readyPrefix):
			w := c.Root().Writer
			if c.Bool("json") {
				return writeJSON(w, map[string]any{"name": name, "pid": cmd.Process.Pid, "host_log": logPath, "workspace": ws})
			}
			fmt.Fprintf(w, "%s\n", termtext.Line(name))
			fmt.Fprintf(os.Stderr, "vibedom: session %s runs in the background (host pid %d, its output in %s)\n", termtext.Line(name), cmd.Process.Pid, termtext.Line(logPath))
			fmt.Fprintf(os.Stderr, "vibedom: vibedom attach %[1]s · vibedom status %[1]s · vibedom stop %[1]s\n", termtext.Line(name))
			return nil
		case strings.HasPrefix(line, errorPrefix):
			<-exited
			return errors.New(strings.TrimPrefix(line, errorPrefix))
		case !quiet:
			fmt.Fprintln(os.Stderr, termtext.Line(line))
		}
	}
	err = <-exited
	return fmt.Errorf("the session host exited while starting (%v): see %s", err, logPath)
}

// hostArgs are the arguments of `vibedom run` without --detach and --json.
func hostArgs(args []string) []string {
	var out []string
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		switch a {
		case "--detach", "-d", "--detach=true", "--json", "--json=true":
			continue
		}
		out = append(out, a)
	}
	return out
}

// runHost is the detached session host: no terminal, progress and
// readiness to the parent over fd 3, SIGINT and SIGTERM ask the session to
// stop (its changes are collected) rather than abandon it.
func runHost(o session.Options) error {
	ready := os.NewFile(3, "ready")
	if ready == nil {
		return errors.New("the session host needs its readiness pipe")
	}
	o.Name = os.Getenv(envHostName)
	if m := os.Getenv(envHostPreflight); m != "" {
		mode, err := preflight.ParseMode(m)
		if err != nil {
			return err
		}
		o.Preflight.Mode = mode
	}
	o.Detached, o.Terminal = true, nil
	o.Stdin = strings.NewReader("")
	o.Stdout, o.Stderr = os.Stdout, os.Stderr
	prog := &switchWriter{w: ready}
	o.Progress = prog
	var readyOnce sync.Once
	o.Ready = func(name string) {
		readyOnce.Do(func() {
			prog.set(os.Stderr)
			fmt.Fprintf(ready, "%s%s\n", readyPrefix, name)
			ready.Close()
		})
	}
	// The first SIGINT or SIGTERM asks the session to stop; while it
	// collects, the next two warn and then abort (session.Options.Interrupts).
	o.Interrupts = interrupts()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	res, err := session.Run(context.Background(), o)
	if err != nil {
		readyOnce.Do(func() {
			fmt.Fprintf(ready, "%s%s\n", errorPrefix, strings.ReplaceAll(err.Error(), "\n", " "))
			ready.Close()
		})
		return err
	}
	return exitCode(res.ExitCode)
}

// switchWriter writes to w, which can be changed.
type switchWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *switchWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *switchWriter) set(w io.Writer) {
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
}
