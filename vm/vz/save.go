package vz

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// Pausing to disk, decided here in plain Go and carried out by the darwin
// file: which machines can be saved, the order of pause, save and stop and
// what is undone when a step fails, and the machine identity that makes a
// restored machine the same machine.

// minSaveRestoreMacOS is the first macOS whose Virtualization.framework can
// save and restore a machine.
const minSaveRestoreMacOS = 14

// maxMachineID bounds Config.MachineID. The framework's data representation
// of a generic machine identifier is a small property list (well under
// 1 KiB); anything far larger is not one.
const maxMachineID = 4096

// checkMachineIDSize refuses an identity that cannot be one the framework
// made.
func checkMachineIDSize(id []byte) error {
	if len(id) > maxMachineID {
		return invalid("machine identity is %d bytes, more than the %d a Virtualization.framework identifier takes", len(id), maxMachineID)
	}
	return nil
}

// acceptedMachineID checks what the framework made of the identity the plan
// gave (given; empty when the framework was asked for a new one) and
// returns the identity the machine has, as a copy: the framework's bytes
// live in an Objective-C object. An identity the framework could not read
// comes back empty or different.
func acceptedMachineID(given, got []byte) ([]byte, error) {
	switch {
	case len(got) == 0 && len(given) > 0:
		return nil, invalid("machine identity (%d bytes) is not one Virtualization.framework made: pass the bytes a vz machine's MachineID reported, or none for a new identity", len(given))
	case len(got) == 0:
		return nil, errors.New("Virtualization.framework made an empty machine identifier")
	case len(given) > 0 && !bytes.Equal(given, got):
		return nil, invalid("Virtualization.framework read the machine identity as different bytes: pass exactly what a vz machine's MachineID reported")
	}
	return bytes.Clone(got), nil
}

// checkSaveRestoreOS reports whether macOS product version product can save
// and restore machines; the error wraps vm.ErrNotSupported.
func checkSaveRestoreOS(product string) error {
	major, _, err := parseMacOSVersion(product)
	if err != nil {
		return fmt.Errorf("%w: pausing to disk: %v", vm.ErrNotSupported, err)
	}
	if major < minSaveRestoreMacOS {
		return fmt.Errorf("%w: pausing to disk needs macOS %d or later, this Mac runs %s: update macOS, or pause in memory",
			vm.ErrNotSupported, minSaveRestoreMacOS, product)
	}
	return nil
}

// saveProblem reports what in the plan stops a machine from being saved
// and restored as the same machine, wrapping vm.ErrNotSupported.
func (p plan) saveProblem() error {
	if p.network != nil && p.mac == nil {
		return fmt.Errorf("%w: pausing to disk needs a fixed network MAC (Config.Network.MAC): the backend chose a random one, which a restored machine would not get", vm.ErrNotSupported)
	}
	return nil
}

// restoreProblem reports what in the plan stops a restore: what stops a
// save, or no machine identity.
func (p plan) restoreProblem() error {
	if len(p.machineID) == 0 {
		return invalid("restore needs the saved machine's identity (Config.MachineID)")
	}
	return p.saveProblem()
}

// checkSavePath reports whether a state file may be written at path: its
// folder exists and nothing is there yet (the framework is given a fresh
// path, and an old state must not be mistaken for the new one).
func checkSavePath(path string) error {
	if path == "" {
		return fmt.Errorf("save state: no path given")
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return fmt.Errorf("save state to %s: its folder does not exist", path)
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("save state to %s: the file exists; remove it first", path)
	}
	return nil
}

// checkRestorePath reports whether path holds a state file to restore.
func checkRestorePath(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: restore: %w", vm.ErrInvalidConfig, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return invalid("restore: %s is not a saved state file", path)
	}
	return nil
}

// lockFunc takes the host's save/restore lock and returns its release.
type lockFunc func(ctx context.Context) (release func(), err error)

// hostLock is the lockFunc of the lock file at path.
func hostLock(path string) lockFunc {
	return func(ctx context.Context) (func(), error) {
		return vm.AcquireSaveLock(ctx, path, vm.SaveLockWait)
	}
}

// saveOps is what saveState does to a machine; the darwin file maps each to
// a Virtualization.framework call. None of them can be abandoned halfway,
// so none takes a context.
type saveOps interface {
	state() hvState
	pause() error
	resume() error
	save(path string) error
	stop() error // stops a paused machine whose state was saved
}

// saveState pauses a running machine, writes its state to path and stops
// it, holding the host lock throughout. ctx bounds the wait for the lock
// only: once the framework saves, it is let finish. When a step fails,
// what was done is undone: the partial file is removed and a machine that
// was running runs again.
func saveState(ctx context.Context, ops saveOps, path string, lock lockFunc) error {
	if err := checkSavePath(path); err != nil {
		return err
	}
	release, err := lock(ctx)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer release()
	wasRunning := false
	switch s := ops.state(); s {
	case hvRunning:
		wasRunning = true
		if err := ops.pause(); err != nil {
			return fmt.Errorf("save state: pause: %w", err)
		}
	case hvPaused:
	default:
		return fmt.Errorf("save state: machine is %s: %w", hvStateName(s), vm.ErrNotRunning)
	}
	undo := func(step string, err error) error {
		err = fmt.Errorf("save state: %s: %w", step, err)
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("remove the partial state file: %w", rmErr))
		}
		if wasRunning {
			if rerr := ops.resume(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume after the failed save: %w", rerr))
			}
		}
		return err
	}
	if err := ops.save(path); err != nil {
		return undo("write "+path, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		return undo("check "+path, fmt.Errorf("the framework reported success but wrote no state (%v)", err))
	}
	if err := ops.stop(); err != nil {
		return undo("stop after saving", err)
	}
	return nil
}

// restoreState loads path into a stopped machine under the host lock and
// reports how long the framework took. ctx bounds the wait for the lock;
// a restore under way is let finish, and a ctx that ended meanwhile is
// reported as its error so the caller tears the machine down.
func restoreState(ctx context.Context, path string, lock lockFunc, restore func(path string) error) (time.Duration, error) {
	release, err := lock(ctx)
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	defer release()
	t0 := time.Now()
	if err := restore(path); err != nil {
		return time.Since(t0), fmt.Errorf("restore from %s: Virtualization.framework refused it (saved by another macOS version, or for another configuration?): start afresh: %w", path, err)
	}
	took := time.Since(t0)
	if err := ctx.Err(); err != nil {
		return took, fmt.Errorf("restore from %s: %w", path, err)
	}
	return took, nil
}

// hvStateName names a hypervisor state for messages.
func hvStateName(s hvState) string {
	names := map[hvState]string{
		hvStopped: "stopped", hvRunning: "running", hvPaused: "paused", hvError: "in error",
		hvStarting: "starting", hvPausing: "pausing", hvResuming: "resuming", hvStopping: "stopping",
		hvSaving: "saving", hvRestoring: "restoring",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return fmt.Sprintf("in state %d", int(s))
}
