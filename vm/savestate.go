package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
)

// Pausing to disk: a machine's state file (written by StateSaver) and, next
// to it, a record (SavedState) that says which driver wrote it and what the
// machine looked like, so a restore into a different machine is refused
// before the hypervisor is asked. This file owns the record's format.

// Errors of saving and restoring. Check them with errors.Is.
var (
	// ErrStateMismatch means the Config given for a restore differs from
	// the one the state was saved with. The message names the first
	// difference.
	ErrStateMismatch = errors.New("saved state does not match this machine")
	// ErrStateDamaged means the record next to a state file, or the file
	// itself, is missing, unreadable or inconsistent.
	ErrStateDamaged = errors.New("saved state is damaged")
)

// SavedStateRecordSuffix is appended to a state file's path to name its
// record.
const SavedStateRecordSuffix = ".record.json"

// savedStateVersion is the record format written; others are refused.
const savedStateVersion = 1

// maxRecordSize bounds what ReadSavedState reads: a record is a few KiB.
const maxRecordSize = 1 << 20

// FingerprintPart is one fact about a Config that a restore needs unchanged,
// such as {"cpus", "2"}. Values are printable and short: file contents and
// the machine identity appear as digests.
type FingerprintPart struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// ConfigFingerprint is what Fingerprint reports: the parts in a fixed order
// and Sum, the hex SHA-256 of their "name=value\n" lines.
type ConfigFingerprint struct {
	Sum   string            `json:"sum"`
	Parts []FingerprintPart `json:"parts"`
}

// Fingerprint describes everything about cfg that a machine restored from
// saved state needs identical to the machine that saved it: architecture,
// CPUs, memory, the kernel's and initrd's contents, the command line, each
// disk's path, mode, size and modification time, each share's tag, path
// and mode, the NIC and its MAC, the machine identity and the control port
// (zero counts as DefaultControlPort). Name, ConsoleLog, StateDir and the
// network socket itself are not part of it: they may differ.
//
// Kernel and initrd are hashed whole: they are tens of MiB, read in well
// under a second, and a rebuilt file of the same size and a preserved
// modification time (an unpacked archive) must not pass. Disks are not:
// they are GiBs the guest itself writes, so path, size and modification
// time are what tells that something else wrote them after the save; take
// the fingerprint once the machine has stopped.
//
// The error, if any, says which file could not be read.
func Fingerprint(cfg Config) (ConfigFingerprint, error) {
	var parts []FingerprintPart
	add := func(name, value string) { parts = append(parts, FingerprintPart{name, value}) }
	add("arch", string(cfg.Arch))
	add("cpus", strconv.Itoa(cfg.CPUs))
	add("memory_mib", strconv.Itoa(cfg.MemoryMiB))
	for _, f := range []struct{ name, path string }{{"kernel", cfg.Kernel}, {"initrd", cfg.Initrd}} {
		sum, err := hashFile(f.path)
		if err != nil {
			return ConfigFingerprint{}, fmt.Errorf("fingerprint %s: %w", f.name, err)
		}
		add(f.name, sum)
	}
	add("cmdline", strconv.Quote(cfg.Cmdline))
	for i, d := range cfg.Disks {
		fi, err := os.Stat(d.Path)
		if err != nil {
			return ConfigFingerprint{}, fmt.Errorf("fingerprint disk %d: %w", i, err)
		}
		add(fmt.Sprintf("disk %d", i), fmt.Sprintf("%s read-only=%t size=%d modified=%s",
			strconv.Quote(d.Path), d.ReadOnly, fi.Size(), fi.ModTime().UTC().Format(time.RFC3339Nano)))
	}
	for _, s := range cfg.Shares {
		add("share "+strconv.Quote(s.Tag), fmt.Sprintf("%s read-only=%t", strconv.Quote(s.HostPath), s.ReadOnly))
	}
	switch {
	case cfg.Network == nil:
		add("network", "none")
	case cfg.Network.MAC == "":
		add("network", "mac chosen by the backend")
	default:
		add("network", "mac "+cfg.Network.MAC)
	}
	if len(cfg.MachineID) == 0 {
		add("machine_id", "none")
	} else {
		sum := sha256.Sum256(cfg.MachineID)
		add("machine_id", "sha256:"+hex.EncodeToString(sum[:]))
	}
	port := cfg.ControlPort
	if port == 0 {
		port = DefaultControlPort
	}
	add("control_port", strconv.FormatUint(uint64(port), 10))
	return ConfigFingerprint{Sum: sumParts(parts), Parts: parts}, nil
}

// hashFile returns "sha256:HEX (N bytes)" for the file at path.
func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return fmt.Sprintf("sha256:%x (%d bytes)", h.Sum(nil), n), nil
}

// sumParts is the hex SHA-256 of parts' "name=value\n" lines.
func sumParts(parts []FingerprintPart) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%s=%s\n", p.Name, p.Value)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SavedState is the record written next to a state file. It is the only
// thing vibedom reads to decide whether a restore may be attempted.
type SavedState struct {
	Version int `json:"version"`
	// Driver is the Driver.Name of the backend that wrote the state.
	Driver string `json:"driver"`
	// Fingerprint is the saved machine's Config, as Fingerprint reports it.
	Fingerprint ConfigFingerprint `json:"fingerprint"`
	// MachineID is the saved machine's identity; a restore must use it.
	MachineID []byte `json:"machine_id"`
	// StateSize is the state file's size in bytes, to tell a truncated one.
	StateSize int64 `json:"state_size"`
	// Created is when the state was saved.
	Created time.Time `json:"created"`
}

// validate reports the first inconsistency of a record read from disk.
func (r *SavedState) validate() error {
	switch {
	case r.Version != savedStateVersion:
		return fmt.Errorf("record version %d, want %d", r.Version, savedStateVersion)
	case r.Driver == "":
		return errors.New("record names no driver")
	case len(r.MachineID) == 0:
		return errors.New("record holds no machine identity")
	case len(r.Fingerprint.Parts) == 0:
		return errors.New("record holds no fingerprint")
	case sumParts(r.Fingerprint.Parts) != r.Fingerprint.Sum:
		return errors.New("record's fingerprint does not add up")
	case r.StateSize <= 0:
		return errors.New("record gives no state file size")
	case r.Created.IsZero():
		return errors.New("record has no creation time")
	}
	return nil
}

// WriteSavedState writes rec as the record of the state file at statePath,
// atomically.
func WriteSavedState(statePath string, rec SavedState) error {
	rec.Version = savedStateVersion
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode saved state record: %w", err)
	}
	return atomicfile.WriteFile(statePath+SavedStateRecordSuffix, append(b, '\n'), 0o600)
}

// ReadSavedState reads the record of the state file at statePath and checks
// it against that file. A missing, unreadable or inconsistent record, or a
// state file of another size than recorded, is an error wrapping
// ErrStateDamaged. A missing record wraps fs.ErrNotExist too.
func ReadSavedState(statePath string) (SavedState, error) {
	damaged := func(err error) error {
		return fmt.Errorf("%w: %s: %w", ErrStateDamaged, statePath, err)
	}
	f, err := os.Open(statePath + SavedStateRecordSuffix)
	if err != nil {
		return SavedState{}, damaged(err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecordSize+1))
	if err != nil {
		return SavedState{}, damaged(err)
	}
	if len(b) > maxRecordSize {
		return SavedState{}, damaged(fmt.Errorf("record is over %d bytes", maxRecordSize))
	}
	var rec SavedState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return SavedState{}, damaged(fmt.Errorf("decode record: %w", err))
	}
	if err := rec.validate(); err != nil {
		return SavedState{}, damaged(err)
	}
	fi, err := os.Stat(statePath)
	if err != nil {
		return SavedState{}, damaged(err)
	}
	if fi.Size() != rec.StateSize {
		return SavedState{}, damaged(fmt.Errorf("state file is %d bytes, the record says %d", fi.Size(), rec.StateSize))
	}
	return rec, nil
}

// CheckRestore reports whether a machine described by cfg may be restored
// from the state rec describes: nil, or an error wrapping ErrStateMismatch
// that names the first difference on one line. cfg.MachineID must be set
// (RestoreFromDisk takes it from the record).
func CheckRestore(rec SavedState, cfg Config) error {
	now, err := Fingerprint(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStateMismatch, err)
	}
	if now.Sum == rec.Fingerprint.Sum {
		return nil
	}
	return fmt.Errorf("%w: %s; start afresh or restore with the settings it was saved with", ErrStateMismatch, firstDifference(rec.Fingerprint.Parts, now.Parts))
}

// firstDifference names the first part that differs between saved and now.
func firstDifference(saved, now []FingerprintPart) string {
	find := func(parts []FingerprintPart, name string) (string, bool) {
		for _, p := range parts {
			if p.Name == name {
				return p.Value, true
			}
		}
		return "", false
	}
	describe := func(v string, ok bool) string {
		if !ok {
			return "absent"
		}
		return v
	}
	for _, p := range saved {
		if v, ok := find(now, p.Name); !ok || v != p.Value {
			return fmt.Sprintf("%s was %s, is now %s", p.Name, p.Value, describe(v, ok))
		}
	}
	for _, p := range now {
		if _, ok := find(saved, p.Name); !ok {
			return fmt.Sprintf("%s was absent, is now %s", p.Name, p.Value)
		}
	}
	return "the fingerprint differs"
}

// SaveToDisk saves m's state to statePath and writes its record: it checks
// SaveStateSupported, removes an old state file and record at that path,
// calls SaveState (which leaves m stopped) and records driver and cfg's
// fingerprint. cfg is the Config m was started or restored with; when its
// MachineID is empty, m's (Identified) is used. Back ends that need no
// identity may leave both empty.
func SaveToDisk(ctx context.Context, m Machine, cfg Config, driver, statePath string) (SavedState, error) {
	if err := SaveStateSupported(m); err != nil {
		return SavedState{}, err
	}
	s := m.(StateSaver)
	if len(cfg.MachineID) == 0 {
		if id, ok := m.(Identified); ok {
			cfg.MachineID = id.MachineID()
		}
	}
	if len(cfg.MachineID) == 0 {
		return SavedState{}, fmt.Errorf("save state: %w: the machine reports no identity, so it could not be restored", ErrNotSupported)
	}
	for _, p := range []string{statePath + SavedStateRecordSuffix, statePath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return SavedState{}, fmt.Errorf("save state: remove the old %s: %w", p, err)
		}
	}
	if err := s.SaveState(ctx, statePath); err != nil {
		return SavedState{}, fmt.Errorf("save state to %s: %w", statePath, err)
	}
	// From here on the machine has stopped: a failure loses the saved state.
	lost := func(err error) error {
		os.Remove(statePath)
		return fmt.Errorf("save state: the machine stopped but its state cannot be restored: %w", err)
	}
	fi, err := os.Stat(statePath)
	if err != nil {
		return SavedState{}, lost(err)
	}
	fp, err := Fingerprint(cfg)
	if err != nil {
		return SavedState{}, lost(err)
	}
	rec := SavedState{
		Version:     savedStateVersion,
		Driver:      driver,
		Fingerprint: fp,
		MachineID:   bytes.Clone(cfg.MachineID),
		StateSize:   fi.Size(),
		Created:     time.Now().UTC(),
	}
	if err := WriteSavedState(statePath, rec); err != nil {
		return SavedState{}, lost(err)
	}
	return rec, nil
}

// RestoreFromDisk restores a machine saved by SaveToDisk and returns it
// paused. It reads and checks the record (ErrStateDamaged), checks that d
// wrote it and that cfg matches it (ErrStateMismatch), taking the machine
// identity from the record when cfg has none, and asks d's Restorer.
//
// A saved state is used once: after a successful restore the state file
// and its record are removed, since the guest goes on to write its disks
// and the state would no longer match them.
func RestoreFromDisk(ctx context.Context, d Driver, cfg Config, statePath string) (Machine, error) {
	r, ok := d.(Restorer)
	if !ok {
		return nil, fmt.Errorf("restore: %w", ErrSaveUnsupported)
	}
	rec, err := ReadSavedState(statePath)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if rec.Driver != d.Name() {
		return nil, fmt.Errorf("restore: %w: saved by the %s backend, this is %s; start afresh or use %s", ErrStateMismatch, rec.Driver, d.Name(), rec.Driver)
	}
	if len(cfg.MachineID) == 0 {
		cfg.MachineID = bytes.Clone(rec.MachineID)
	}
	if err := CheckRestore(rec, cfg); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	m, err := r.Restore(ctx, cfg, statePath)
	if err != nil {
		return nil, fmt.Errorf("restore from %s: %w", statePath, err)
	}
	// The record goes first: without it the state is never used again. If it
	// cannot go, the restored machine is dropped instead (it has not run, so
	// the state on disk still matches its disks).
	if err := os.Remove(statePath + SavedStateRecordSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.Kill()
		return nil, fmt.Errorf("restore: the saved state could not be marked used, so the restored machine was dropped: %w", err)
	}
	os.Remove(statePath)
	return m, nil
}
