package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/guestlink"
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
	if !o.Detached && len(o.Command) == 0 && o.Terminal == nil && (o.Agent == nil || (o.Agent.Name == AgentShell && len(o.Agent.Args) == 0)) {
		return nil, errors.New("no command given and this is not a terminal: pass the command after --, e.g. vibedom run PATH -- make test")
	}
	s := &sess{opts: o, ctl: newHostCtl(), ctlUID: os.Getuid()}
	done := make(chan struct{})
	defer close(done)
	go s.watchInterrupts(done)
	start := time.Now()
	res, err := s.run(ctx, start)
	if err != nil && s.keepScratch.Load() && s.dir != "" {
		err = fmt.Errorf("%w; the agent's work is kept on the session's scratch disk: vibedom recover %s", err, s.name)
	}
	if cerr := s.cleanup.run(); cerr != nil {
		if s.log != nil {
			s.log.Warn("cleanup", "err", cerr)
		}
		err = errors.Join(err, cerr)
	}
	if s.dir != "" {
		s.updateState(func(st *State) {
			st.Ended = time.Now().UTC().Truncate(time.Second)
			st.Control, st.PausedAt = "", time.Time{}
			if err != nil {
				st.Status = StatusFailed
				st.Error = err.Error()
			} else {
				st.Status = StatusStopped
			}
		})
	}
	return res, err
}

func (s *sess) run(ctx context.Context, start time.Time) (*Result, error) {
	o := &s.opts
	if err := s.openPorts(); err != nil {
		return s.result(), err
	}
	if err := s.prepare(ctx); err != nil {
		return s.result(), err
	}
	s.timings.Prepare = time.Since(start)
	if err := s.boot(ctx); err != nil {
		return s.result(), err
	}
	s.timings.Total = time.Since(start)
	s.logTimings()
	if err := s.writeSandboxReadme(ctx); err != nil {
		s.log.Warn("the sandbox note", "err", err)
	}
	// Before the control socket serves: a vibedom exec may ask for the agent.
	if err := s.startSSHAgent(); err != nil {
		return s.result(), err
	}
	if err := s.startControl(); err != nil {
		return s.result(), err
	}
	s.startPorts()
	s.startBalloon()
	switch {
	case o.Detached:
		s.progress("ready in %.1fs", s.timings.Total.Seconds())
	case len(s.plan.command) == 0:
		s.progress("ready in %.1fs; attaching a shell in %s (exit it to end the session)", s.timings.Total.Seconds(), proto.WorkDir)
	default:
		s.progress("ready in %.1fs", s.timings.Total.Seconds())
	}

	if o.Ready != nil {
		o.Ready(s.name)
	}
	// From here the scratch disk may hold the agent's work: it stays until
	// the patch is written from a verified collection.
	s.keepScratch.Store(!o.Review.Skip)
	code, err := s.runAgent(ctx)
	res := s.result()
	res.ExitCode = code
	s.updateState(func(st *State) { st.ExitCode = &code })
	if err != nil {
		return res, err
	}
	s.windUp(ctx)

	// The rest must happen even when the user interrupted the command.
	ectx := context.WithoutCancel(ctx)
	var info *overlay.PatchInfo
	if !o.Review.Skip {
		s.progress("collecting the agent's changes")
		info, err = s.collectChanges(ectx)
		if err != nil {
			return res, fmt.Errorf("collect the agent's changes: %w", err)
		}
		s.keepScratch.Store(false)
	}
	s.updateState(func(st *State) { st.Status = StatusStopping })
	if err := s.stopMachine(); err != nil {
		s.log.Warn("stop the VM", "err", err)
	}
	if info != nil && o.Detached {
		s.log.Info("changes wait for review", "files", len(info.Files))
	} else if info != nil {
		if err := s.review(ectx); err != nil {
			return res, err
		}
	}
	return res, nil
}

// windUp readies the session for collecting once its agent ended: a
// paused VM cannot hand its changes over, so it is thawed; and from now on
// the session is stopping, so no control request pauses it again (or runs
// a command in it) while its changes are collected.
func (s *sess) windUp(ctx context.Context) {
	if s.stopBalloon != nil {
		s.stopBalloon() // the agent is done: nothing to steer the memory for
	}
	s.ctl.mu.Lock()
	defer s.ctl.mu.Unlock()
	if s.ctl.paused {
		if _, err := s.resumeLocked(context.WithoutCancel(ctx)); err != nil {
			s.log.Warn("resume before collecting", "err", err)
		}
	}
	s.ctl.requestStop()
}

func (s *sess) result() *Result {
	return &Result{Name: s.name, SessionDir: s.dir, LogDir: s.logDir, Timings: s.timings}
}

// runAgent runs the command (no TTY) or the interactive shell and returns
// its shell-style exit code.
func (s *sess) runAgent(ctx context.Context) (int, error) {
	o := &s.opts
	var st guestlink.ExitStatus
	var err error
	if err := s.copyAgentSettings(ctx); err != nil {
		return 0, err
	}
	if err := s.copyLoginFiles(); err != nil {
		return 0, err
	}
	if err := s.writeSandboxNotes(ctx); err != nil {
		s.log.Warn("the sandbox note", "err", err)
	}
	// A stop request from the control socket ends the agent: a hang-up on
	// its terminal (or SIGTERM for a command without one), then, if it
	// still runs 10 seconds later, the session goes on without it (the
	// poweroff ends it).
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan ssh.Signal, 1)
	go func() {
		select {
		case <-s.ctl.stopReq:
		case <-actx.Done():
			return
		}
		s.log.Info("stop requested: ending the agent")
		sig := stopSignal
		if !s.keptMode() {
			sig = ssh.SIGTERM
		}
		select {
		case sigs <- sig:
		default:
		}
		t := time.NewTimer(10 * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-actx.Done():
		}
	}()
	switch {
	case s.keptMode():
		s.updateState(func(st *State) { st.Agent = s.agentLabel() })
		ko := s.keptOptions()
		ko.Signals = sigs
		if o.Detached {
			st, err = s.client.Shell(actx, ko)
		} else {
			st, err = s.shell(actx, ko)
		}
	case len(s.plan.command) > 0:
		s.log.Info("exec", "argv", s.plan.command)
		in, stop := newInput(o.Stdin)
		st, err = s.client.Exec(actx, "exec "+shellQuote(s.plan.command), guestlink.ExecOptions{
			Stdin: in, Stdout: o.Stdout, Stderr: o.Stderr, Env: s.userEnv(), Signals: sigs,
			ForwardAgent: o.SSHAgent.Enabled,
		})
		stop()
	default:
		return 0, errors.New("no command given and this is not a terminal: pass the command after --, e.g. vibedom run PATH -- make test")
	}
	if err != nil {
		if ctx.Err() != nil {
			return 130, fmt.Errorf("interrupted: %w", ctx.Err())
		}
		if s.ctl.stopRequested() {
			s.log.Info("the agent did not end when asked; stopping without it")
			return 143, nil
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
		for k, v := range agents.Env(a.Name) {
			env[k] = v
		}
	}
	return env
}

// keptMode reports whether the agent runs on a kept terminal (a detached
// session, or a shell or agent on the user's terminal), which `vibedom
// attach` can join.
func (s *sess) keptMode() bool {
	o := &s.opts
	return o.Detached || (o.Terminal != nil && (len(s.plan.command) == 0 || s.agentTTY))
}

// agentLabel says what runs on the kept terminal, for status and list.
func (s *sess) agentLabel() string {
	switch {
	case s.opts.Agent != nil:
		return s.opts.Agent.Name
	case len(s.plan.command) > 0:
		return "command"
	}
	return AgentShell
}

// shell attaches the user's terminal to the agent's kept terminal in the
// guest.
func (s *sess) shell(ctx context.Context, ko guestlink.ShellOptions) (guestlink.ExitStatus, error) {
	t := s.opts.Terminal
	size := t.Size()
	restore, err := t.MakeRaw()
	if err != nil {
		return guestlink.ExitStatus{}, fmt.Errorf("put the terminal in raw mode: %w", err)
	}
	defer restore()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resizes := make(chan guestlink.WindowSize, 1)
	go func() {
		defer close(resizes)
		for ws := range t.Resizes(rctx) {
			select {
			case resizes <- guestlink.WindowSize{Cols: ws.Cols, Rows: ws.Rows}:
			case <-rctx.Done():
				return
			}
		}
	}()
	out, unnotice := s.noticeOut(t.Out)
	defer unnotice()
	ko.Cols, ko.Rows, ko.Resize, ko.Stdout = size.Cols, size.Rows, resizes, out
	for {
		in, stop := newInput(t.In)
		ko.Stdin = in
		st, err := s.client.Shell(ctx, ko)
		stop()
		if !errors.Is(err, guestlink.ErrNoExitStatus) || ctx.Err() != nil {
			return st, err
		}
		// The guest detached this terminal, which fell behind the
		// agent's output (a slow terminal): the agent goes on, so join
		// it again. If the VM is gone, joining fails.
		s.log.Warn("the terminal fell behind the agent's output; attaching it again")
		select {
		case <-ctx.Done():
			return st, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// collectChanges streams the overlay's change set and the changed files'
// content from the guest (one command, one channel: see collect) and builds
// the session's patch from them.
//
// It runs until the stream ends, the guest stalls (see collectLimits.Idle)
// or the user interrupts twice (see interrupt); only a verified stream
// leaves a patch.
func (s *sess) collectChanges(ctx context.Context) (*overlay.PatchInfo, error) {
	return s.collectFrom(ctx, s.client)
}

// collectFrom is collectChanges from g.
func (s *sess) collectFrom(ctx context.Context, g guestExec) (*overlay.PatchInfo, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.intrMu.Lock()
	s.collecting, s.presses = cancel, 0
	s.intrMu.Unlock()
	defer func() {
		s.intrMu.Lock()
		s.collecting = nil
		s.intrMu.Unlock()
	}()
	var info *overlay.PatchInfo
	lim := collectLimits{MaxFile: maxCollectFile, MaxTotal: s.opts.ScratchSize, Idle: s.opts.CollectIdle, SpoolDir: s.dir}
	err := collect(ctx, g, lim, func(cs *overlay.ChangeSet, src overlay.Source) error {
		var err error
		info, err = overlay.WriteSessionPatch(ctx, s.dir, cs, src, s.log)
		if err == nil {
			s.log.Info("patch written", "changes", len(cs.Changes), "files", len(info.Files), "not_carried", len(info.NotCarried))
		}
		return err
	})
	if err != nil {
		if info != nil {
			// The stream verified and the patch was written, but the guest's
			// collector then failed: a failed session leaves no patch.
			removeIfExists(filepath.Join(s.dir, overlay.PatchFileName))
			removeIfExists(filepath.Join(s.dir, overlay.InfoFileName))
		}
		return nil, err
	}
	return info, nil
}

// watchInterrupts serves Options.Interrupts until done closes: see
// interrupt.
func (s *sess) watchInterrupts(done <-chan struct{}) {
	stop := s.opts.Stop
	for {
		select {
		case <-stop:
			s.ctl.requestStop()
			stop = nil
		case <-s.opts.Interrupts:
			s.interrupt()
		case <-done:
			return
		}
	}
}

// interrupt is one Ctrl-C (or SIGINT/SIGTERM to a detached host). Before
// the collection it asks the session to stop, as `vibedom stop` does.
// While collecting, the first says what a second does; the second aborts
// the collection, which keeps the scratch disk for `vibedom recover`.
func (s *sess) interrupt() {
	s.intrMu.Lock()
	defer s.intrMu.Unlock()
	if s.collecting == nil {
		s.ctl.requestStop()
		return
	}
	s.presses++
	if s.presses == 1 {
		s.progress("collecting the agent's changes; press Ctrl-C again to abort and keep the scratch disk for vibedom recover %s", s.name)
		return
	}
	s.progress("aborting the collection; the scratch disk is kept: vibedom recover %s", s.name)
	s.collecting(ErrCollectAborted)
}

// review runs the review prompt on the session's patch.
func (s *sess) review(ctx context.Context) error {
	o := &s.opts
	ro := review.Options{
		Apply:    overlay.ApplyOptions{Workspace: s.plan.workspace, SessionDir: s.dir},
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
