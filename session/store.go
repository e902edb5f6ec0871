package session

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/review"
)

// The session store: session folders under ~/.vibedom/sessions, each with a
// state.json only the session's own process writes. This file is the one
// reader; commands (list, review, apply, logs …) go through it.

// Statuses that are never written, only derived when reading.
const (
	// StatusCrashed: the state says the session runs, but its process is
	// gone (or the PID now belongs to another process).
	StatusCrashed Status = "crashed"
	// StatusDamaged: state.json is missing its fields or does not parse.
	StatusDamaged Status = "damaged"
)

// live reports whether s's recorded status is one of a running process.
func (s Status) live() bool {
	return s == StatusStarting || s == StatusRunning || s == StatusStopping || s == StatusPaused || s == StatusRecovering
}

// Info is one session as the store reads it.
type Info struct {
	State
	// Dir is the session folder.
	Dir string `json:"dir"`
	// Live is the status as it is now: the recorded one, or StatusCrashed
	// when the process that should run the session is gone, or
	// StatusDamaged (then Problem says why).
	Live    Status `json:"live_status"`
	Problem string `json:"problem,omitempty"`
}

// PatchPending reports whether the session left a patch for review (an
// empty one, when the agent changed nothing, is none).
func (i *Info) PatchPending() bool {
	fi, err := os.Stat(filepath.Join(i.Dir, overlay.PatchFileName))
	return err == nil && fi.Mode().IsRegular() && fi.Size() > 0
}

// Review is what package review needs of the session.
func (i *Info) Review() *review.SessionInfo {
	return &review.SessionInfo{Name: i.Name, Workspace: i.Workspace, Created: i.Created, Status: string(i.Live),
		LogDir: i.LogDir, PID: i.PID, Dir: i.Dir}
}

// readInfo reads one session folder.
func readInfo(dir string) (*Info, error) {
	b, err := atomicfile.ReadLimited(filepath.Join(dir, stateFile), 1<<20)
	if err != nil {
		return nil, err
	}
	i := &Info{Dir: dir}
	if err := json.Unmarshal(b, &i.State); err != nil {
		i.Name, i.Live, i.Problem = filepath.Base(dir), StatusDamaged, fmt.Sprintf("%s does not parse: %v", stateFile, err)
		return i, nil
	}
	if i.Name == "" {
		i.Name = filepath.Base(dir)
	}
	switch {
	case !filepath.IsAbs(i.Workspace):
		i.Live, i.Problem = StatusDamaged, fmt.Sprintf("workspace %q is not an absolute path", i.Workspace)
	case i.Status.live() && !processIs(i.PID, i.PIDStart):
		i.Live = StatusCrashed
	default:
		i.Live = i.Status
	}
	return i, nil
}

// ListSessions reads every session, newest first. Damaged ones are listed
// (Live is StatusDamaged); folders without state.json are skipped.
func ListSessions(h home.Home) ([]*Info, error) {
	ents, err := os.ReadDir(h.Sessions())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	var out []*Info
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		i, err := readInfo(filepath.Join(h.Sessions(), e.Name()))
		if err != nil {
			continue
		}
		out = append(out, i)
	}
	slices.SortStableFunc(out, func(a, b *Info) int { return b.Created.Compare(a.Created) })
	return out, nil
}

// FindSession returns the session called name, or the newest one when name
// is empty. Errors wrap ErrNoSession and say what to do.
func FindSession(h home.Home, name string) (*Info, error) {
	if name == "" {
		all, err := ListSessions(h)
		if err != nil {
			return nil, err
		}
		for _, i := range all {
			if i.Live != StatusDamaged {
				return i, nil
			}
		}
		return nil, fmt.Errorf("%w under %s: start one with `vibedom run DIR`", ErrNoSession, h.Sessions())
	}
	if !ValidName(name) {
		return nil, fmt.Errorf("%w: %q is not a session name (`vibedom list` shows them)", ErrNoSession, name)
	}
	i, err := readInfo(h.Session(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w called %q under %s (`vibedom list` shows them)", ErrNoSession, name, h.Sessions())
	}
	if err != nil {
		return nil, err
	}
	if i.Live == StatusDamaged {
		return nil, fmt.Errorf("session %s is damaged: %s (its folder is %s)", name, i.Problem, i.Dir)
	}
	return i, nil
}

// Recoverable reports whether the session's scratch disk, which holds the
// agent's work until it is collected, is still there.
func (i *Info) Recoverable() bool {
	fi, err := os.Stat(filepath.Join(i.Dir, scratchFile))
	return err == nil && fi.Mode().IsRegular()
}
