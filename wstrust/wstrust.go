// Package wstrust is the workspace as the host trusts it: which folder may
// be one (CheckWorkspace), and its say over its own sessions: the files
// under <workspace>/.vibedom/ that may widen what the guest can do (allow
// rules, DLP allowlist entries), read from the host's copy of the workspace
// and never through a symlink, and the user's approvals of their content,
// recorded by hash in ~/.vibedom (home.WorkspaceApprovals). A cloned
// repository is the agent's input: what a file widens applies only while
// its approved content is unchanged; what it narrows applies always.
//
// It does not parse rules or allowlists (the rooms that apply the files,
// the egress policy and the DLP, hand Load their parsers), and it decides
// nothing about a connection or a request: it says what the user approved.
package wstrust

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/overlay"
)

// Workspace files that may widen what the guest can do, relative to the
// workspace. A cloned repository can hold them, so what they allow takes
// effect only once the user approved their content (Approve).
const (
	PolicyRel       = ".vibedom/trusted_domains.txt"
	DLPAllowlistRel = ".vibedom/dlp_allowlist.txt"
)

// Files are the trust files, in the order Load lists them.
var Files = []string{PolicyRel, DLPAllowlistRel}

// ErrWorkspace is a folder that cannot be a workspace; it is wrapped with
// what is wrong and what to do.
var ErrWorkspace = errors.New("bad workspace")

// CheckWorkspace resolves path to an absolute, symlink-free directory path
// or says what is wrong with it.
func CheckWorkspace(path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%w: no workspace given: run `vibedom run PATH`", ErrWorkspace)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrWorkspace, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%w: %s does not exist: check the path", ErrWorkspace, path)
		}
		return "", fmt.Errorf("%w: %v", ErrWorkspace, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrWorkspace, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%w: %s is a file, not a directory: give the project folder", ErrWorkspace, path)
	}
	if real == "/" {
		return "", fmt.Errorf("%w: refusing to share the whole filesystem: give a project folder", ErrWorkspace)
	}
	if err := overlay.CheckNotHome(real, ""); err != nil {
		return "", fmt.Errorf("%w: %v", ErrWorkspace, err)
	}
	return real, nil
}

// maxTrustFile bounds how much of a workspace trust file is read: a larger
// file is refused.
const maxTrustFile = 1 << 20

// maxApprovals bounds the store: the oldest approvals are forgotten first.
const maxApprovals = 4096

// State says whether a workspace file's widening part is in effect.
type State string

const (
	// None: the file is missing or widens nothing (e.g. only deny
	// rules); nothing needs approval.
	None State = "none"
	// Approved: the user approved exactly this content.
	Approved State = "approved"
	// Unapproved: never approved for this workspace.
	Unapproved State = "unapproved"
	// Changed: an earlier content was approved, this one was not.
	Changed State = "changed"
)

// File is one workspace file that may widen the session, as read from
// the host's copy of the workspace.
type File struct {
	// Rel is the file, relative to the workspace (PolicyRel …).
	Rel string `json:"file"`
	// Present is false when the file does not exist.
	Present bool `json:"present"`
	// SHA256 is the hex sha256 of the content.
	SHA256 string `json:"sha256,omitempty"`
	// State tells whether what the file widens is in effect.
	State State `json:"state"`
	// Widening lists the entries that need approval (allow rules, allowlist
	// entries), as written; Narrowing the entries that apply regardless
	// (deny rules).
	Widening  []string `json:"widening,omitempty"`
	Narrowing []string `json:"narrowing,omitempty"`

	data []byte
}

// Approved reports whether what the file widens is in effect.
func (f File) Approved() bool { return f.State == Approved }

// Data is the file's content as read (nil when absent): what the room
// applying the file parses, so that it applies what was approved.
func (f File) Data() []byte { return f.data }

// Trust is the trust state of a workspace's files.
type Trust struct {
	Workspace string `json:"workspace"`
	Files     []File `json:"files"`
}

// File returns the entry for rel.
func (t *Trust) File(rel string) *File {
	for i := range t.Files {
		if t.Files[i].Rel == rel {
			return &t.Files[i]
		}
	}
	return nil
}

// NeedsApproval lists the files whose widening entries are not in effect.
func (t *Trust) NeedsApproval() []File {
	var out []File
	for _, f := range t.Files {
		if f.State == Unapproved || f.State == Changed {
			out = append(out, f)
		}
	}
	return out
}

// Parse sorts the entries of one trust file into those that widen what
// the guest may do (they apply only once approved) and those that narrow
// it (they apply regardless); an error refuses the file. source names the
// file in messages. The room that applies a file provides its Parse: this
// room knows no rule or allowlist syntax.
type Parse func(data []byte, source string) (widening, narrowing []string, err error)

// Load reads the workspace's trust files (never through a symlink, at most
// 1 MiB each, regular files only), sorts their entries with parse (one
// Parse for each of Files) and compares each file with the approvals
// stored in h. A file that cannot be read safely or parsed is an error
// that names it: nothing from it applies.
func Load(h home.Home, workspace string, parse map[string]Parse) (*Trust, error) {
	store, err := readApprovals(h)
	if err != nil {
		return nil, err
	}
	t := &Trust{Workspace: workspace}
	for _, rel := range Files {
		p := parse[rel]
		if p == nil {
			return nil, fmt.Errorf("workspace file %s: no parser for it", rel)
		}
		f := File{Rel: rel, State: None}
		data, err := overlay.ReadWorkspaceFile(workspace, rel, maxTrustFile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			t.Files = append(t.Files, f)
			continue
		case err != nil:
			return nil, fmt.Errorf("workspace file %s: %w (make it a regular file of at most %d bytes, not a symlink, or delete it)", rel, err, maxTrustFile)
		}
		f.Present, f.data = true, data
		sum := sha256.Sum256(data)
		f.SHA256 = hex.EncodeToString(sum[:])
		f.Widening, f.Narrowing, err = p(data, filepath.Join(workspace, filepath.FromSlash(rel)))
		if err != nil {
			return nil, err
		}
		if len(f.Widening) > 0 {
			switch prev, ok := store.lookup(workspace, rel); {
			case ok && prev == f.SHA256:
				f.State = Approved
			case ok:
				f.State = Changed
			default:
				f.State = Unapproved
			}
		}
		t.Files = append(t.Files, f)
	}
	return t, nil
}

// Approve records the current content of every file of t that needs
// approval, so that what it widens applies from the next session on. A
// file that changes afterwards needs approval again.
func Approve(h home.Home, t *Trust) error {
	if err := os.MkdirAll(string(h), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", h, err)
	}
	if fi, err := os.Stat(string(h)); err != nil {
		return err
	} else if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by other users (mode %v): run chmod go-w %s", h, fi.Mode().Perm(), h)
	}
	store, err := readApprovals(h)
	if err != nil {
		return err
	}
	now := time.Now().UTC().Truncate(time.Second)
	for _, f := range t.NeedsApproval() {
		store.set(approval{Workspace: t.Workspace, File: f.Rel, SHA256: f.SHA256, Approved: now})
	}
	return store.write(h)
}

// approval is one approved file content in the store.
type approval struct {
	Workspace string    `json:"workspace"`
	File      string    `json:"file"`
	SHA256    string    `json:"sha256"`
	Approved  time.Time `json:"approved"`
}

type approvalStore struct {
	Version   int        `json:"version"`
	Approvals []approval `json:"approvals"`
}

// readApprovals reads the store; a missing store is empty. The store is
// the user's own file under the home, but it is still refused when it is not a
// regular file or is writable by others.
func readApprovals(h home.Home) (*approvalStore, error) {
	path := h.WorkspaceApprovals()
	s := &approvalStore{Version: 1}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read workspace approvals: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("workspace approvals %s: not a regular file only you can write (delete it: approvals are then asked again)", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read workspace approvals: %w", err)
	}
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("workspace approvals %s: %w (delete it: approvals are then asked again)", path, err)
	}
	return s, nil
}

func (s *approvalStore) lookup(workspace, rel string) (string, bool) {
	for _, a := range s.Approvals {
		if a.Workspace == workspace && a.File == rel {
			return a.SHA256, true
		}
	}
	return "", false
}

func (s *approvalStore) set(a approval) {
	s.Approvals = slices.DeleteFunc(s.Approvals, func(o approval) bool {
		return o.Workspace == a.Workspace && o.File == a.File
	})
	s.Approvals = append(s.Approvals, a)
	if n := len(s.Approvals) - maxApprovals; n > 0 {
		s.Approvals = slices.Delete(s.Approvals, 0, n)
	}
}

func (s *approvalStore) write(h home.Home) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(h.WorkspaceApprovals(), append(data, '\n'), 0o600)
}

// IgnoredNote is the one-line notice for a file whose n widening entries
// were left out.
func IgnoredNote(t *Trust, rel string, n int, one, many string) string {
	what := many
	state := "not approved"
	if f := t.File(rel); f != nil && f.State == Changed {
		state = "changed since approved"
	}
	if n == 1 {
		what = one
	}
	return fmt.Sprintf("ignored %d %s of %s (%s): review and approve them with `vibedom policy approve %s`",
		n, what, rel, state, printableArg(t.Workspace))
}

// printableArg quotes a path for a shell command line shown to the user;
// a path with a character that does not print as itself is Go-quoted
// instead, so it cannot drive the terminal.
func printableArg(p string) string {
	for _, r := range p {
		if !strconv.IsPrint(r) {
			return strconv.Quote(p)
		}
	}
	if p != "" && strings.IndexFunc(p, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return p
	}
	return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
}
