package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// saveFixture writes the files a Config points at and returns the Config.
func saveFixture(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ws := filepath.Join(dir, "workspace")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	return Config{
		Name:       "test",
		Arch:       ArchARM64,
		CPUs:       2,
		MemoryMiB:  1024,
		Kernel:     write("Image", bytes.Repeat([]byte("K"), 4096)),
		Initrd:     write("initrd.cpio", bytes.Repeat([]byte("I"), 4096)),
		Cmdline:    "quiet",
		Shares:     []Share{{Tag: "workspace", HostPath: ws, ReadOnly: true}},
		Disks:      []Disk{{Path: write("scratch.img", make([]byte, 1<<16))}},
		Network:    &Network{MAC: "02:76:64:00:00:02"},
		ConsoleLog: filepath.Join(dir, "console.log"),
		StateDir:   dir,
		MachineID:  []byte("machine-identity-1"),
	}
}

// rewriteKeepingTime replaces path's content and puts its modification time
// back, as unpacking an archive of another build would.
func rewriteKeepingTime(t *testing.T, path string, data []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

func mustFingerprint(t *testing.T, cfg Config) ConfigFingerprint {
	t.Helper()
	fp, err := Fingerprint(cfg)
	if err != nil {
		t.Fatalf("Fingerprint: %v", err)
	}
	return fp
}

func TestFingerprintStable(t *testing.T) {
	cfg := saveFixture(t)
	a := mustFingerprint(t, cfg)
	// An equal Config built anew, with the fields a restore may change.
	other := cfg
	other.Name = "renamed"
	other.ConsoleLog = filepath.Join(t.TempDir(), "other.log")
	other.StateDir = t.TempDir()
	other.Shares = append([]Share(nil), cfg.Shares...)
	other.Disks = append([]Disk(nil), cfg.Disks...)
	other.Network = &Network{MAC: cfg.Network.MAC, Conn: os.Stdin}
	other.MachineID = bytes.Clone(cfg.MachineID)
	other.ControlPort = DefaultControlPort
	b := mustFingerprint(t, other)
	if a.Sum != b.Sum {
		t.Errorf("equal configs: sums differ:\n%v\n%v", a.Parts, b.Parts)
	}
	if len(a.Sum) != 64 {
		t.Errorf("Sum %q: want 64 hex digits", a.Sum)
	}
}

func TestFingerprintChanges(t *testing.T) {
	tests := []struct {
		name   string
		part   string // the part CheckRestore must name
		modify func(t *testing.T, c *Config)
	}{
		{"arch", "arch", func(_ *testing.T, c *Config) { c.Arch = ArchAMD64 }},
		{"cpus", "cpus", func(_ *testing.T, c *Config) { c.CPUs = 4 }},
		{"memory", "memory_mib", func(_ *testing.T, c *Config) { c.MemoryMiB = 2048 }},
		{"kernel content, same size and time", "kernel", func(t *testing.T, c *Config) {
			rewriteKeepingTime(t, c.Kernel, bytes.Repeat([]byte("k"), 4096))
		}},
		{"kernel path to other content", "kernel", func(t *testing.T, c *Config) {
			p := filepath.Join(t.TempDir(), "Image")
			os.WriteFile(p, []byte("another kernel"), 0o600)
			c.Kernel = p
		}},
		{"initrd content, same size and time", "initrd", func(t *testing.T, c *Config) {
			rewriteKeepingTime(t, c.Initrd, bytes.Repeat([]byte("i"), 4096))
		}},
		{"cmdline", "cmdline", func(_ *testing.T, c *Config) { c.Cmdline = "quiet debug" }},
		{"disk path", "disk 0", func(t *testing.T, c *Config) {
			p := filepath.Join(t.TempDir(), "scratch.img")
			os.WriteFile(p, make([]byte, 1<<16), 0o600)
			os.Chtimes(p, time.Unix(0, 0), time.Unix(0, 0))
			c.Disks[0].Path = p
		}},
		{"disk size", "disk 0", func(t *testing.T, c *Config) {
			if err := os.Truncate(c.Disks[0].Path, 1<<17); err != nil {
				t.Fatal(err)
			}
		}},
		{"disk written since", "disk 0", func(t *testing.T, c *Config) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(c.Disks[0].Path, later, later); err != nil {
				t.Fatal(err)
			}
		}},
		{"disk read-only", "disk 0", func(_ *testing.T, c *Config) { c.Disks[0].ReadOnly = true }},
		{"disk added", "disk 1", func(_ *testing.T, c *Config) { c.Disks = append(c.Disks, Disk{Path: c.Kernel}) }},
		{"disk removed", "disk 0", func(_ *testing.T, c *Config) { c.Disks = nil }},
		{"share tag", `share "workspace"`, func(_ *testing.T, c *Config) { c.Shares[0].Tag = "ws" }},
		{"share path", `share "workspace"`, func(t *testing.T, c *Config) { c.Shares[0].HostPath = t.TempDir() }},
		{"share read-only", `share "workspace"`, func(_ *testing.T, c *Config) { c.Shares[0].ReadOnly = false }},
		{"network removed", "network", func(_ *testing.T, c *Config) { c.Network = nil }},
		{"network MAC", "network", func(_ *testing.T, c *Config) { c.Network.MAC = "02:76:64:00:00:03" }},
		{"network MAC left to the backend", "network", func(_ *testing.T, c *Config) { c.Network.MAC = "" }},
		{"machine id", "machine_id", func(_ *testing.T, c *Config) { c.MachineID = []byte("machine-identity-2") }},
		{"control port", "control_port", func(_ *testing.T, c *Config) { c.ControlPort = 3000 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := saveFixture(t)
			cfg.Shares = append([]Share(nil), cfg.Shares...)
			cfg.Disks = append([]Disk(nil), cfg.Disks...)
			before := mustFingerprint(t, cfg)
			tt.modify(t, &cfg)
			after := mustFingerprint(t, cfg)
			if before.Sum == after.Sum {
				t.Fatalf("Sum unchanged: %v", after.Parts)
			}
			rec := SavedState{Fingerprint: before}
			err := CheckRestore(rec, cfg)
			t.Log(err)
			if !errors.Is(err, ErrStateMismatch) {
				t.Fatalf("CheckRestore: got %v, want an error wrapping ErrStateMismatch", err)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.part+" was ") || strings.Contains(msg, "\n") {
				t.Errorf("CheckRestore: got %q, want one line naming %q", msg, tt.part)
			}
		})
	}
}

func TestFingerprintUnreadableKernel(t *testing.T) {
	cfg := saveFixture(t)
	cfg.Kernel = filepath.Join(t.TempDir(), "missing")
	if _, err := Fingerprint(cfg); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "kernel") {
		t.Errorf("Fingerprint: got %v, want a not-exist error naming the kernel", err)
	}
	if err := CheckRestore(SavedState{}, cfg); !errors.Is(err, ErrStateMismatch) {
		t.Errorf("CheckRestore: got %v, want an error wrapping ErrStateMismatch", err)
	}
}

func TestCheckRestoreAccepts(t *testing.T) {
	cfg := saveFixture(t)
	rec := SavedState{Fingerprint: mustFingerprint(t, cfg)}
	cfg.Name, cfg.StateDir = "again", t.TempDir()
	if err := CheckRestore(rec, cfg); err != nil {
		t.Errorf("CheckRestore: %v", err)
	}
}

// writeState writes a state file of n bytes and its record; it returns the
// state file's path and the record.
func writeState(t *testing.T, cfg Config, n int) (string, SavedState) {
	t.Helper()
	statePath := filepath.Join(t.TempDir(), "machine.state")
	if err := os.WriteFile(statePath, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	rec := SavedState{
		Driver:      "fake",
		Fingerprint: mustFingerprint(t, cfg),
		MachineID:   cfg.MachineID,
		StateSize:   int64(n),
		Created:     time.Now().UTC(),
	}
	if err := WriteSavedState(statePath, rec); err != nil {
		t.Fatal(err)
	}
	rec.Version = savedStateVersion
	return statePath, rec
}

func TestSavedStateRoundTrip(t *testing.T) {
	cfg := saveFixture(t)
	statePath, want := writeState(t, cfg, 100)
	got, err := ReadSavedState(statePath)
	if err != nil {
		t.Fatalf("ReadSavedState: %v", err)
	}
	if !got.Created.Equal(want.Created) {
		t.Errorf("Created: got %v, want %v", got.Created, want.Created)
	}
	got.Created = want.Created
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Errorf("record:\ngot  %s\nwant %s", gj, wj)
	}
	if fi, err := os.Stat(statePath + SavedStateRecordSuffix); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file: %v, %v; want mode 0600", fi, err)
	}
	if err := CheckRestore(got, cfg); err != nil {
		t.Errorf("CheckRestore after the round trip: %v", err)
	}
}

func TestSavedStateDamaged(t *testing.T) {
	// edit changes the record's JSON object (or, returning nil, replaces the
	// whole file with raw).
	tests := []struct {
		name  string
		edit  func(t *testing.T, statePath string, rec map[string]any)
		raw   []byte
		noRec bool
	}{
		{name: "not JSON", raw: []byte("not json")},
		{name: "truncated", raw: []byte(`{"version": 1, "driver": "fa`)},
		{name: "empty", raw: []byte{}},
		{name: "missing", noRec: true},
		{name: "other version", edit: func(_ *testing.T, _ string, r map[string]any) { r["version"] = 2 }},
		{name: "no driver", edit: func(_ *testing.T, _ string, r map[string]any) { delete(r, "driver") }},
		{name: "no machine id", edit: func(_ *testing.T, _ string, r map[string]any) { r["machine_id"] = "" }},
		{name: "no creation time", edit: func(_ *testing.T, _ string, r map[string]any) { delete(r, "created") }},
		{name: "unknown field", edit: func(_ *testing.T, _ string, r map[string]any) { r["extra"] = true }},
		{name: "part edited", edit: func(_ *testing.T, _ string, r map[string]any) {
			fp := r["fingerprint"].(map[string]any)
			parts := fp["parts"].([]any)
			parts[1].(map[string]any)["value"] = "64"
		}},
		{name: "sum edited", edit: func(_ *testing.T, _ string, r map[string]any) {
			r["fingerprint"].(map[string]any)["sum"] = strings.Repeat("0", 64)
		}},
		{name: "no parts", edit: func(_ *testing.T, _ string, r map[string]any) {
			r["fingerprint"].(map[string]any)["parts"] = []any{}
		}},
		{name: "state file truncated", edit: func(t *testing.T, statePath string, _ map[string]any) {
			if err := os.Truncate(statePath, 50); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "state file gone", edit: func(t *testing.T, statePath string, _ map[string]any) {
			if err := os.Remove(statePath); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := saveFixture(t)
			statePath, _ := writeState(t, cfg, 100)
			recPath := statePath + SavedStateRecordSuffix
			switch {
			case tt.noRec:
				os.Remove(recPath)
			case tt.edit == nil:
				os.WriteFile(recPath, tt.raw, 0o600)
			default:
				b, _ := os.ReadFile(recPath)
				var r map[string]any
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatal(err)
				}
				tt.edit(t, statePath, r)
				b, _ = json.Marshal(r)
				os.WriteFile(recPath, b, 0o600)
			}
			_, err := ReadSavedState(statePath)
			t.Log(err)
			if !errors.Is(err, ErrStateDamaged) || strings.Contains(err.Error(), "\n") {
				t.Errorf("ReadSavedState: got %v, want one line wrapping ErrStateDamaged", err)
			}
		})
	}
}

// fakeMachine is a Machine that saves its state by writing a file.
type fakeMachine struct {
	id      []byte
	state   State
	saveErr error
}

func (m *fakeMachine) DialControl(context.Context) (net.Conn, error) { return nil, ErrNotRunning }
func (m *fakeMachine) State() State                                  { return m.state }
func (m *fakeMachine) StateChanges() <-chan State                    { return nil }
func (m *fakeMachine) Wait(context.Context) error                    { return nil }
func (m *fakeMachine) Stop(context.Context) error                    { m.state = StateStopped; return nil }
func (m *fakeMachine) Kill() error                                   { m.state = StateStopped; return nil }
func (m *fakeMachine) MachineID() []byte                             { return bytes.Clone(m.id) }

func (m *fakeMachine) SaveState(_ context.Context, path string) error {
	if m.saveErr != nil {
		return m.saveErr
	}
	if _, err := os.Stat(path); err == nil {
		return errors.New("state file exists")
	}
	m.state = StateStopped
	return os.WriteFile(path, []byte("memory"), 0o600)
}

// plainMachine cannot save its state.
type plainMachine struct{ fakeMachine }

func (plainMachine) SaveState() {} // not a StateSaver: wrong signature

// fakeDriver restores fakeMachines.
type fakeDriver struct {
	name     string
	restored []Config
}

func (d *fakeDriver) Name() string                                   { return d.name }
func (d *fakeDriver) Info() Info                                     { return Info{} }
func (d *fakeDriver) Available(context.Context, Arch) error          { return nil }
func (d *fakeDriver) Start(context.Context, Config) (Machine, error) { return nil, ErrNotSupported }
func (d *fakeDriver) Restore(_ context.Context, cfg Config, statePath string) (Machine, error) {
	if _, err := os.Stat(statePath); err != nil {
		return nil, err
	}
	d.restored = append(d.restored, cfg)
	return &fakeMachine{id: cfg.MachineID, state: StatePaused}, nil
}

func TestSaveStateSupported(t *testing.T) {
	err := SaveStateSupported(&plainMachine{})
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, ErrSaveUnsupported) {
		t.Errorf("plain machine: got %v, want ErrSaveUnsupported", err)
	}
	if !strings.Contains(err.Error(), "vibedom pause") {
		t.Errorf("plain machine: %q does not say what to do instead", err)
	}
	if err := SaveStateSupported(&fakeMachine{}); err != nil {
		t.Errorf("saving machine: %v", err)
	}
}

func TestSaveAndRestoreFromDisk(t *testing.T) {
	cfg := saveFixture(t)
	cfg.MachineID = nil // the machine reports it
	m := &fakeMachine{id: []byte("generated-id"), state: StateRunning}
	statePath := filepath.Join(t.TempDir(), "machine.state")
	os.WriteFile(statePath, []byte("an old state"), 0o600) // replaced
	rec, err := SaveToDisk(t.Context(), m, cfg, "fake", statePath)
	if err != nil {
		t.Fatalf("SaveToDisk: %v", err)
	}
	if m.state != StateStopped || !bytes.Equal(rec.MachineID, m.id) || rec.Driver != "fake" || rec.StateSize != 6 {
		t.Errorf("SaveToDisk: machine %s, record %+v", m.state, rec)
	}

	t.Run("other driver", func(t *testing.T) {
		d := &fakeDriver{name: "other"}
		if _, err := RestoreFromDisk(t.Context(), d, cfg, statePath); !errors.Is(err, ErrStateMismatch) || len(d.restored) > 0 {
			t.Errorf("RestoreFromDisk: got %v, want ErrStateMismatch before Restore", err)
		}
	})
	t.Run("other config", func(t *testing.T) {
		d := &fakeDriver{name: "fake"}
		other := cfg
		other.CPUs = 8
		if _, err := RestoreFromDisk(t.Context(), d, other, statePath); !errors.Is(err, ErrStateMismatch) || len(d.restored) > 0 {
			t.Errorf("RestoreFromDisk: got %v, want ErrStateMismatch before Restore", err)
		}
	})
	t.Run("no restorer", func(t *testing.T) {
		if _, err := RestoreFromDisk(t.Context(), plainDriver{}, cfg, statePath); !errors.Is(err, ErrNotSupported) {
			t.Errorf("RestoreFromDisk: got %v, want ErrNotSupported", err)
		}
	})
	t.Run("restore, once", func(t *testing.T) {
		d := &fakeDriver{name: "fake"}
		got, err := RestoreFromDisk(t.Context(), d, cfg, statePath)
		if err != nil {
			t.Fatalf("RestoreFromDisk: %v", err)
		}
		if got.State() != StatePaused || len(d.restored) != 1 || !bytes.Equal(d.restored[0].MachineID, m.id) {
			t.Errorf("RestoreFromDisk: state %s, restored with %v; want paused, with the saved identity", got.State(), d.restored)
		}
		for _, p := range []string{statePath, statePath + SavedStateRecordSuffix} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after restore: %v, want it removed", p, err)
			}
		}
		if _, err := RestoreFromDisk(t.Context(), d, cfg, statePath); !errors.Is(err, ErrStateDamaged) || len(d.restored) != 1 {
			t.Errorf("second RestoreFromDisk: got %v, want ErrStateDamaged", err)
		}
	})
}

func TestSaveToDiskFailures(t *testing.T) {
	cfg := saveFixture(t)
	t.Run("unsupported", func(t *testing.T) {
		if _, err := SaveToDisk(t.Context(), &plainMachine{}, cfg, "fake", filepath.Join(t.TempDir(), "s")); !errors.Is(err, ErrSaveUnsupported) {
			t.Errorf("SaveToDisk: got %v, want ErrSaveUnsupported", err)
		}
	})
	t.Run("no identity", func(t *testing.T) {
		c := cfg
		c.MachineID = nil
		if _, err := SaveToDisk(t.Context(), &fakeMachine{}, c, "fake", filepath.Join(t.TempDir(), "s")); !errors.Is(err, ErrNotSupported) {
			t.Errorf("SaveToDisk: got %v, want ErrNotSupported", err)
		}
	})
	t.Run("save fails", func(t *testing.T) {
		statePath := filepath.Join(t.TempDir(), "s")
		m := &fakeMachine{saveErr: errors.New("disk full"), state: StateRunning}
		if _, err := SaveToDisk(t.Context(), m, cfg, "fake", statePath); err == nil || m.state != StateRunning {
			t.Errorf("SaveToDisk: got %v, machine %s; want an error, machine running", err, m.state)
		}
		if _, err := os.Stat(statePath + SavedStateRecordSuffix); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("record after a failed save: %v, want none", err)
		}
	})
}

// plainDriver restores nothing.
type plainDriver struct{}

func (plainDriver) Name() string                                   { return "fake" }
func (plainDriver) Info() Info                                     { return Info{} }
func (plainDriver) Available(context.Context, Arch) error          { return nil }
func (plainDriver) Start(context.Context, Config) (Machine, error) { return nil, ErrNotSupported }
