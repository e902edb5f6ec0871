package preflight

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vibedom/vibedom/termtext"
)

// Status says what the workspace's files already decided about a finding.
type Status int

// Finding statuses.
const (
	// StatusUnapproved findings are shown to the user.
	StatusUnapproved Status = iota + 1
	// StatusApproved findings match an entry of .vibedom/approved_secrets.txt
	// (same file and rule, same secret).
	StatusApproved
	// StatusIgnored findings are listed in .gitleaksignore.
	StatusIgnored
)

// String returns "unapproved", "approved" or "ignored".
func (s Status) String() string {
	switch s {
	case StatusUnapproved:
		return "unapproved"
	case StatusApproved:
		return "approved"
	case StatusIgnored:
		return "ignored"
	}
	return "unknown"
}

// MarshalText encodes the status as its name.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Finding is one secret gitleaks found. Its secret value is unexported and
// never printed: String, GoString, Format and LogValue show it redacted,
// and JSON encoding leaves it out.
type Finding struct {
	// Fingerprint is gitleaks' "file:rule:line", the form .gitleaksignore uses.
	Fingerprint string
	// File is workspace-relative and slash-separated.
	File string
	// Line is 1-based.
	Line        int
	RuleID      string
	Description string
	Risk        Risk
	// Reason says why Risk was chosen, in words for the user.
	Reason string
	Status Status
	// Number is the finding's position (from 1) in the review prompt, for
	// unapproved findings; 0 for the others.
	Number  int
	Entropy float32

	secret       string // plaintext, in memory only
	approvalHash string // keyed hash recorded when the user approves it
}

// Redacted is the secret as it may be shown: at most a 4-character prefix
// (none for secrets shorter than 12 characters) and the length.
func (f Finding) Redacted() string { return redact(f.secret) }

// SecretLength is the length of the secret in characters.
func (f Finding) SecretLength() int { return utf8.RuneCountInString(f.secret) }

func (f Finding) String() string {
	return fmt.Sprintf("%s [%s] %s %s", f.Fingerprint, f.Risk, f.Redacted(), f.Reason)
}

// GoString keeps %#v from printing the secret.
func (f Finding) GoString() string { return "preflight.Finding{" + f.String() + "}" }

// Format makes every verb print the redacted form.
func (f Finding) Format(s fmt.State, _ rune) { io.WriteString(s, f.String()) }

// LogValue logs the finding without its secret.
func (f Finding) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("fingerprint", f.Fingerprint),
		slog.String("risk", f.Risk.String()),
		slog.String("status", f.Status.String()),
		slog.String("secret", f.Redacted()),
	)
}

func redact(s string) string {
	if s == "" {
		return "(whole file)"
	}
	r := []rune(s)
	prefix := ""
	if len(r) >= 12 {
		prefix = string(r[:4])
	}
	return fmt.Sprintf("%s…(%d chars)", prefix, len(r))
}

// Stats counts what a scan did.
type Stats struct {
	// Files is the number of regular files considered.
	Files int `json:"files"`
	// Scanned files were read and run through the rules.
	Scanned int `json:"scanned"`
	// CacheHits were known clean from an earlier scan and not scanned.
	CacheHits int `json:"cache_hits"`
	// BytesScanned is the size of the files scanned.
	BytesScanned int64 `json:"bytes_scanned"`
	// Binary files (a NUL byte in the first 8000 bytes) were checked by
	// path only.
	Binary int `json:"binary"`
	// TooLarge text files were checked by path only; they are also in
	// Skipped. (Binary files over the limit count as Binary.)
	TooLarge int `json:"too_large"`
	// Empty files have nothing to find.
	Empty int `json:"empty"`
	// Symlinks are never followed (see the package documentation).
	Symlinks int `json:"symlinks"`
	// Special files (FIFOs, sockets, devices) are never opened.
	Special int `json:"special"`
	// Allowlisted paths match a global gitleaks allowlist (node_modules/, lock files …).
	Allowlisted int `json:"allowlisted"`
	// Duration of the scan.
	Duration time.Duration `json:"-"`
}

// Skipped is a file whose contents were not scanned.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Report is the result of a scan.
type Report struct {
	// Workspace is the absolute, symlink-resolved path scanned.
	Workspace string
	// Findings are ordered HIGH first, then by file, line and rule.
	Findings []Finding
	Stats    Stats
	Skipped  []Skipped
	// Warnings are problems that did not stop the scan (a bad
	// .gitleaksignore line, an unusable cache …).
	Warnings []string
	// ConfigDigest names the rule set that was used.
	ConfigDigest string
	ScannedAt    time.Time

	approvals *approvals
}

// Unapproved returns the findings the user has not yet decided about, in
// prompt order.
func (r *Report) Unapproved() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Status == StatusUnapproved {
			out = append(out, f)
		}
	}
	return out
}

// Secrets returns every distinct secret value found, whatever its status
// (an approved or ignored secret may still not leave the machine), for the
// DLP. The values exist in memory only; the caller must not log or store
// them.
func (r *Report) Secrets() []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range r.Findings {
		if f.secret != "" && !seen[f.secret] {
			seen[f.secret] = true
			out = append(out, f.secret)
		}
	}
	slices.Sort(out)
	return out
}

func (r *Report) count(risk Risk, status Status) int {
	n := 0
	for _, f := range r.Findings {
		if (risk == 0 || f.Risk == risk) && (status == 0 || f.Status == status) {
			n++
		}
	}
	return n
}

// JSONVersion is the schema version written in "version".
const JSONVersion = 1

type jsonReport struct {
	Version      int           `json:"version"`
	Tool         string        `json:"tool"`
	Workspace    string        `json:"workspace"`
	ScannedAt    string        `json:"scanned_at"`
	DurationMS   int64         `json:"duration_ms"`
	ConfigDigest string        `json:"config_digest"`
	Summary      jsonSummary   `json:"summary"`
	Stats        Stats         `json:"stats"`
	Skipped      []Skipped     `json:"skipped"`
	Warnings     []string      `json:"warnings"`
	Findings     []jsonFinding `json:"findings"`
}

type jsonSummary struct {
	Total          int `json:"total"`
	Unapproved     int `json:"unapproved"`
	UnapprovedHigh int `json:"unapproved_high"`
	Approved       int `json:"approved"`
	Ignored        int `json:"ignored"`
	High           int `json:"high"`
	Medium         int `json:"medium"`
	Low            int `json:"low"`
}

type jsonFinding struct {
	Number         int     `json:"number,omitempty"`
	Fingerprint    string  `json:"fingerprint"`
	File           string  `json:"file"`
	Line           int     `json:"line"`
	Rule           string  `json:"rule"`
	Description    string  `json:"description"`
	Risk           Risk    `json:"risk"`
	Reason         string  `json:"reason"`
	Status         Status  `json:"status"`
	SecretRedacted string  `json:"secret_redacted"`
	SecretLength   int     `json:"secret_length"`
	Entropy        float32 `json:"entropy"`
}

// MarshalJSON encodes the report in the documented schema (docs/preflight.md),
// secrets redacted.
func (r *Report) MarshalJSON() ([]byte, error) {
	jr := jsonReport{
		Version:      JSONVersion,
		Tool:         "vibedom preflight (gitleaks " + gitleaksVersion() + ")",
		Workspace:    r.Workspace,
		ScannedAt:    r.ScannedAt.UTC().Format(time.RFC3339),
		DurationMS:   r.Stats.Duration.Milliseconds(),
		ConfigDigest: r.ConfigDigest,
		Summary: jsonSummary{
			Total:          len(r.Findings),
			Unapproved:     r.count(0, StatusUnapproved),
			UnapprovedHigh: r.count(RiskHigh, StatusUnapproved),
			Approved:       r.count(0, StatusApproved),
			Ignored:        r.count(0, StatusIgnored),
			High:           r.count(RiskHigh, 0),
			Medium:         r.count(RiskMedium, 0),
			Low:            r.count(RiskLow, 0),
		},
		Stats:    r.Stats,
		Skipped:  r.Skipped,
		Warnings: r.Warnings,
		Findings: []jsonFinding{},
	}
	if jr.Skipped == nil {
		jr.Skipped = []Skipped{}
	}
	if jr.Warnings == nil {
		jr.Warnings = []string{}
	}
	for _, f := range r.Findings {
		jr.Findings = append(jr.Findings, jsonFinding{
			Number: f.Number, Fingerprint: f.Fingerprint, File: f.File, Line: f.Line,
			Rule: f.RuleID, Description: f.Description, Risk: f.Risk, Reason: f.Reason,
			Status: f.Status, SecretRedacted: f.Redacted(), SecretLength: f.SecretLength(),
			Entropy: f.Entropy,
		})
	}
	return json.Marshal(jr)
}

// WriteJSON writes the report (secrets redacted) to path, 0600, e.g. the
// session's gitleaks_report.json.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode preflight report: %w", err)
	}
	b = append(b, '\n')
	return atomicfile.WriteFile(path, b, 0o600)
}

// WriteText prints the findings that need review, grouped by risk (HIGH
// first) and numbered, followed by what was approved, ignored or not
// scanned. Every name from the workspace is escaped, so a file name cannot
// move the cursor or hide a line.
func (r *Report) WriteText(w io.Writer) error {
	var b bytes.Buffer
	un := r.Unapproved()
	switch len(un) {
	case 0:
		fmt.Fprintf(&b, "preflight: no secrets need review in %s\n", clean(r.Workspace))
	case 1:
		fmt.Fprintf(&b, "preflight: 1 potential secret needs review in %s\n", clean(r.Workspace))
	default:
		fmt.Fprintf(&b, "preflight: %d potential secrets need review in %s\n", len(un), clean(r.Workspace))
	}
	for _, risk := range []Risk{RiskHigh, RiskMedium, RiskLow} {
		header := false
		for _, f := range un {
			if f.Risk != risk {
				continue
			}
			if !header {
				fmt.Fprintf(&b, "\n%s RISK\n", risk)
				header = true
			}
			fmt.Fprintf(&b, "%3d. %s:%d  %s  %s\n", f.Number, clean(f.File), f.Line, clean(f.RuleID), clean(f.Redacted()))
			fmt.Fprintf(&b, "     → %s\n", clean(f.Reason))
		}
	}
	var notes []string
	if n := r.count(0, StatusApproved); n > 0 {
		notes = append(notes, fmt.Sprintf("%d approved earlier for this workspace", n))
	}
	if n := r.count(0, StatusIgnored); n > 0 {
		notes = append(notes, fmt.Sprintf("%d ignored by %s", n, IgnoreFile))
	}
	fmt.Fprintf(&b, "\n%s: %d scanned, %d unchanged since the last scan", plural(r.Stats.Files, "file"), r.Stats.Scanned, r.Stats.CacheHits)
	if r.Stats.Binary > 0 {
		fmt.Fprintf(&b, ", %d binary (checked by name only)", r.Stats.Binary)
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, "; %s", strings.Join(notes, ", "))
	}
	b.WriteString(".\n")
	if len(r.Skipped) > 0 {
		fmt.Fprintf(&b, "%d file(s) not scanned:\n", len(r.Skipped))
		for i, s := range r.Skipped {
			if i == 5 {
				fmt.Fprintf(&b, "  … and %d more (see the JSON report)\n", len(r.Skipped)-5)
				break
			}
			fmt.Fprintf(&b, "  %s: %s\n", clean(s.Path), clean(s.Reason))
		}
	}
	for _, wn := range r.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", clean(wn))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// clean makes text from the workspace (file names, rule ids and reasons
// from a user config, a secret's shown prefix) safe to print on one line:
// see termtext.Line.
func clean(s string) string { return termtext.Line(s) }

// plural is "1 file", "2 files".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
