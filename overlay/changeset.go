// Package overlay turns what the agent did in the guest's OverlayFS into a
// reviewed, safely applied change to the host workspace:
//
//   - the change set, computed in the guest from the overlay's upper dir
//     (ScanChanges) and validated on the host (ParseChangeSet);
//   - the baseline of the workspace taken on the host at session start
//     (TakeBaseline), so the end of the session knows what the agent saw;
//   - the git-style patch (BuildPatch, WriteSessionPatch) and its parser
//     (ParsePatch), which treats every patch as untrusted input;
//   - the safe, conflict-aware apply (Plan, Apply) and its undo (Undo).
//
// It never touches the network, never runs the agent's code, and never
// follows a symlink on the host while writing. It does not fetch content from
// the guest itself: the caller hands it a Source (the collection stream in a
// real session).
package overlay

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// ChangeSetVersion is the version of the ChangeSet JSON format.
const ChangeSetVersion = 1

// Limits the host enforces on a change set it parses.
const (
	MaxChanges     = 1_000_000 // entries in one change set
	MaxPathLen     = 4096      // bytes in a path
	MaxNameLen     = 255       // bytes in one path component
	MaxTargetLen   = 4095      // bytes in a symlink target
	MaxChangeBytes = 256 << 20 // bytes of change set JSON
)

// ChangeSet lists what differs between the overlay's merged view and its
// lower (the read-only workspace). It is produced in the guest and parsed by
// the host, which treats it as untrusted input (see ParseChangeSet).
type ChangeSet struct {
	Version int      `json:"version"`
	Changes []Change `json:"changes"`
}

// Op is what happened to a path.
type Op string

// Change operations. A type change (file to symlink, dir to file …) is a
// delete of the old entry followed by an add of the new one at the same path.
const (
	OpAdd    Op = "add"    // absent in lower, present now
	OpModify Op = "modify" // same type in both, content, target or mode differ
	OpDelete Op = "delete" // present in lower, absent now
	OpSkip   Op = "skip"   // seen but not carried (special files, unusable names)
)

// FileType is the kind of a directory entry.
type FileType string

// File types.
const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeSpecial FileType = "special" // fifo, socket, device
)

// Change is one changed path.
type Change struct {
	// Path is slash-separated, relative to the overlay root, clean, with no
	// "." or ".." component. For OpSkip it is only for display.
	Path string `json:"path"`
	Op   Op     `json:"op"`
	// Type is the entry's type after the change (before it, for OpDelete).
	Type FileType `json:"type"`
	// Mode is the permission bits (0o7777) after the change, for add and
	// modify.
	Mode uint32 `json:"mode,omitempty"`
	// OldMode is the permission bits before the change, for modify.
	OldMode uint32 `json:"old_mode,omitempty"`
	// Size and SHA256 (lowercase hex) describe a regular file's content after
	// the change; the host verifies both as it fetches the content.
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Target is a symlink's target after the change. It is recorded, never
	// followed.
	Target string `json:"target,omitempty"`
	// Reason says why an OpSkip entry was not carried.
	Reason string `json:"reason,omitempty"`
	// BaseSHA256 and BaseMode, on a modify of a regular file, describe the
	// version the agent's copy started from: the lower (live workspace)
	// content and permission bits the guest last saw opened before the
	// overlay copied the path up. The host uses it as the merge base only
	// when it holds that content itself (the session-start baseline or the
	// host's current file, by hash); otherwise the path is a conflict.
	// Absent when the guest does not know it.
	BaseSHA256 string `json:"base_sha256,omitempty"`
	BaseMode   uint32 `json:"base_mode,omitempty"`
}

// ErrInvalidChangeSet means a change set from the guest failed validation.
// The guest is untrusted: nothing of an invalid change set is used.
var ErrInvalidChangeSet = errors.New("invalid change set")

// ErrInvalidPath means a path is not relative, clean and inside the tree.
var ErrInvalidPath = errors.New("invalid path")

// ValidatePath reports whether p may name a file inside a workspace: non
// empty, valid UTF-8, relative, slash-separated and clean, no "." or ".."
// component, no NUL or other control character, within MaxPathLen and
// MaxNameLen.
func ValidatePath(p string) error {
	bad := func(why string) error { return fmt.Errorf("%w %s: %s", ErrInvalidPath, DisplayPath(p), why) }
	switch {
	case p == "":
		return bad("empty")
	case len(p) > MaxPathLen:
		return bad("too long")
	case !utf8.ValidString(p):
		return bad("not valid UTF-8")
	case p[0] == '/':
		return bad("absolute")
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return bad("contains a control character")
		}
	}
	for comp := range strings.SplitSeq(p, "/") {
		switch {
		case comp == "":
			return bad("empty component (leading, trailing or double slash)")
		case comp == "." || comp == "..":
			return bad(`"." or ".." component`)
		case len(comp) > MaxNameLen:
			return bad("component too long")
		}
	}
	return nil
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ValidateTarget reports whether t may be a symlink target in a change set:
// non-empty, valid UTF-8, no NUL, at most MaxTargetLen bytes. Where it points
// is judged at apply time.
func ValidateTarget(t string) error {
	switch {
	case t == "":
		return errors.New("empty symlink target")
	case len(t) > MaxTargetLen:
		return errors.New("symlink target too long")
	case !utf8.ValidString(t):
		return errors.New("symlink target not valid UTF-8")
	case strings.IndexByte(t, 0) >= 0:
		return errors.New("symlink target contains NUL")
	}
	return nil
}

// ParseChangeSet decodes and validates a change set produced by the guest.
// Every path, type, mode, size, hash and target is checked, and the entries
// must describe one consistent tree (no path both added twice, nothing under
// a non-directory). The result is sorted: by path, a delete before an add of
// the same path.
func ParseChangeSet(data []byte) (*ChangeSet, error) {
	if len(data) > MaxChangeBytes {
		return nil, fmt.Errorf("%w: %d bytes is more than the %d allowed", ErrInvalidChangeSet, len(data), MaxChangeBytes)
	}
	var cs ChangeSet
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cs); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", ErrInvalidChangeSet, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidChangeSet)
	}
	if err := cs.Validate(); err != nil {
		return nil, err
	}
	return &cs, nil
}

// Validate checks a change set as ParseChangeSet does and sorts it.
func (cs *ChangeSet) Validate() error {
	if cs.Version != ChangeSetVersion {
		return fmt.Errorf("%w: version %d, want %d (update vibedom-guest and vibedom together)", ErrInvalidChangeSet, cs.Version, ChangeSetVersion)
	}
	if len(cs.Changes) > MaxChanges {
		return fmt.Errorf("%w: %d entries is more than the %d allowed", ErrInvalidChangeSet, len(cs.Changes), MaxChanges)
	}
	cs.Sort()
	type seen struct{ del, put bool }
	byPath := make(map[string]*seen, len(cs.Changes))
	present := make(map[string]FileType) // type of each path present after the change
	deleted := make(map[string]bool)
	for i := range cs.Changes {
		c := &cs.Changes[i]
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: entry %d (%s): %s", ErrInvalidChangeSet, i, DisplayPath(c.Path), fmt.Sprintf(format, a...))
		}
		if c.Op == OpSkip {
			if c.Path == "" || len(c.Path) > 4*MaxPathLen || !utf8.ValidString(c.Path) {
				return bad("bad display path")
			}
			if len(c.Reason) > 1024 || !utf8.ValidString(c.Reason) {
				return bad("bad reason")
			}
			continue
		}
		if err := ValidatePath(c.Path); err != nil {
			return fmt.Errorf("%w: entry %d: %v", ErrInvalidChangeSet, i, err)
		}
		if c.Reason != "" {
			return bad("reason is only for skip entries")
		}
		switch c.Type {
		case TypeFile, TypeDir, TypeSymlink:
		case TypeSpecial:
			if c.Op != OpDelete {
				return bad("special files can only be deleted or skipped")
			}
		default:
			return bad("unknown type %q", c.Type)
		}
		if c.Mode > 0o7777 || c.OldMode > 0o7777 || c.BaseMode > 0o7777 {
			return bad("mode out of range")
		}
		if c.BaseSHA256 != "" || c.BaseMode != 0 {
			if c.Op != OpModify || c.Type != TypeFile {
				return bad("a base is only for a modify of a regular file")
			}
			if !validSHA256(c.BaseSHA256) {
				return bad("base_sha256 must be 64 lowercase hex digits")
			}
		}
		s := byPath[c.Path]
		if s == nil {
			s = &seen{}
			byPath[c.Path] = s
		}
		switch c.Op {
		case OpDelete:
			if s.del || s.put {
				return bad("path listed twice")
			}
			s.del = true
			deleted[c.Path] = true
			if c.Size != 0 || c.SHA256 != "" || c.Target != "" || c.Mode != 0 || c.OldMode != 0 {
				return bad("delete entries carry no content")
			}
			continue
		case OpAdd, OpModify:
			if s.put {
				return bad("path listed twice")
			}
			if c.Op == OpModify && s.del {
				return bad("modify of a deleted path")
			}
			s.put = true
			present[c.Path] = c.Type
		default:
			return bad("unknown op %q", c.Op)
		}
		if c.Op == OpAdd && c.OldMode != 0 {
			return bad("old_mode on an add")
		}
		switch c.Type {
		case TypeFile:
			if c.Size < 0 {
				return bad("negative size")
			}
			if !validSHA256(c.SHA256) {
				return bad("sha256 must be 64 lowercase hex digits")
			}
			if c.Target != "" {
				return bad("target on a regular file")
			}
		case TypeSymlink:
			if err := ValidateTarget(c.Target); err != nil {
				return bad("%v", err)
			}
			if c.Size != 0 || c.SHA256 != "" {
				return bad("content on a symlink")
			}
		case TypeDir:
			if c.Size != 0 || c.SHA256 != "" || c.Target != "" {
				return bad("content on a directory")
			}
		}
	}
	// One consistent tree: every ancestor of a present path is a directory
	// (not something added as a file or symlink, and not deleted without
	// being re-added as a directory).
	for p := range present {
		for a := parentDir(p); a != ""; a = parentDir(a) {
			if t, ok := present[a]; ok {
				if t != TypeDir {
					return fmt.Errorf("%w: %s is inside %s, which is a %s", ErrInvalidChangeSet, DisplayPath(p), DisplayPath(a), t)
				}
			} else if deleted[a] {
				return fmt.Errorf("%w: %s is inside %s, which is deleted", ErrInvalidChangeSet, DisplayPath(p), DisplayPath(a))
			}
		}
	}
	return nil
}

// Sort orders the entries by path, a delete before an add of the same path.
func (cs *ChangeSet) Sort() {
	rank := func(op Op) int {
		switch op {
		case OpDelete:
			return 0
		case OpSkip:
			return 2
		}
		return 1
	}
	slices.SortStableFunc(cs.Changes, func(a, b Change) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return rank(a.Op) - rank(b.Op)
	})
}

// parentDir is the slash-separated parent of p, "" at the top.
func parentDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}
