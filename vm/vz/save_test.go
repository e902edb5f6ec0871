package vz

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/vm"
)

// fakeFramework stands in for Virtualization.framework's identifier: it
// makes a new identity when given none and reads back what it is given,
// as the darwin file's platformConfig asks it to.
type fakeFramework struct{ made int }

func (f *fakeFramework) identify(given []byte) []byte {
	if len(given) == 0 {
		f.made++
		return []byte("bplist00-identity-" + string(rune('0'+f.made)))
	}
	return bytes.Clone(given)
}

func TestMachineIDPersistence(t *testing.T) {
	fw := &fakeFramework{}

	t.Run("given identity is used exactly", func(t *testing.T) {
		cfg := fixture(t)
		cfg.MachineID = []byte("bplist00-saved")
		p, err := newPlan(cfg, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MachineID[0] = 'X' // the plan holds its own copy
		if string(p.machineID) != "bplist00-saved" {
			t.Fatalf("plan identity %q, want %q", p.machineID, "bplist00-saved")
		}
		id, err := acceptedMachineID(p.machineID, fw.identify(p.machineID))
		if err != nil || string(id) != "bplist00-saved" || fw.made != 0 {
			t.Errorf("accepted %q, %v (made %d); want the given identity and none made", id, err, fw.made)
		}
	})

	t.Run("without one, the new identity is reported and reused", func(t *testing.T) {
		cfg := fixture(t)
		p, err := newPlan(cfg, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.machineID) != 0 {
			t.Fatalf("plan identity %q, want none", p.machineID)
		}
		reported, err := acceptedMachineID(p.machineID, fw.identify(p.machineID))
		if err != nil || len(reported) == 0 {
			t.Fatalf("accepted %q, %v; want a new identity", reported, err)
		}
		// The caller keeps what the machine reported and passes it back.
		cfg.MachineID = reported
		p2, err := newPlan(cfg, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		made := fw.made
		again, err := acceptedMachineID(p2.machineID, fw.identify(p2.machineID))
		if err != nil || !bytes.Equal(again, reported) || fw.made != made {
			t.Errorf("next plan: %q, %v; want %q again, none made", again, err, reported)
		}
	})
}

func TestAcceptedMachineID(t *testing.T) {
	tests := []struct {
		name       string
		given, got []byte
		want       []byte
		wantErr    error // nil: success; errNone: any error
	}{
		{"new", nil, []byte("id"), []byte("id"), nil},
		{"given, read back", []byte("id"), []byte("id"), []byte("id"), nil},
		{"given, unreadable", []byte("garbage"), nil, nil, vm.ErrInvalidConfig},
		{"given, read differently", []byte("id"), []byte("other"), nil, vm.ErrInvalidConfig},
		{"framework made nothing", nil, nil, nil, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := acceptedMachineID(tt.given, tt.got)
			switch {
			case tt.wantErr == nil && (err != nil || !bytes.Equal(got, tt.want)):
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			case tt.wantErr == errAny && err == nil, tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Errorf("got %q, %v; want an error wrapping %v", got, err, tt.wantErr)
			}
			if err == nil && len(tt.got) > 0 && &got[0] == &tt.got[0] {
				t.Errorf("identity shares the framework's bytes; want a copy")
			}
		})
	}
}

// errAny in a table means "some error".
var errAny = errors.New("any error")

func TestPlanMachineIDSize(t *testing.T) {
	cfg := fixture(t)
	cfg.MachineID = make([]byte, maxMachineID+1)
	if _, err := newPlan(cfg, testLimits); !errors.Is(err, vm.ErrInvalidConfig) {
		t.Errorf("newPlan with a %d-byte identity: got %v, want ErrInvalidConfig", len(cfg.MachineID), err)
	}
}

func TestSaveRestoreProblems(t *testing.T) {
	a := os.Stdin // the plan does not look at the socket itself
	tests := []struct {
		name        string
		modify      func(c *vm.Config)
		save, restr error // nil: allowed
	}{
		{"no network, with identity", func(c *vm.Config) { c.MachineID = []byte("id") }, nil, nil},
		{"no identity", func(c *vm.Config) {}, nil, vm.ErrInvalidConfig},
		{"fixed MAC", func(c *vm.Config) {
			c.MachineID = []byte("id")
			c.Network = &vm.Network{Conn: a, MAC: "02:76:64:00:00:02"}
		}, nil, nil},
		{"random MAC", func(c *vm.Config) {
			c.MachineID = []byte("id")
			c.Network = &vm.Network{Conn: a}
		}, vm.ErrNotSupported, vm.ErrNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fixture(t)
			tt.modify(&cfg)
			p, err := newPlan(cfg, testLimits)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.saveProblem(); !errors.Is(err, tt.save) || (tt.save == nil) != (err == nil) {
				t.Errorf("saveProblem: got %v, want %v", err, tt.save)
			}
			if err := p.restoreProblem(); !errors.Is(err, tt.restr) || (tt.restr == nil) != (err == nil) {
				t.Errorf("restoreProblem: got %v, want %v", err, tt.restr)
			}
		})
	}
}

func TestCheckSaveRestoreOS(t *testing.T) {
	for _, v := range []string{"14.0", "14.4.1", "15.1", "26.0"} {
		if err := checkSaveRestoreOS(v); err != nil {
			t.Errorf("macOS %s: %v", v, err)
		}
	}
	for _, v := range []string{"13.6.1", "12.7", "", "x"} {
		err := checkSaveRestoreOS(v)
		if !errors.Is(err, vm.ErrNotSupported) {
			t.Errorf("macOS %q: got %v, want ErrNotSupported", v, err)
		}
	}
	if err := checkSaveRestoreOS("13.6"); !strings.Contains(err.Error(), "macOS 14") {
		t.Errorf("macOS 13.6: %q does not say what is needed", err)
	}
}

// fakeOps records saveState's steps on a pretend machine.
type fakeOps struct {
	st                         hvState
	steps                      []string
	pauseErr, saveErr, stopErr error
	resumeErr                  error
	writes                     []byte // what save writes
}

func (o *fakeOps) state() hvState { return o.st }
func (o *fakeOps) pause() error {
	o.steps = append(o.steps, "pause")
	if o.pauseErr == nil {
		o.st = hvPaused
	}
	return o.pauseErr
}
func (o *fakeOps) resume() error {
	o.steps = append(o.steps, "resume")
	if o.resumeErr == nil {
		o.st = hvRunning
	}
	return o.resumeErr
}
func (o *fakeOps) save(path string) error {
	o.steps = append(o.steps, "save")
	if o.writes != nil {
		os.WriteFile(path, o.writes, 0o600)
	}
	return o.saveErr
}
func (o *fakeOps) stop() error {
	o.steps = append(o.steps, "stop")
	if o.stopErr == nil {
		o.st = hvStopped
	}
	return o.stopErr
}

// fakeLock records whether it is held.
type fakeLock struct {
	held, taken int
	err         error
}

func (l *fakeLock) lock(context.Context) (func(), error) {
	if l.err != nil {
		return nil, l.err
	}
	l.held++
	l.taken++
	return func() { l.held-- }, nil
}

func TestSaveState(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		ops       fakeOps
		lockErr   error
		exists    bool
		want      []string
		wantErr   error // nil: success; errAny: some error
		wantState hvState
		wantFile  bool
	}{
		{name: "running", ops: fakeOps{st: hvRunning, writes: []byte("mem")},
			want: []string{"pause", "save", "stop"}, wantState: hvStopped, wantFile: true},
		{name: "paused", ops: fakeOps{st: hvPaused, writes: []byte("mem")},
			want: []string{"save", "stop"}, wantState: hvStopped, wantFile: true},
		{name: "stopped", ops: fakeOps{st: hvStopped},
			wantErr: vm.ErrNotRunning, wantState: hvStopped},
		{name: "pause fails", ops: fakeOps{st: hvRunning, pauseErr: boom},
			want: []string{"pause"}, wantErr: boom, wantState: hvRunning},
		{name: "save fails, running again", ops: fakeOps{st: hvRunning, writes: []byte("partial"), saveErr: boom},
			want: []string{"pause", "save", "resume"}, wantErr: boom, wantState: hvRunning},
		{name: "save fails, stays paused", ops: fakeOps{st: hvPaused, saveErr: boom},
			want: []string{"save"}, wantErr: boom, wantState: hvPaused},
		{name: "save writes nothing", ops: fakeOps{st: hvRunning},
			want: []string{"pause", "save", "resume"}, wantErr: errAny, wantState: hvRunning},
		{name: "stop fails", ops: fakeOps{st: hvRunning, writes: []byte("mem"), stopErr: boom},
			want: []string{"pause", "save", "stop", "resume"}, wantErr: boom, wantState: hvRunning},
		{name: "lock busy", ops: fakeOps{st: hvRunning}, lockErr: vm.ErrSaveLockBusy,
			wantErr: vm.ErrSaveLockBusy, wantState: hvRunning},
		{name: "file exists", ops: fakeOps{st: hvRunning}, exists: true,
			wantErr: errAny, wantState: hvRunning, wantFile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "machine.state")
			if tt.exists {
				os.WriteFile(path, []byte("old"), 0o600)
			}
			lk := &fakeLock{err: tt.lockErr}
			ops := tt.ops
			err := saveState(t.Context(), &ops, path, lk.lock)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Errorf("saveState: %v", err)
			case tt.wantErr == errAny && err == nil, tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Errorf("saveState: got %v, want an error wrapping %v", err, tt.wantErr)
			}
			if !slices.Equal(ops.steps, tt.want) {
				t.Errorf("steps: got %v, want %v", ops.steps, tt.want)
			}
			if ops.st != tt.wantState {
				t.Errorf("machine ends %s, want %s", hvStateName(ops.st), hvStateName(tt.wantState))
			}
			if _, err := os.Stat(path); (err == nil) != tt.wantFile {
				t.Errorf("state file exists: %v, want %v", err == nil, tt.wantFile)
			}
			if lk.held != 0 {
				t.Errorf("lock still held")
			}
			if len(ops.steps) > 0 && lk.taken != 1 {
				t.Errorf("steps ran without the lock")
			}
		})
	}
}

func TestRestoreState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "machine.state")
	t.Run("under the lock", func(t *testing.T) {
		lk := &fakeLock{}
		_, err := restoreState(t.Context(), path, lk.lock, func(string) error {
			if lk.held != 1 {
				t.Errorf("restore ran without the lock")
			}
			return nil
		})
		if err != nil || lk.held != 0 {
			t.Errorf("restoreState: %v, lock held %d", err, lk.held)
		}
	})
	t.Run("lock busy", func(t *testing.T) {
		ran := false
		_, err := restoreState(t.Context(), path, (&fakeLock{err: vm.ErrSaveLockBusy}).lock, func(string) error { ran = true; return nil })
		if !errors.Is(err, vm.ErrSaveLockBusy) || ran {
			t.Errorf("restoreState: %v, restore ran %v; want ErrSaveLockBusy, no restore", err, ran)
		}
	})
	t.Run("framework refuses", func(t *testing.T) {
		boom := errors.New("VZErrorRestore")
		_, err := restoreState(t.Context(), path, (&fakeLock{}).lock, func(string) error { return boom })
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "start afresh") {
			t.Errorf("restoreState: %v", err)
		}
	})
	t.Run("cancelled meanwhile", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := restoreState(ctx, path, (&fakeLock{}).lock, func(string) error { cancel(); return nil })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("restoreState: got %v, want context.Canceled", err)
		}
	})
}

func TestHostLockSerialises(t *testing.T) {
	path := filepath.Join(t.TempDir(), "save.lock")
	release, err := hostLock(path)(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	ran := false
	_, err = restoreState(ctx, filepath.Join(t.TempDir(), "s"), hostLock(path), func(string) error { ran = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Errorf("restore while another holds the lock: %v, ran %v", err, ran)
	}
}

func TestCheckStatePaths(t *testing.T) {
	dir := t.TempDir()
	if err := checkSavePath(filepath.Join(dir, "new.state")); err != nil {
		t.Errorf("checkSavePath(new): %v", err)
	}
	if err := checkSavePath(filepath.Join(dir, "missing", "new.state")); err == nil {
		t.Errorf("checkSavePath(no folder): want an error")
	}
	full := filepath.Join(dir, "full.state")
	os.WriteFile(full, []byte("mem"), 0o600)
	if err := checkSavePath(full); err == nil {
		t.Errorf("checkSavePath(existing): want an error")
	}
	if err := checkRestorePath(full); err != nil {
		t.Errorf("checkRestorePath(existing): %v", err)
	}
	empty := filepath.Join(dir, "empty.state")
	os.WriteFile(empty, nil, 0o600)
	for _, p := range []string{empty, dir, filepath.Join(dir, "missing")} {
		if err := checkRestorePath(p); !errors.Is(err, vm.ErrInvalidConfig) {
			t.Errorf("checkRestorePath(%s): got %v, want ErrInvalidConfig", p, err)
		}
	}
	if err := checkRestorePath(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checkRestorePath(missing): got %v, want fs.ErrNotExist", err)
	}
}
