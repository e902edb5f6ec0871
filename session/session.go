package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vibedom/vibedom/guest/client"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
)

// ReviewOptions says what happens to the agent's changes when the session
// ends.
type ReviewOptions struct {
	// Skip leaves the changes in the guest: no patch is built.
	Skip bool
	// ApplyAll applies every change without asking (--apply).
	ApplyAll bool
	// Color enables ANSI colors in the summary and the diff.
	Color bool
	// Pager overrides $PAGER for the [r]eview choice.
	Pager string
}

// maxChangeSet bounds the change set JSON the host accepts from the guest.
const maxChangeSet = 64 << 20

// Run runs one session from start to end: preflight checks, boot, the
// command or shell, the change set and patch, the review prompt, and the
// shutdown. The returned Result is non-nil whenever the session folder was
// made, even on error.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	if len(o.Command) == 0 && o.Terminal == nil && (o.Agent == nil || (o.Agent.Name == AgentShell && len(o.Agent.Args) == 0)) {
		return nil, errors.New("no command given and this is not a terminal: pass the command after --, e.g. vibedom run PATH -- make test")
	}
	s := &sess{opts: o}
	start := time.Now()
	res, err := s.run(ctx, start)
	if cerr := s.cleanup.run(); cerr != nil {
		if s.log != nil {
			s.log.Warn("cleanup", "err", cerr)
		}
		err = errors.Join(err, cerr)
	}
	if s.dir != "" {
		s.state.Ended = time.Now().UTC().Truncate(time.Second)
		if err != nil {
			s.state.Status = StatusFailed
			s.state.Error = err.Error()
		} else {
			s.state.Status = StatusStopped
		}
		s.saveState()
	}
	return res, err
}

func (s *sess) run(ctx context.Context, start time.Time) (*Result, error) {
	o := &s.opts
	if err := s.prepare(ctx); err != nil {
		return s.result(), err
	}
	s.timings.Prepare = time.Since(start)
	if err := s.boot(ctx); err != nil {
		return s.result(), err
	}
	s.timings.Total = time.Since(start)
	if len(o.Command) == 0 {
		s.progress("ready in %.1fs; attaching a shell in %s (exit it to end the session)", s.timings.Total.Seconds(), proto.WorkDir)
	} else {
		s.progress("ready in %.1fs", s.timings.Total.Seconds())
	}

	code, err := s.runAgent(ctx)
	res := s.result()
	res.ExitCode = code
	s.state.ExitCode = &code
	if err != nil {
		return res, err
	}

	// The rest must happen even when the user interrupted the command.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	var info *overlay.PatchInfo
	if !o.Review.Skip {
		s.progress("collecting the agent's changes")
		info, err = s.collectChanges(ectx)
		if err != nil {
			return res, fmt.Errorf("collect the agent's changes (the VM's scratch disk is kept in %s): %w", s.dir, err)
		}
	}
	s.state.Status = StatusStopping
	s.saveState()
	if err := s.stopMachine(); err != nil {
		s.log.Warn("stop the VM", "err", err)
	}
	if info != nil {
		if err := s.review(ectx); err != nil {
			return res, err
		}
	}
	return res, nil
}

func (s *sess) result() *Result {
	return &Result{Name: s.name, SessionDir: s.dir, LogDir: s.logDir, Timings: s.timings}
}

// runAgent runs the command (no TTY) or the interactive shell and returns
// its shell-style exit code.
func (s *sess) runAgent(ctx context.Context) (int, error) {
	o := &s.opts
	var st client.ExitStatus
	var err error
	if err := s.copyAgentSettings(ctx); err != nil {
		return 0, err
	}
	if len(o.Command) > 0 && !(s.agentTTY && o.Terminal != nil) {
		s.log.Info("exec", "argv", o.Command)
		in, stop := newInput(o.Stdin)
		st, err = s.client.Exec(ctx, "exec "+shellQuote(o.Command), client.ExecOptions{
			Stdin: in, Stdout: o.Stdout, Stderr: o.Stderr, Env: s.userEnv(),
		})
		stop()
	} else {
		if o.Terminal == nil {
			return 0, errors.New("no command given and this is not a terminal: pass the command after --, e.g. vibedom run PATH -- make test")
		}
		st, err = s.shell(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return 130, fmt.Errorf("interrupted: %w", ctx.Err())
		}
		return 0, fmt.Errorf("run in the guest: %w", err)
	}
	s.log.Info("agent exited", "code", st.Code, "signal", st.Signal)
	return st.ShellCode(), nil
}

// userEnv says where the user's command runs: inside the root image, as
// its agent user or (AsRoot) as root. Nil for the Debian test image.
func (s *sess) userEnv() map[string]string {
	if s.rootImage == "" {
		return nil
	}
	as := proto.RunAsAgent
	if s.opts.AsRoot {
		as = proto.RunAsRoot
	}
	env := map[string]string{proto.RunAsVar: as}
	if a := s.opts.Agent; a != nil {
		for k, v := range agentEnvFor(a.Name) {
			env[k] = v
		}
	}
	return env
}

// shell attaches the user's terminal to a PTY shell in the guest.
func (s *sess) shell(ctx context.Context) (client.ExitStatus, error) {
	t := s.opts.Terminal
	size := t.Size()
	restore, err := t.MakeRaw()
	if err != nil {
		return client.ExitStatus{}, fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	defer restore()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resizes := make(chan client.WindowSize, 1)
	go func() {
		defer close(resizes)
		for ws := range t.Resizes(rctx) {
			select {
			case resizes <- client.WindowSize{Cols: ws.Cols, Rows: ws.Rows}:
			case <-rctx.Done():
				return
			}
		}
	}()
	in, stop := newInput(t.In)
	defer stop()
	var command string
	if len(s.opts.Command) > 0 {
		command = "exec " + shellQuote(s.opts.Command)
	}
	return s.client.Shell(ctx, client.ShellOptions{
		Term: TermName(), Cols: size.Cols, Rows: size.Rows, Resize: resizes,
		Stdin: in, Stdout: t.Out, Env: s.userEnv(), Command: command,
	})
}

// collectChanges streams the overlay's change set and the changed files'
// content from the guest (one command, one channel: see collect) and builds
// the session's patch from them.
func (s *sess) collectChanges(ctx context.Context) (*overlay.PatchInfo, error) {
	var info *overlay.PatchInfo
	lim := collectLimits{MaxFile: maxCollectFile, MaxTotal: s.opts.ScratchSize}
	err := collect(ctx, s.client, lim, func(cs *overlay.ChangeSet, src overlay.Source) error {
		var err error
		info, err = overlay.WriteSessionPatch(ctx, s.dir, cs, src, s.log)
		if err == nil {
			s.log.Info("patch written", "changes", len(cs.Changes), "files", len(info.Files), "not_carried", len(info.NotCarried))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return info, nil
}

// review runs the review prompt on the session's patch.
func (s *sess) review(ctx context.Context) error {
	o := &s.opts
	ro := review.Options{
		Apply:    overlay.ApplyOptions{Workspace: o.Workspace, SessionDir: s.dir},
		ApplyAll: o.Review.ApplyAll,
		Color:    o.Review.Color,
		Pager:    o.Review.Pager,
	}
	if o.Terminal != nil {
		ro.In, ro.Out, ro.TTY = o.Terminal.In, o.Terminal.Out, true
	} else {
		ro.In, ro.Out = o.Stdin, o.Stderr
	}
	outcome, _, err := review.Run(ctx, ro)
	if err != nil {
		return fmt.Errorf("review (the patch is kept: vibedom review %s): %w", s.name, err)
	}
	s.log.Info("review", "outcome", outcome)
	return nil
}

// limitedBuffer fails writes past max bytes instead of growing without
// bound on hostile guest output.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.buf.Len()+len(p) > l.max {
		return 0, fmt.Errorf("guest output exceeds %d bytes", l.max)
	}
	return l.buf.Write(p)
}
