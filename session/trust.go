package session

import (
	"bytes"
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
	"time"

	"github.com/vibedom/vibedom/dlp"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/overlay"
)

// Workspace files that may widen what the guest can do, relative to the
// workspace. A cloned repository can hold them, so what they allow takes
// effect only once the user approved their content (ApproveWorkspace).
const (
	WorkspacePolicyRel       = ".vibedom/trusted_domains.txt"
	WorkspaceDLPAllowlistRel = ".vibedom/dlp_allowlist.txt"
)

// maxTrustFile bounds how much of a workspace trust file is read: a larger
// file is refused.
const maxTrustFile = 1 << 20

// maxApprovals bounds the store: the oldest approvals are forgotten first.
const maxApprovals = 4096

// TrustState says whether a workspace file's widening part is in effect.
type TrustState string

const (
	// TrustNone: the file is missing or widens nothing (e.g. only deny
	// rules); nothing needs approval.
	TrustNone TrustState = "none"
	// TrustApproved: the user approved exactly this content.
	TrustApproved TrustState = "approved"
	// TrustUnapproved: never approved for this workspace.
	TrustUnapproved TrustState = "unapproved"
	// TrustChanged: an earlier content was approved, this one was not.
	TrustChanged TrustState = "changed"
)

// TrustFile is one workspace file that may widen the session, as read from
// the host's copy of the workspace.
type TrustFile struct {
	// Rel is the file, relative to the workspace (WorkspacePolicyRel …).
	Rel string `json:"file"`
	// Present is false when the file does not exist.
	Present bool `json:"present"`
	// SHA256 is the hex sha256 of the content.
	SHA256 string `json:"sha256,omitempty"`
	// State tells whether what the file widens is in effect.
	State TrustState `json:"state"`
	// Widening lists the entries that need approval (allow rules, allowlist
	// entries), as written; Narrowing the entries that apply regardless
	// (deny rules).
	Widening  []string `json:"widening,omitempty"`
	Narrowing []string `json:"narrowing,omitempty"`

	data []byte
}

// Approved reports whether what the file widens is in effect.
func (f TrustFile) Approved() bool { return f.State == TrustApproved }

// WorkspaceTrust is the trust state of a workspace's files.
type WorkspaceTrust struct {
	Workspace string      `json:"workspace"`
	Files     []TrustFile `json:"files"`
}

// File returns the entry for rel.
func (t *WorkspaceTrust) File(rel string) *TrustFile {
	for i := range t.Files {
		if t.Files[i].Rel == rel {
			return &t.Files[i]
		}
	}
	return nil
}

// NeedsApproval lists the files whose widening entries are not in effect.
func (t *WorkspaceTrust) NeedsApproval() []TrustFile {
	var out []TrustFile
	for _, f := range t.Files {
		if f.State == TrustUnapproved || f.State == TrustChanged {
			out = append(out, f)
		}
	}
	return out
}

// LoadWorkspaceTrust reads the workspace's trust files (never through a
// symlink, at most 1 MiB each, regular files only) and compares each with
// the approvals stored in h. A file that cannot be read safely or parsed
// is an error that names it: nothing from it applies.
func LoadWorkspaceTrust(h Home, workspace string) (*WorkspaceTrust, error) {
	store, err := readApprovals(h)
	if err != nil {
		return nil, err
	}
	t := &WorkspaceTrust{Workspace: workspace}
	for _, rel := range []string{WorkspacePolicyRel, WorkspaceDLPAllowlistRel} {
		f := TrustFile{Rel: rel, State: TrustNone}
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
		if err := f.classify(workspace); err != nil {
			return nil, err
		}
		if len(f.Widening) > 0 {
			switch prev, ok := store.lookup(workspace, rel); {
			case ok && prev == f.SHA256:
				f.State = TrustApproved
			case ok:
				f.State = TrustChanged
			default:
				f.State = TrustUnapproved
			}
		}
		t.Files = append(t.Files, f)
	}
	return t, nil
}

// classify parses the file and sorts its entries into widening and
// narrowing ones.
func (f *TrustFile) classify(workspace string) error {
	source := filepath.Join(workspace, filepath.FromSlash(f.Rel))
	switch f.Rel {
	case WorkspacePolicyRel:
		rules, err := nfegress.ParseRules(bytes.NewReader(f.data), source)
		if err != nil {
			return fmt.Errorf("workspace egress rules: %w", err)
		}
		for _, r := range rules {
			if r.Deny {
				f.Narrowing = append(f.Narrowing, r.Text)
			} else {
				f.Widening = append(f.Widening, r.Text)
			}
		}
	case WorkspaceDLPAllowlistRel:
		a, err := dlp.ParseAllowlist(bytes.NewReader(f.data), source)
		if err != nil {
			return fmt.Errorf("DLP allowlist: %w (fix the file or remove it)", err)
		}
		for _, v := range a.Values {
			f.Widening = append(f.Widening, v)
		}
		for _, p := range a.Patterns {
			f.Widening = append(f.Widening, "re:"+p.String())
		}
		for _, c := range a.Categories {
			f.Widening = append(f.Widening, "context:"+c.String())
		}
	}
	return nil
}

// ApproveWorkspace records the current content of every file of t that
// needs approval, so that what it widens applies from the next session on.
// A file that changes afterwards needs approval again.
func ApproveWorkspace(h Home, t *WorkspaceTrust) error {
	if err := ensureDir(string(h)); err != nil {
		return err
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
// the user's own file under Home, but it is still refused when it is not a
// regular file or is writable by others.
func readApprovals(h Home) (*approvalStore, error) {
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

func (s *approvalStore) write(h Home) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(h.WorkspaceApprovals(), append(data, '\n'), 0o600)
}

// EgressPolicy merges the session's egress policy as a session would:
// built-in rules, the user's file, the workspace's file (its allow rules
// only when approved: see LoadWorkspaceTrust) and allow (--allow). notes
// tell the user what was left out and how to approve it.
func EgressPolicy(h Home, t *WorkspaceTrust, allow []string) (*nfegress.Policy, []string, error) {
	cfg := nfegress.PolicyConfig{UserFile: h.TrustedDomains(), Allow: allow}
	if f := t.File(WorkspacePolicyRel); f != nil && f.Present {
		cfg.Workspace = &nfegress.WorkspaceScope{
			Data:          f.data,
			Source:        filepath.Join(t.Workspace, filepath.FromSlash(f.Rel)),
			AllowApproved: f.Approved(),
		}
	}
	pol, err := nfegress.LoadPolicy(cfg)
	if err != nil {
		return nil, nil, err
	}
	var notes []string
	if n := len(pol.Ignored()); n > 0 {
		notes = append(notes, ignoredNote(t, WorkspacePolicyRel, n, "allow rule", "allow rules"))
	}
	return pol, notes, nil
}

// ignoredNote is the one-line notice for a file whose n widening entries
// were left out.
func ignoredNote(t *WorkspaceTrust, rel string, n int, one, many string) string {
	what := many
	state := "not approved"
	if f := t.File(rel); f != nil && f.State == TrustChanged {
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
	return shellQuote([]string{p})
}
