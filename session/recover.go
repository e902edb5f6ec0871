package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/vm"
	"github.com/vibedom/vibedom/wstrust"
)

// Crash recovery: when a session's host dies (kill -9, a host reboot, power
// loss) the agent's work is still on the session's scratch disk. Recover
// boots a rescue VM on it — no network, the workspace read-only, nothing of
// the agent's started — collects the change set as a session end does, and
// brings it to the review prompt.

// recoverLock is the lock file in a session folder that serialises
// recoveries.
const recoverLock = ".recover.lock"

// RecoverOptions configure a recovery.
type RecoverOptions struct {
	Home home.Home
	// Name is the crashed session.
	Name string
	// Driver runs the rescue VM; nil picks the platform's default.
	Driver vm.Driver
	// Terminal, when set, hosts the review prompt; otherwise the patch
	// waits for `vibedom review NAME`.
	Terminal *Terminal
	// Progress receives one human line per step; nil is quiet.
	Progress io.Writer
	// Review decides what happens to the changes.
	Review ReviewOptions
	// MemoryMiB sizes the rescue VM; zero means 512.
	MemoryMiB int
	// Interrupts and CollectIdle: as in Options.
	Interrupts  <-chan os.Signal
	CollectIdle time.Duration
}

// ErrNotRecoverable means the session has nothing to recover or is not in
// a state to be recovered.
var ErrNotRecoverable = errors.New("cannot recover")

// Recover collects a crashed session's changes from its scratch disk.
func Recover(ctx context.Context, ro RecoverOptions) (*Result, error) {
	if ro.Home == "" {
		h, err := home.Default()
		if err != nil {
			return nil, err
		}
		ro.Home = h
	}
	info, err := FindSession(ro.Home, ro.Name)
	if err != nil {
		return nil, err
	}
	// One recovery at a time: a second would boot on the same scratch
	// disk and race the first one's state.
	unlock, busy, err := tryLock(filepath.Join(info.Dir, recoverLock))
	if err != nil {
		return nil, err
	}
	if busy {
		return nil, fmt.Errorf("%w: another `vibedom recover %s` is running", ErrNotRecoverable, info.Name)
	}
	defer unlock()
	// Read again under the lock: a recovery that just ended changed it.
	if info, err = FindSession(ro.Home, ro.Name); err != nil {
		return nil, err
	}
	switch {
	case info.Live == StatusCrashed:
	case info.Live.live():
		return nil, fmt.Errorf("%w: session %s is %s: `vibedom stop %s` ends it and collects its changes", ErrNotRecoverable, info.Name, info.Live, info.Name)
	case info.Live != StatusFailed:
		return nil, fmt.Errorf("%w: session %s is %s, not crashed (`vibedom review %s` shows what it left)", ErrNotRecoverable, info.Name, info.Live, info.Name)
	}
	if !info.Recoverable() {
		return nil, fmt.Errorf("%w: session %s has no scratch disk left (%s): its work is gone", ErrNotRecoverable, info.Name, filepath.Join(info.Dir, scratchFile))
	}
	if info.PatchPending() {
		return nil, fmt.Errorf("%w: session %s already has a patch waiting: `vibedom review %s` (remove %s to collect again)", ErrNotRecoverable, info.Name, info.Name, filepath.Join(info.Dir, overlay.PatchFileName))
	}
	// What a host killed mid-write left: temporary files of an atomic
	// write that never committed.
	removeStaleTemps(info.Dir)
	if err := checkOwnFolders(ro.Home, info); err != nil {
		return nil, err
	}
	o := Options{
		Home: ro.Home, Workspace: info.Workspace, Name: info.Name, Driver: ro.Driver, Arch: vm.Arch(info.Arch),
		CPUs: 1, MemoryMiB: ro.MemoryMiB, Terminal: ro.Terminal, Progress: ro.Progress, Review: ro.Review,
		Stderr: ro.Progress, Interrupts: ro.Interrupts, CollectIdle: ro.CollectIdle,
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	s := &sess{opts: o, ctl: newHostCtl(), ctlUID: os.Getuid(), name: info.Name, dir: info.Dir, state: info.State}
	done := make(chan struct{})
	defer close(done)
	go s.watchInterrupts(done)
	res, err := s.recover(ctx, info)
	if cerr := s.cleanup.run(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	s.updateState(func(st *State) {
		st.Ended = time.Now().UTC().Truncate(time.Second)
		st.Control, st.PausedAt, st.PID, st.PIDStart = "", time.Time{}, 0, ""
		if err != nil {
			st.Status, st.Error = StatusFailed, "recovery: "+err.Error()
		} else {
			st.Status, st.Error = StatusStopped, ""
		}
	})
	return res, err
}

func (s *sess) recover(ctx context.Context, info *Info) (*Result, error) {
	o := &s.opts
	ws, err := wstrust.CheckWorkspace(info.Workspace)
	if err != nil {
		return nil, fmt.Errorf("%w (the session's workspace): the patch needs it", err)
	}
	if ws != info.Workspace {
		return nil, fmt.Errorf("%w: session %s's workspace %s now leads to %s: put the folder back where the session started", ErrNotRecoverable, info.Name, info.Workspace, ws)
	}
	if id := dirID(ws); info.WorkspaceID != "" && id != info.WorkspaceID {
		return nil, fmt.Errorf("%w: %s is not the folder session %s started on (it was replaced since): put that folder back", ErrNotRecoverable, ws, info.Name)
	}
	s.plan.workspace = ws
	// The dead host's runtime folder (sockets) is of no use now.
	if isRuntimeDir(info.Control) {
		_ = os.RemoveAll(filepath.Dir(info.Control))
	}
	s.plan.driver = o.Driver
	if s.plan.driver == nil {
		d, err := DefaultDriver(o.Home)
		if err != nil {
			return nil, err
		}
		s.plan.driver = d
	}
	if err := s.plan.driver.Available(ctx, o.Arch); err != nil {
		return nil, err
	}
	s.logDir = info.LogDir // checked by checkOwnFolders
	if err := os.Mkdir(s.logDir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create log folder: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(s.logDir, sessionLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open session log: %w", err)
	}
	s.cleanup.add("close session log", logf.Close)
	s.logRed = logredact.NewRedactHandler(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.log = slog.New(s.logRed).With("session", s.name)
	s.log.Info("recovery: rescue VM on the crashed session's scratch disk", "host_pid", info.PID)
	s.updateState(func(st *State) {
		st.Status, st.PID, st.PIDStart, st.Control = StatusRecovering, os.Getpid(), procStart(os.Getpid()), ""
	})

	s.runDir, err = os.MkdirTemp("", "vibedom-")
	if err != nil {
		return nil, fmt.Errorf("create runtime folder: %w", err)
	}
	s.cleanup.add("remove runtime folder", func() error { return os.RemoveAll(s.runDir) })

	// Any image boots the rescue: it runs only the guest agent's own
	// collection, in the initramfs, so the root image is not attached.
	choice, err := image.Choose(o.Home, o.Arch)
	if err != nil {
		return nil, err
	}
	s.progress("preparing the rescue VM for %s", s.name)
	if s.img, _, _, err = choice.Prepare(ctx, o.Home, o.Arch, testKeyring()); err != nil {
		return nil, fmt.Errorf("prepare the VM image: %w", err)
	}
	if s.keys, err = keys.NewSession(); err != nil {
		return nil, err
	}
	hostPEM, err := s.keys.HostKeyPEM()
	if err != nil {
		return nil, err
	}
	bc := &proto.BootConfig{
		Version: proto.Version, SessionID: s.name, Hostname: "vibedom-rescue",
		Control:        controlFor(s.plan.driver),
		Workspace:      proto.Workspace{Tag: workspaceTag, FSType: shareFSFor(s.plan.driver)},
		Scratch:        proto.Scratch{Device: "/dev/vda"},
		AuthorizedKeys: []string{s.keys.AuthorizedKey()},
	}
	files, err := image.SessionFiles(bc, hostPEM, nil)
	if err != nil {
		return nil, fmt.Errorf("session boot data: %w", err)
	}
	initrd := filepath.Join(s.dir, initrdFile)
	if err := image.WriteSessionInitrd(initrd, s.img, files); err != nil {
		return nil, fmt.Errorf("session initrd: %w", err)
	}
	s.cleanup.add("remove session initrd", func() error { return removeIfExists(initrd) })
	if err := s.boot(ctx); err != nil {
		return s.result(), err
	}
	s.progress("collecting the crashed session's changes")
	ectx := context.WithoutCancel(ctx)
	pinfo, err := s.collectChanges(ectx)
	if err != nil {
		return s.result(), fmt.Errorf("collect the changes (the scratch disk is kept: vibedom recover %s tries again): %w", s.name, err)
	}
	if err := s.stopMachine(); err != nil {
		s.log.Warn("stop the rescue VM", "err", err)
	}
	// Collected: the scratch disk has done its job.
	if err := removeIfExists(filepath.Join(s.dir, scratchFile)); err != nil {
		s.log.Warn("remove the scratch disk", "err", err)
	}
	if pinfo != nil && (o.Terminal != nil || o.Review.ApplyAll) {
		if err := s.review(ectx); err != nil {
			return s.result(), err
		}
	} else {
		s.progress("the changes wait for review: vibedom review %s", s.name)
	}
	return s.result(), nil
}

// isRuntimeDir reports whether control is the control socket in a runtime
// folder as a session host makes it (os.MkdirTemp("", "vibedom-")): a
// private folder of this user's, directly in the temporary folder. Only
// such a folder may be removed on state.json's word.
func isRuntimeDir(control string) bool {
	if control == "" || !filepath.IsAbs(control) || filepath.Base(control) != controlSocket {
		return false
	}
	dir := filepath.Dir(control)
	if !strings.HasPrefix(filepath.Base(dir), "vibedom-") || filepath.Dir(dir) != filepath.Clean(os.TempDir()) {
		return false
	}
	return checkPrivateDir(dir) == nil
}

// checkOwnFolders refuses a state.json whose log folder is not one of the
// home's own (logs/session-…, a real folder or absent), so a recovery
// creates and writes nothing outside the vibedom home.
func checkOwnFolders(hm home.Home, info *Info) error {
	ld := info.LogDir
	if ld == "" || !filepath.IsAbs(ld) || filepath.Clean(ld) != ld || filepath.Dir(ld) != filepath.Clean(hm.Logs()) ||
		!strings.HasPrefix(filepath.Base(ld), "session-") {
		return fmt.Errorf("%w: session %s records the log folder %q, which is not under %s", ErrNotRecoverable, info.Name, ld, hm.Logs())
	}
	if err := ensureDir(hm.Logs()); err != nil {
		return err
	}
	if fi, err := os.Lstat(ld); err == nil && !fi.IsDir() {
		return fmt.Errorf("%w: session %s's log folder %s is not a folder", ErrNotRecoverable, info.Name, ld)
	}
	return nil
}

// removeStaleTemps removes what an atomic write or a collection left in
// the session folder dir when its process died: ".NAME.tmp-*" files of
// the session's own files and ".collect-spool-*".
func removeStaleTemps(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		stale := strings.HasPrefix(n, ".collect-spool-")
		for _, f := range []string{overlay.PatchFileName, overlay.InfoFileName, stateFile} {
			stale = stale || strings.HasPrefix(n, "."+f+".tmp-")
		}
		if stale {
			_ = os.Remove(filepath.Join(dir, n))
		}
	}
}
