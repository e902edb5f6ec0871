package preflight

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/vibedom/vibedom/atomicfile"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ApprovalsFile is where a workspace's approvals live, relative to it.
const ApprovalsFile = ".vibedom/approved_secrets.txt"

const (
	approvalKeySize = 32
	hashPrefix      = "hmac-sha256:"
	approvalsHeader = `# vibedom: secrets approved for this workspace (vibedom preflight).
# Each line: a gitleaks fingerprint (file:rule:line), a tab, and a keyed hash of
# the secret (HMAC-SHA256 under a per-user key kept outside the workspace).
# The secret itself is never written here. A secret whose hash no longer
# matches is asked about again.
`
)

// ErrApprovalKey is returned (wrapped) when the per-user approval key
// cannot be read or made.
var ErrApprovalKey = errors.New("approval key unusable")

// approvalKey is the per-user HMAC key; it redacts itself when printed.
type approvalKey []byte

func (approvalKey) String() string               { return "[REDACTED]" }
func (approvalKey) GoString() string             { return "[REDACTED]" }
func (approvalKey) LogValue() slog.Value         { return slog.StringValue("[REDACTED]") }
func (k approvalKey) Format(f fmt.State, _ rune) { io.WriteString(f, k.String()) }

// loadApprovalKey reads the key at path, creating it (0600, parent 0700)
// on first use. warn is non-empty when the key works but is exposed (other
// users may read it). Errors wrap ErrApprovalKey and say what to do.
func loadApprovalKey(path string) (key approvalKey, warn string, err error) {
	for range 2 { // a second pass when a concurrent run made the key first
		b, fi, err := readKeyFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			k, err := createApprovalKey(path)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return k, "", err
		}
		if err != nil {
			return nil, "", fmt.Errorf("read approval key %q: %w: %v (make it a regular file only you can read, `chmod 600 %s`, or delete it: every approval is then asked again)",
				path, ErrApprovalKey, err, shellQuote(path))
		}
		if len(b) != approvalKeySize {
			return nil, "", fmt.Errorf("approval key %q has %d bytes, want %d: %w (delete it: every approval is then asked again)",
				path, len(b), approvalKeySize, ErrApprovalKey)
		}
		if perm := fi.Mode().Perm(); perm&0o077 != 0 {
			warn = fmt.Sprintf("approval key %s is readable by other users (mode %04o), who could then test guesses of short approved secrets: run `chmod 600 %s`",
				path, perm, shellQuote(path))
		}
		return approvalKey(b), warn, nil
	}
	return nil, "", fmt.Errorf("create approval key %q: %w: it keeps changing under us", path, ErrApprovalKey)
}

// readKeyFile reads the key file, refusing a symlink or anything but a
// regular file.
func readKeyFile(path string) ([]byte, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, approvalKeySize+1))
	return b, fi, err
}

// createApprovalKey makes a new random key at path. The key is written to a
// temporary file and published with a hard link, so a concurrent reader
// never sees a partial key; a key made meanwhile by another run wins
// (fs.ErrExist).
func createApprovalKey(path string) (approvalKey, error) {
	fail := func(err error) (approvalKey, error) {
		return nil, fmt.Errorf("create approval key %q: %w: %v (check that %s is a folder you can write to)",
			path, ErrApprovalKey, err, filepath.Dir(path))
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	k := make([]byte, approvalKeySize)
	if _, err := rand.Read(k); err != nil {
		return fail(err)
	}
	tmp, err := os.CreateTemp(dir, ".approval-key-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(k)
	if err := tmp.Chmod(0o600); werr == nil {
		werr = err
	}
	if err := tmp.Close(); werr == nil {
		werr = err
	}
	if werr != nil {
		return fail(werr)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		return fail(err)
	}
	return approvalKey(k), nil
}

// approvalHash binds a secret to its file and rule, not to its line, so an
// approved secret that moves within its file stays approved.
func (k approvalKey) approvalHash(file, rule, value string) string {
	m := hmac.New(sha256.New, k)
	fmt.Fprintf(m, "vibedom-approval-1\x00%s\x00%s\x00", file, rule)
	io.WriteString(m, value)
	return hashPrefix + hex.EncodeToString(m.Sum(nil))
}

// approvals is the parsed approvals file.
type approvals struct {
	// byHash maps each recorded hash to the "file:rule" part of the
	// fingerprints it was recorded under.
	byHash map[string]map[string]bool
	lines  []approvalLine // in file order, comments and unusable lines kept verbatim
	// err is why the file could not be read. Approving then fails with it
	// rather than overwrite a file that was not understood.
	err error
}

type approvalLine struct {
	raw         string // for comments and lines kept verbatim
	fingerprint string
	hash        string
}

func newApprovals() *approvals { return &approvals{byHash: map[string]map[string]bool{}} }

// approves reports whether a line of the file approves f: a line holding
// f's hash under a fingerprint naming f's file and rule. The hash alone
// would already bind file, rule and secret; requiring the fingerprint to
// agree means no line approves anything but what it says.
func (a *approvals) approves(f Finding) bool {
	return a != nil && f.approvalHash != "" && a.byHash[f.approvalHash][f.File+":"+f.RuleID]
}

func (a *approvals) record(l approvalLine) {
	subject, ok := fingerprintSubject(l.fingerprint)
	if !ok {
		return
	}
	m := a.byHash[l.hash]
	if m == nil {
		m = map[string]bool{}
		a.byHash[l.hash] = m
	}
	m[subject] = true
}

// fingerprintSubject is the "file:rule" part of a "file:rule:line"
// fingerprint. (Files and user rule ids may hold colons, so the split is
// not unique; the keyed hash, which separates them unambiguously, decides.)
func fingerprintSubject(fp string) (string, bool) {
	i := strings.LastIndexByte(fp, ':')
	if i <= 0 || i == len(fp)-1 || strings.Trim(fp[i+1:], "0123456789") != "" {
		return "", false
	}
	subject := fp[:i]
	if j := strings.LastIndexByte(subject, ':'); j <= 0 || j == len(subject)-1 {
		return "", false
	}
	return subject, true
}

// maxApprovalsSize bounds the approvals file (about 100,000 approvals).
const maxApprovalsSize = 16 << 20

// readApprovals reads <workspace>/.vibedom/approved_secrets.txt. A symlink
// in the way is refused: the file is read and written only in place. A
// line that is not a fingerprint, a tab or space, and an hmac-sha256 hash
// of 64 lower-case hex digits approves nothing and is returned as a
// warning (it is kept in the file). The returned approvals are usable even
// with an error; they then approve nothing and refuse to record more.
func readApprovals(workspace string) (*approvals, []string, error) {
	a := newApprovals()
	fail := func(err error) (*approvals, []string, error) {
		a.err = err
		return a, nil, err
	}
	if err := checkVibedomDir(workspace); err != nil {
		return fail(err)
	}
	b, err := readNoFollow(filepath.Join(workspace, ApprovalsFile), maxApprovalsSize+1)
	if errors.Is(err, fs.ErrNotExist) {
		return a, nil, nil
	}
	if err == nil && len(b) > maxApprovalsSize {
		err = fmt.Errorf("larger than %d bytes", maxApprovalsSize)
	}
	if errors.Is(err, syscall.ELOOP) {
		err = errors.New("it is a symbolic link")
	}
	if err != nil {
		return fail(fmt.Errorf("read %s: %v (it must be a regular file in the workspace: fix it, or delete it and every finding is asked again)", ApprovalsFile, errText(err)))
	}
	var warnings []string
	for n, raw := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if len(b) == 0 {
			break
		}
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			a.lines = append(a.lines, approvalLine{raw: raw})
			continue
		}
		l, ok := parseApprovalLine(line)
		if !ok {
			a.lines = append(a.lines, approvalLine{raw: raw})
			warnings = append(warnings, fmt.Sprintf("%s:%d: not an approval (want FILE:RULE:LINE, a tab, and hmac-sha256: with 64 hex digits); it approves nothing: delete the line, or approve the finding again with `vibedom preflight --review`", ApprovalsFile, n+1))
			continue
		}
		a.lines = append(a.lines, l)
		a.record(l)
	}
	return a, warnings, nil
}

// parseApprovalLine reads "fingerprint<TAB>hmac-sha256:<64 hex>"; the
// fingerprint may hold spaces, so the hash is the last field.
func parseApprovalLine(line string) (approvalLine, bool) {
	i := strings.LastIndexAny(line, " \t")
	if i < 0 {
		return approvalLine{}, false
	}
	fp, h := strings.TrimSpace(line[:i]), line[i+1:]
	hexPart, ok := strings.CutPrefix(h, hashPrefix)
	if !ok || len(hexPart) != 2*sha256.Size || strings.ToLower(hexPart) != hexPart {
		return approvalLine{}, false
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return approvalLine{}, false
	}
	if _, ok := fingerprintSubject(fp); !ok {
		return approvalLine{}, false
	}
	return approvalLine{fingerprint: fp, hash: h}, true
}

// add records approvals and rewrites the file atomically.
//
// The file is read again first, so approvals another run recorded since
// this scan are kept. live holds the approval hashes of every finding of
// the current scan. An existing line whose fingerprint is approved again
// now is dropped when its hash is not live: the secret it approved is no
// longer in that file under that rule (it changed), so the new line
// replaces the stale one. A line whose hash is live stays, even under a
// fingerprint approved again (two secrets on one line, or an approved
// secret that moved and another that took its line). A line already
// recorded is not written twice.
func (a *approvals) add(workspace string, entries []approvalLine, live map[string]bool) error {
	if len(entries) == 0 {
		return nil
	}
	if a.err != nil {
		return a.err
	}
	cur, _, err := readApprovals(workspace)
	if err != nil {
		return err
	}
	again := map[string]bool{}
	for _, e := range entries {
		again[e.fingerprint] = true
	}
	have := map[string]bool{}
	var kept []approvalLine
	for _, l := range cur.lines {
		if l.fingerprint != "" {
			k := l.fingerprint + "\t" + l.hash
			if (again[l.fingerprint] && !live[l.hash]) || have[k] {
				continue
			}
			have[k] = true
		}
		kept = append(kept, l)
	}
	for _, e := range entries {
		if k := e.fingerprint + "\t" + e.hash; !have[k] {
			kept = append(kept, e)
			have[k] = true
		}
	}
	var out bytes.Buffer
	if len(cur.lines) == 0 {
		out.WriteString(approvalsHeader)
	}
	for _, l := range kept {
		if l.fingerprint == "" {
			out.WriteString(l.raw + "\n")
			continue
		}
		fmt.Fprintf(&out, "%s\t%s\n", l.fingerprint, l.hash)
	}
	if err := writeWorkspaceFile(workspace, ApprovalsFile, out.Bytes()); err != nil {
		return err
	}
	a.lines = kept
	a.byHash = map[string]map[string]bool{}
	for _, l := range kept {
		if l.fingerprint != "" {
			a.record(l)
		}
	}
	return nil
}

// checkVibedomDir refuses a <workspace>/.vibedom that is not a directory
// (a symlink there could aim writes anywhere).
func checkVibedomDir(workspace string) error {
	fi, err := os.Lstat(filepath.Join(workspace, ".vibedom"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check %s/.vibedom: %w", workspace, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s/.vibedom is not a directory (it is %s); remove it to keep approvals", workspace, fi.Mode().Type())
	}
	return nil
}

// writeWorkspaceFile writes rel (under .vibedom/) via a temporary file and
// a rename, never through a symlink.
func writeWorkspaceFile(workspace, rel string, data []byte) error {
	if err := checkVibedomDir(workspace); err != nil {
		return err
	}
	dst := filepath.Join(workspace, rel)
	if err := os.Mkdir(filepath.Dir(dst), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", filepath.Dir(dst), err)
	}
	if err := checkVibedomDir(workspace); err != nil { // raced into a symlink?
		return err
	}
	if fi, err := os.Lstat(dst); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file; remove it to keep approvals", dst)
	}
	return atomicfile.WriteFile(dst, data, 0o644)
}

// readNoFollow reads a regular file of at most limit bytes, refusing a
// symlink at the last path element.
func readNoFollow(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}
