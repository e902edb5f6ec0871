package session

import (
	"fmt"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/preflight"
	"os"
	"path/filepath"
)

// Home is the vibedom state directory (~/.vibedom, or $VIBEDOM_HOME) and the
// layout beneath it. See ARCHITECTURE.md, "On disk".
type Home string

// DefaultHome returns $VIBEDOM_HOME when set, else ~/.vibedom.
func DefaultHome() (Home, error) {
	if h := os.Getenv("VIBEDOM_HOME"); h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return "", fmt.Errorf("resolve VIBEDOM_HOME: %w", err)
		}
		return Home(abs), nil
	}
	u, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory (set VIBEDOM_HOME): %w", err)
	}
	return Home(filepath.Join(u, ".vibedom")), nil
}

func (h Home) path(elem ...string) string {
	return filepath.Join(append([]string{string(h)}, elem...)...)
}

// Sessions is the folder holding one folder per session.
func (h Home) Sessions() string { return h.path("sessions") }

// Session is the folder of the named session.
func (h Home) Session(name string) string { return h.path("sessions", name) }

// Logs is the folder of session log folders.
func (h Home) Logs() string { return h.path("logs") }

// Images is the image cache.
func (h Home) Images() string { return h.path("images") }

// CA is the MITM certificate authority's folder.
func (h Home) CA() string { return h.path("ca") }

// Keys is the folder of the deploy key and the audit log key.
func (h Home) Keys() string { return h.path("keys") }

// Cache is the folder of caches that can be deleted at any time.
func (h Home) Cache() string { return h.path("cache") }

// TrustedDomains is the user's allowlist file.
func (h Home) TrustedDomains() string { return h.path("trusted_domains.txt") }

// DLPClasses is the user's destination classes for the DLP.
func (h Home) DLPClasses() string { return h.path("dlp_classes.txt") }

// GitleaksConfig is the user's extension of the default gitleaks rules.
func (h Home) GitleaksConfig() string { return h.path("gitleaks.toml") }

// ensureDir makes dir (and its parents) with mode 0700 and checks that an
// existing dir is not group- or world-writable.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by other users (mode %v): run chmod go-w %s", dir, fi.Mode().Perm(), dir)
	}
	return nil
}

// File and folder names under the home that are not spelled above.
const (
	preflightCacheDir    = "preflight"               // under cache/
	preflightApprovalKey = "preflight_approvals.key" // under keys/
)

// AuditKey is the DLP audit key file.
func (h Home) AuditKey() string { return h.path("keys", keys.AuditKeyName) }

// PreflightOptions are the secrets scan's options for workspace, with
// this home's gitleaks config, cache and approval key.
func (h Home) PreflightOptions(workspace string) preflight.Options {
	return preflight.Options{
		Workspace:       workspace,
		UserConfig:      h.GitleaksConfig(),
		CacheDir:        filepath.Join(h.Cache(), preflightCacheDir),
		ApprovalKeyPath: filepath.Join(h.Keys(), preflightApprovalKey),
	}
}
