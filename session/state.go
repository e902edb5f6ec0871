package session

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Status is where a session is in its life.
type Status string

// Session statuses, as written to state.json.
const (
	StatusStarting Status = "starting"
	StatusRunning  Status = "running"
	StatusPaused   Status = "paused"
	StatusStopping Status = "stopping"
	StatusStopped  Status = "stopped"
	StatusFailed   Status = "failed"
)

// State is a session's state.json. Other commands (list, diff, apply …) read
// it; only the session's own process writes it.
type State struct {
	Name      string    `json:"name"`
	Workspace string    `json:"workspace"`
	Created   time.Time `json:"created"`
	Status    Status    `json:"status"`
	LogDir    string    `json:"log_dir"`
	PID       int       `json:"pid,omitempty"`
	Driver    string    `json:"driver,omitempty"`
	Arch      string    `json:"arch,omitempty"`
	CPUs      int       `json:"cpus,omitempty"`
	MemoryMiB int       `json:"memory_mib,omitempty"`
	Command   []string  `json:"command,omitempty"`
	Ended     time.Time `json:"ended,omitzero"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	Error     string    `json:"error,omitempty"`
}

// ErrNoSession means no session matched the name given.
var ErrNoSession = errors.New("no such session")

// writeState replaces dir/state.json atomically.
func writeState(dir string, st *State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode session state: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, "state.json"), append(data, '\n'), 0o600)
}

// ReadState reads the state.json of the session folder dir.
func ReadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s has no state.json", ErrNoSession, dir)
		}
		return nil, fmt.Errorf("read session state: %w", err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, "state.json"), err)
	}
	return &st, nil
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

var unsafeName = regexp.MustCompile(`[^a-z0-9._-]+`)

// newName derives a session name from the workspace folder's name plus a short
// random suffix, e.g. "my-app-3f9c". Names are safe as file names and as
// hostnames' first label.
func newName(workspace string) string {
	base := strings.ToLower(filepath.Base(workspace))
	base = strings.Trim(unsafeName.ReplaceAllString(base, "-"), "-.")
	if len(base) > 40 {
		base = strings.TrimRight(base[:40], "-.")
	}
	if base == "" {
		base = "session"
	}
	var b [2]byte
	_, _ = rand.Read(b[:])
	return base + "-" + hex.EncodeToString(b[:])
}

// ValidName reports whether name can be a session name given by a user.
func ValidName(name string) bool {
	return name != "" && len(name) <= 64 && name[0] != '.' && !unsafeName.MatchString(name)
}
