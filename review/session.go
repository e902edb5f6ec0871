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

import "time"

// SessionInfo is what review needs of a session. Package session (the one
// reader of the session store) hands it out (session.Info.Review).
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
