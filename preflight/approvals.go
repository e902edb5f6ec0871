package preflight

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
// on first use.
func loadApprovalKey(path string) (approvalKey, error) {
	b, err := readNoFollow(path, approvalKeySize+1)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("create approval key %q: %w: %w", path, ErrApprovalKey, err)
		}
		k := make([]byte, approvalKeySize)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("create approval key %q: %w: %w", path, ErrApprovalKey, err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if errors.Is(err, fs.ErrExist) { // made by a concurrent run
			return loadApprovalKey(path)
		}
		if err != nil {
			return nil, fmt.Errorf("create approval key %q: %w: %w", path, ErrApprovalKey, err)
		}
		_, werr := f.Write(k)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(path)
			return nil, fmt.Errorf("write approval key %q: %w: %w", path, ErrApprovalKey, werr)
		}
		return approvalKey(k), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read approval key %q: %w: %w", path, ErrApprovalKey, err)
	}
	if len(b) != approvalKeySize {
		return nil, fmt.Errorf("approval key %q has %d bytes, want %d: %w (delete it; approvals will be asked again)", path, len(b), approvalKeySize, ErrApprovalKey)
	}
	return approvalKey(b), nil
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
	hashes map[string]bool
	lines  []approvalLine // in file order, comments and unknown lines kept
}

type approvalLine struct {
	raw         string // for comments and lines kept verbatim
	fingerprint string
	hash        string
}

// readApprovals reads <workspace>/.vibedom/approved_secrets.txt. A symlink
// in the way is refused: the file is read and written only in place.
func readApprovals(workspace string) (*approvals, error) {
	a := &approvals{hashes: map[string]bool{}}
	if err := checkVibedomDir(workspace); err != nil {
		return a, err
	}
	b, err := readNoFollow(filepath.Join(workspace, ApprovalsFile), 16<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return a, fmt.Errorf("read %s: %w", ApprovalsFile, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		raw := sc.Text()
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(line, "#") {
			a.lines = append(a.lines, approvalLine{raw: raw})
			continue
		}
		i := strings.LastIndexAny(line, " \t")
		if i < 0 || !strings.HasPrefix(line[i+1:], hashPrefix) {
			a.lines = append(a.lines, approvalLine{raw: raw})
			continue
		}
		fp, h := strings.TrimSpace(line[:i]), line[i+1:]
		a.hashes[h] = true
		a.lines = append(a.lines, approvalLine{fingerprint: fp, hash: h})
	}
	if err := sc.Err(); err != nil {
		return a, fmt.Errorf("read %s: %w", ApprovalsFile, err)
	}
	return a, nil
}

// add records approvals and rewrites the file atomically.
//
// live holds the approval hashes of every finding of the current scan. An
// existing line whose fingerprint is approved again now is dropped when its
// hash is not live: the secret it approved is no longer in that file under
// that rule (it changed), so the new line replaces the stale one. A line
// whose hash is live stays, even under a fingerprint approved again (two
// secrets on one line, or an approved secret that moved and another that
// took its line). A hash already recorded is not written twice.
func (a *approvals) add(workspace string, entries []approvalLine, live map[string]bool) error {
	if len(entries) == 0 {
		return nil
	}
	again := map[string]bool{}
	for _, e := range entries {
		again[e.fingerprint] = true
	}
	have := map[string]bool{}
	var kept []approvalLine
	for _, l := range a.lines {
		if l.fingerprint != "" {
			if (again[l.fingerprint] && !live[l.hash]) || have[l.hash] {
				continue
			}
			have[l.hash] = true
		}
		kept = append(kept, l)
	}
	for _, e := range entries {
		if !have[e.hash] {
			kept = append(kept, e)
			have[e.hash] = true
		}
	}
	var out bytes.Buffer
	if len(a.lines) == 0 {
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
	for _, e := range entries {
		a.hashes[e.hash] = true
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
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".approved-*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
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
