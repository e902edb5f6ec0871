package preflight

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zricethezav/gitleaks/v8/config"
	"github.com/zricethezav/gitleaks/v8/detect"
	"github.com/zricethezav/gitleaks/v8/report"
)

// DefaultMaxFileSize is the largest file whose contents are scanned when
// Options.MaxFileSize is 0.
const DefaultMaxFileSize = 10 << 20

// binarySniff is how much of a file is searched for a NUL byte to call it
// binary (git's heuristic).
const binarySniff = 8000

// ErrNotDirectory is returned (wrapped) when the workspace is not a
// directory.
var ErrNotDirectory = errors.New("workspace is not a directory")

// Options configure a scan.
type Options struct {
	// Workspace is the directory to scan. Required.
	Workspace string
	// UserConfig is a gitleaks TOML file extending the default rules
	// (typically ~/.vibedom/gitleaks.toml). A missing file, or "", means the
	// default rules alone.
	UserConfig string
	// CacheDir holds the scan cache (typically ~/.vibedom/cache/preflight).
	// "" disables caching.
	CacheDir string
	// ApprovalKeyPath is the per-user key the approvals are hashed with
	// (typically ~/.vibedom/keys/preflight_approvals.key); it is created on
	// first use. Required.
	ApprovalKeyPath string
	// Workers is the number of files scanned at once; 0 means GOMAXPROCS.
	Workers int
	// MaxFileSize is the largest file whose contents are scanned; larger
	// files are checked by path only and listed in Report.Skipped. 0 means
	// DefaultMaxFileSize; negative means no limit.
	MaxFileSize int64
	// Logger receives progress and problems; nil means silent. It never
	// receives a secret.
	Logger *slog.Logger

	// Test hooks. onScanFile, when set, runs in the worker before each file
	// is decided. noStatMemo makes every file be read and hashed, as if no
	// stat were trusted (to measure what the stat memo saves). statTrusted
	// replaces the file system check of the same name.
	onScanFile  func(rel string)
	noStatMemo  bool
	statTrusted func(path string) (bool, string)
}

type job struct {
	rel string
	abs string
	d   fs.DirEntry
}

// rawFinding is a gitleaks finding with what the risk and approval need.
type rawFinding struct {
	f           report.Finding
	contentHash [32]byte
}

// scanner is the state of one Scan shared by its workers.
type scanner struct {
	root    string
	rules   *rules
	cache   *cache
	maxSize int64
	log     *slog.Logger

	onScanFile func(rel string)
	noStatMemo bool
	fsTrust    fsTrust

	mu       sync.Mutex
	stats    Stats
	skipped  []Skipped
	findings []rawFinding
}

// Scan runs gitleaks over the workspace and classifies what it finds.
//
// It skips .git (directories and files of that name, at any depth) and
// anything a global gitleaks allowlist names, but not what .gitignore
// names. It never follows a symlink and never opens anything but a regular
// file. Binary files and files over MaxFileSize are checked by path only.
// Findings listed in .gitleaksignore are kept in the report as
// StatusIgnored; those matching .vibedom/approved_secrets.txt as
// StatusApproved.
func Scan(ctx context.Context, opts Options) (*Report, error) {
	start := time.Now()
	if opts.Workspace == "" {
		return nil, errors.New("preflight: no workspace given")
	}
	if opts.ApprovalKeyPath == "" {
		return nil, errors.New("preflight: Options.ApprovalKeyPath is empty")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	given, err := filepath.Abs(opts.Workspace)
	if err != nil {
		return nil, fmt.Errorf("resolve workspace %q: %w", opts.Workspace, err)
	}
	root, err := filepath.EvalSymlinks(given)
	if err != nil {
		return nil, fmt.Errorf("resolve workspace %q: %w", opts.Workspace, err)
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("scan workspace %q: %w", root, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("scan workspace %q: %w", root, ErrNotDirectory)
	}

	rs, err := loadRules(opts.UserConfig)
	if err != nil {
		return nil, err
	}
	rep := &Report{Workspace: root, ConfigDigest: rs.digest, ScannedAt: start}

	// Approvals fail towards asking: without a usable key or approvals
	// file nothing is approved, the report says why, and approving fails
	// with the same reason.
	key, keyWarn, keyErr := loadApprovalKey(opts.ApprovalKeyPath)
	if keyWarn != "" {
		rep.Warnings = append(rep.Warnings, keyWarn)
	}
	ign, warns := readIgnore(root, []string{given, root})
	rep.Warnings = append(rep.Warnings, warns...)
	appr, warns, err := readApprovals(root)
	rep.Warnings = append(rep.Warnings, warns...)
	switch {
	case keyErr != nil:
		appr.err = keyErr
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("approvals not used, every finding is asked about: %v", keyErr))
	case err != nil:
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("approvals not used, every finding is asked about: %v", err))
	}
	rep.approvals = appr

	s := &scanner{root: root, rules: rs, log: log, maxSize: opts.MaxFileSize, onScanFile: opts.onScanFile, noStatMemo: opts.noStatMemo}
	s.fsTrust = fsTrust{probe: statTrusted, log: log, byDev: map[uint64]bool{}}
	if opts.statTrusted != nil {
		s.fsTrust.probe = opts.statTrusted
	}
	if s.maxSize == 0 {
		s.maxSize = DefaultMaxFileSize
	}
	if opts.CacheDir != "" {
		c, warn := openCache(opts.CacheDir, rs.digest, root, start)
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
			log.Warn("preflight cache unusable", "dir", opts.CacheDir, "err", warn)
		}
		s.cache = c
	}

	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan job, 256)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			det := s.newDetector()
			for j := range jobs {
				if ctx.Err() != nil {
					continue // drain
				}
				if s.onScanFile != nil {
					s.onScanFile(j.rel)
				}
				s.scanFile(ctx, det, j)
			}
		})
	}
	walkErr := s.walk(ctx, jobs)
	close(jobs)
	wg.Wait()
	if walkErr != nil {
		return nil, fmt.Errorf("scan workspace %q: %w", root, walkErr)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scan workspace %q: %w", root, err)
	}

	rep.Findings = s.classify(key, ign, appr)
	rep.Skipped = s.skipped
	slices.SortFunc(rep.Skipped, func(a, b Skipped) int { return strings.Compare(a.Path, b.Path) })
	rep.Stats = s.stats
	if s.cache != nil {
		if err := s.cache.save(); err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("preflight cache not saved: %v", err))
			log.Warn("preflight cache not saved", "err", err)
		}
	}
	rep.Stats.Duration = time.Since(start)
	log.Info("preflight scan done", "workspace", root, "workers", workers, "files", rep.Stats.Files,
		"scanned", rep.Stats.Scanned, "cache_hits", rep.Stats.CacheHits,
		"findings", len(rep.Findings), "unapproved", len(rep.Unapproved()), "duration", rep.Stats.Duration)
	return rep, nil
}

func (s *scanner) newDetector() *detect.Detector {
	d := detect.NewDetector(s.rules.cfg)
	d.MaxDecodeDepth = maxDecodeDepth
	return d
}

// pathAllowlisted mirrors gitleaks' directory walk: a path matching any
// global allowlist's paths is not scanned.
func (s *scanner) pathAllowlisted(rel string) bool {
	for _, a := range s.rules.cfg.Allowlists {
		if a.MatchCondition == config.AllowlistMatchOr && a.PathAllowed(rel) {
			return true
		}
	}
	return false
}

func (s *scanner) walk(ctx context.Context, jobs chan<- job) error {
	return filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if p == s.root {
			return err // an unreadable root is fatal
		}
		rel, relErr := filepath.Rel(s.root, p)
		if relErr != nil {
			return relErr
		}
		rel = filepath.ToSlash(rel)
		if err != nil {
			s.skip(rel, "unreadable: "+errText(err))
			if d != nil && d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == ".git" {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			s.count(func(st *Stats) { st.Symlinks++ })
			return nil
		case t.IsDir():
			if s.pathAllowlisted(rel) {
				s.count(func(st *Stats) { st.Allowlisted++ })
				return filepath.SkipDir
			}
			return nil
		case !t.IsRegular():
			s.count(func(st *Stats) { st.Special++ })
			return nil
		}
		if (s.cache == nil || !s.cache.scannedBefore(rel)) && s.pathAllowlisted(rel) {
			s.count(func(st *Stats) { st.Allowlisted++ })
			return nil
		}
		select {
		case jobs <- job{rel: rel, abs: p, d: d}:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
}

// fsTrust remembers, per device, whether the memo may trust stat there
// (see statTrusted). A file elsewhere is read and hashed on every scan:
// its verdict still comes from the content-addressed cache.
type fsTrust struct {
	probe func(path string) (bool, string)
	log   *slog.Logger

	mu    sync.Mutex
	byDev map[uint64]bool
}

func (f *fsTrust) trusted(dev uint64, path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok, seen := f.byDev[dev]
	if !seen {
		var name string
		ok, name = f.probe(path)
		f.byDev[dev] = ok
		if !ok {
			f.log.Info("preflight: stat not trusted on this file system; its files are read and hashed on every scan", "fs", name, "file", path)
		}
	}
	return ok
}

func (s *scanner) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *scanner) skip(rel, reason string) {
	s.mu.Lock()
	s.skipped = append(s.skipped, Skipped{Path: rel, Reason: reason})
	s.mu.Unlock()
}

func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// scanFile decides one file: from the cache when its bytes and path are
// known clean, else by reading it (never through a symlink) and running the
// rules.
func (s *scanner) scanFile(ctx context.Context, det *detect.Detector, j job) {
	fi, err := j.d.Info()
	if err != nil {
		s.skip(j.rel, "unreadable: "+errText(err))
		return
	}
	s.count(func(st *Stats) { st.Files++ })
	if fi.Size() == 0 {
		s.count(func(st *Stats) { st.Empty++ })
		return
	}
	st, haveStat := statID(fi)
	useMemo := s.cache != nil && haveStat && !s.noStatMemo && s.fsTrust.trusted(st.Dev, j.abs)
	if useMemo {
		if h, ok := s.cache.lookupHash(j.rel, st); ok && s.cache.isClean(h, j.rel) {
			s.count(func(st *Stats) { st.CacheHits++ })
			return
		}
	}

	f, err := os.OpenFile(j.abs, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		s.skip(j.rel, "unreadable: "+errText(err))
		return
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil {
		s.skip(j.rel, "unreadable: "+errText(err))
		return
	}
	if !ofi.Mode().IsRegular() { // replaced since the walk
		s.skip(j.rel, "no longer a regular file")
		return
	}
	if s.maxSize > 0 && ofi.Size() > s.maxSize {
		// Too large to scan: a binary is checked by name as any binary is;
		// a large text file is also listed, so the user knows.
		head := make([]byte, binarySniff)
		n, _ := io.ReadFull(f, head)
		if bytes.IndexByte(head[:n], 0) >= 0 {
			s.count(func(st *Stats) { st.Binary++ })
		} else {
			s.count(func(st *Stats) { st.TooLarge++ })
			s.skip(j.rel, fmt.Sprintf("text file of %d bytes, over the %d-byte limit: not scanned", ofi.Size(), s.maxSize))
		}
		s.detectPath(ctx, det, j.rel, f)
		return
	}
	readAt := time.Now()
	limit := s.maxSize
	if limit <= 0 {
		limit = 1<<63 - 1
	}
	buf := bytes.NewBuffer(make([]byte, 0, ofi.Size()+1))
	if _, err := io.Copy(buf, io.LimitReader(f, limit)); err != nil {
		s.skip(j.rel, "unreadable: "+errText(err))
		return
	}
	content := buf.Bytes()
	hash := sha256.Sum256(content)
	if s.cache != nil {
		if ost, ok := statID(ofi); ok && useMemo {
			s.cache.remember(j.rel, ost, hash, readAt)
		}
		if s.cache.isClean(hash, j.rel) {
			s.count(func(st *Stats) { st.CacheHits++ })
			return
		}
	}

	var found []report.Finding
	if bytes.IndexByte(content[:min(len(content), binarySniff)], 0) >= 0 {
		s.count(func(st *Stats) { st.Binary++ })
		found = det.DetectContext(ctx, detect.Fragment{FilePath: j.rel}) // path rules only
	} else {
		s.count(func(st *Stats) { st.Scanned++; st.BytesScanned += int64(len(content)) })
		found = det.DetectContext(ctx, detect.Fragment{Raw: string(content), FilePath: j.rel, StartLine: 1})
	}
	if ctx.Err() != nil {
		return // an interrupted scan proves nothing
	}
	if len(found) == 0 {
		if s.cache != nil {
			s.cache.markClean(hash, j.rel)
		}
		return
	}
	s.add(found, hash)
}

// detectPath runs the path-only rules (e.g. pkcs12-file) for a file too
// large to scan. A path-only finding is approved for the file's content, so
// only then is the whole file read, to hash it.
func (s *scanner) detectPath(ctx context.Context, det *detect.Detector, rel string, f *os.File) {
	found := det.DetectContext(ctx, detect.Fragment{FilePath: rel})
	if len(found) == 0 {
		return
	}
	h := sha256.New()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		s.skip(rel, "unreadable: "+errText(err))
	} else if _, err := io.Copy(h, f); err != nil {
		s.skip(rel, "unreadable: "+errText(err))
	}
	// On a read error the hash is of what was read: an approval then
	// matches nothing later, which asks again (never approves more).
	var sum [32]byte
	h.Sum(sum[:0])
	s.add(found, sum)
}

func (s *scanner) add(found []report.Finding, hash [32]byte) {
	s.mu.Lock()
	for _, f := range found {
		s.findings = append(s.findings, rawFinding{f: f, contentHash: hash})
	}
	s.mu.Unlock()
}

// classify turns raw findings into the report's, deduplicated by
// fingerprint and secret, with risk, reason, status and prompt number.
func (s *scanner) classify(key approvalKey, ign ignoreSet, appr *approvals) []Finding {
	seen := map[string]bool{}
	var out []Finding
	for _, rf := range s.findings {
		g := rf.f
		fp := fingerprint(g.File, g.RuleID, g.StartLine)
		if seen[fp+"\x00"+g.Secret] {
			continue
		}
		seen[fp+"\x00"+g.Secret] = true
		risk, reason := classify(g.File, g.RuleID, g.Description, g.Secret, g.Match, g.Line)
		value := g.Secret
		if value == "" { // a path-only rule: approve these bytes at this path
			value = "sha256:" + hex.EncodeToString(rf.contentHash[:])
		}
		f := Finding{
			Fingerprint: fp, File: g.File, Line: g.StartLine, RuleID: g.RuleID,
			Description: g.Description, Risk: risk, Reason: reason, Entropy: g.Entropy,
			secret: g.Secret,
		}
		if key != nil {
			f.approvalHash = key.approvalHash(g.File, g.RuleID, value)
		}
		switch {
		case ign[fp]:
			f.Status = StatusIgnored
		case appr.approves(f):
			f.Status = StatusApproved
		default:
			f.Status = StatusUnapproved
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Finding) int {
		return cmp.Or(
			cmp.Compare(b.Risk, a.Risk),
			strings.Compare(a.File, b.File),
			cmp.Compare(a.Line, b.Line),
			strings.Compare(a.RuleID, b.RuleID),
			strings.Compare(a.secret, b.secret),
		)
	})
	n := 0
	for i := range out {
		if out[i].Status == StatusUnapproved {
			n++
			out[i].Number = n
		}
	}
	return out
}
