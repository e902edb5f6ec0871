package session

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
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
	// StatusRecovering: `vibedom recover` collects a crashed session's
	// work in a rescue VM.
	StatusRecovering Status = "recovering"
)

// State is a session's state.json. Other commands (list, diff, apply …) read
// it; only the session's own process writes it.
type State struct {
	Name      string `json:"name"`
	Workspace string `json:"workspace"`
	// WorkspaceID identifies the workspace folder (device and inode) as
	// it was at start, so a recovery knows it is still the same folder.
	WorkspaceID string    `json:"workspace_id,omitempty"`
	Created     time.Time `json:"created"`
	Status      Status    `json:"status"`
	LogDir      string    `json:"log_dir"`
	PID         int       `json:"pid,omitempty"`
	// PIDStart is PID's start time, so a recycled PID is not taken for a
	// live session.
	PIDStart  string   `json:"pid_start,omitempty"`
	Driver    string   `json:"driver,omitempty"`
	Arch      string   `json:"arch,omitempty"`
	CPUs      int      `json:"cpus,omitempty"`
	MemoryMiB int      `json:"memory_mib,omitempty"`
	Command   []string `json:"command,omitempty"`
	// Control is the session host's control socket (see control.go).
	Control string `json:"control,omitempty"`
	// Detached: the session host runs in the background (run --detach).
	Detached bool `json:"detached,omitempty"`
	// PausedAt is when the VM was paused (Status paused).
	PausedAt time.Time `json:"paused_at,omitzero"`
	// Agent is what runs on the kept terminal: an agent's name, "shell",
	// or "command".
	Agent string `json:"agent,omitempty"`
	// RootImage and GuestLibc say which root image the session booted
	// ("" for the Debian test image), for a rescue boot after a crash.
	RootImage string    `json:"root_image,omitempty"`
	GuestLibc string    `json:"guest_libc,omitempty"`
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
	return writeFileAtomic(filepath.Join(dir, stateFile), append(data, '\n'), 0o600)
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	return atomicfile.WriteFile(path, data, mode)
}

var unsafeName = regexp.MustCompile(`[^a-z0-9._-]+`)

// NewName is a fresh session name for workspace (see newName).
func NewName(workspace string) string { return newName(workspace) }

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
