// Package review is the host-side end of a session's changes: it finds a
// session folder, shows the user a summary of the agent's patch (what would
// be added, modified, deleted; protected, refused, conflicting and flagged
// paths and the totals last, next to the prompt), pages a colored diff, lets
// the user apply all or some files, keep the patch for later or discard it,
// and asks about conflicts. Every name, reason and content it prints from
// the patch goes through package termtext.
//
// It does not compute, parse or apply patches itself (package overlay does)
// and does not start or stop sessions. It writes only to the session folder
// (through overlay) and the terminal.
package review

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// SessionInfo is what review needs from a session's state.json (written by
// the session package in this shape).
type SessionInfo struct {
	Name      string    `json:"name"`
	Workspace string    `json:"workspace"`
	Created   time.Time `json:"created"`
	Status    string    `json:"status"`
	LogDir    string    `json:"log_dir"`
	// PID is the process that ran (or runs) the session.
	PID int `json:"pid,omitempty"`
	// Dir is the session folder ($VIBEDOM_HOME/sessions/<name>).
	Dir string `json:"-"`
}

// ErrNoSession means no session folder matched.
var ErrNoSession = errors.New("no session")

// SessionsDir is the folder of session folders under a vibedom home.
func SessionsDir(home string) string { return filepath.Join(home, "sessions") }

// ListSessions reads every session folder's state.json under home, newest
// first. Folders without a readable state.json are skipped.
func ListSessions(home string) ([]*SessionInfo, error) {
	ents, err := os.ReadDir(SessionsDir(home))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	var out []*SessionInfo
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		si, err := readState(filepath.Join(SessionsDir(home), e.Name()))
		if err != nil {
			continue
		}
		out = append(out, si)
	}
	slices.SortStableFunc(out, func(a, b *SessionInfo) int { return b.Created.Compare(a.Created) })
	return out, nil
}

func readState(dir string) (*SessionInfo, error) {
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, err
	}
	var si SessionInfo
	if err := json.Unmarshal(data, &si); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, "state.json"), err)
	}
	si.Dir = dir
	if si.Name == "" {
		si.Name = filepath.Base(dir)
	}
	if !filepath.IsAbs(si.Workspace) {
		return nil, fmt.Errorf("%s: workspace %q is not an absolute path", dir, si.Workspace)
	}
	return &si, nil
}

// FindSession returns the session called name under home, or the latest one
// (by created) when name is empty.
func FindSession(home, name string) (*SessionInfo, error) {
	if name == "" {
		all, err := ListSessions(home)
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("%w under %s: start one with `vibedom run DIR`", ErrNoSession, SessionsDir(home))
		}
		return all[0], nil
	}
	if name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("%w: %q is not a session name", ErrNoSession, name)
	}
	si, err := readState(filepath.Join(SessionsDir(home), name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w called %q under %s (`vibedom list` shows them)", ErrNoSession, name, SessionsDir(home))
	}
	if err != nil {
		return nil, err
	}
	return si, nil
}
