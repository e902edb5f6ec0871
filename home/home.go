// Package home is the layout of vibedom's state directory, ~/.vibedom (or
// $VIBEDOM_HOME): the Home type, one method per path beneath it, and every
// file and folder name under it, spelled once here.
//
// What it does: names paths. Every package that reads or writes under the
// home asks a Home for the path (or, taking a plain folder, is handed one
// of its methods' results), so a name changes in one place.
//
// What it does not do: it creates, reads and writes nothing (the package
// that owns a file does, see ARCHITECTURE.md's "On disk"), checks no
// permissions and logs nothing. It imports no package of this project, so
// every room may import it.
package home

import (
	"fmt"
	"os"
	"path/filepath"
)

// EnvHome names the environment variable that moves the home.
const EnvHome = "VIBEDOM_HOME"

// DirName is the home's name inside the user's home directory.
const DirName = ".vibedom"

// File and folder names directly under the home.
const (
	SessionsDir    = "sessions"    // one folder per session (package session)
	LogsDir        = "logs"        // one folder per session's logs
	ImagesDir      = "images"      // the image cache (package image)
	CADir          = "ca"          // the MITM certificate authority (package keys)
	KeysDir        = "keys"        // deploy key, audit key, preflight approval key
	CacheDir       = "cache"       // caches that can be deleted at any time
	CredentialsDir = "credentials" // host-held API keys and tokens
	AgentsDir      = "agents"      // verified agent CLIs (package agents)
	AssetsDir      = "assets"      // test image assets (scripts/fetch-assets.sh)
	GuestDir       = "guest"       // guest image manifests, <alpine arch>.json

	TrustedDomainsFile     = "trusted_domains.txt"      // the user's allowlist
	DLPClassesFile         = "dlp_classes.txt"          // the user's DLP destination classes
	GitleaksConfigFile     = "gitleaks.toml"            // the user's extra gitleaks rules
	ConfigFile             = "config"                   // "key = value" settings
	PackagesFile           = "packages.txt"             // extra guest packages, one a line
	WorkspaceApprovalsFile = "workspace_approvals.json" // approved workspace files, by hash
)

// Names under the folders above.
const (
	APKCacheDir          = "apk"                     // under cache/: verified Alpine packages
	NPMCacheDir          = "npm"                     // under cache/: agent tarballs
	PreflightCacheDir    = "preflight"               // under cache/: secrets scan results
	GuestAgentCacheDir   = "guest-agent"             // under cache/: a release binary's guest agents, by hash
	RootImagesDir        = "root"                    // under images/: root images by sha256
	PreflightApprovalKey = "preflight_approvals.key" // under keys/
	guestManifestSuffix  = ".json"                   // under guest/
)

// Home is the vibedom state directory and the layout beneath it. See
// ARCHITECTURE.md, "On disk".
type Home string

// Default returns $VIBEDOM_HOME (made absolute) when set, else
// ~/.vibedom.
func Default() (Home, error) {
	if h := os.Getenv(EnvHome); h != "" {
		abs, err := filepath.Abs(h)
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", EnvHome, err)
		}
		return Home(abs), nil
	}
	u, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory (set %s): %w", EnvHome, err)
	}
	return Home(filepath.Join(u, DirName)), nil
}

func (h Home) path(elem ...string) string {
	return filepath.Join(append([]string{string(h)}, elem...)...)
}

// Sessions is the folder holding one folder per session.
func (h Home) Sessions() string { return h.path(SessionsDir) }

// Session is the folder of the named session.
func (h Home) Session(name string) string { return h.path(SessionsDir, name) }

// Logs is the folder of session log folders.
func (h Home) Logs() string { return h.path(LogsDir) }

// Images is the image cache.
func (h Home) Images() string { return h.path(ImagesDir) }

// CA is the MITM certificate authority's folder.
func (h Home) CA() string { return h.path(CADir) }

// Keys is the folder of the deploy key and the audit log key.
func (h Home) Keys() string { return h.path(KeysDir) }

// Cache is the folder of caches that can be deleted at any time.
func (h Home) Cache() string { return h.path(CacheDir) }

// Credentials is the folder of host-held API keys and tokens.
func (h Home) Credentials() string { return h.path(CredentialsDir) }

// Agents is the folder of installed agent CLIs.
func (h Home) Agents() string { return h.path(AgentsDir) }

// Assets is the folder of test image assets (<arch>/kernel/, <arch>/busybox).
func (h Home) Assets() string { return h.path(AssetsDir) }

// APKCache is the cache of verified Alpine packages.
func (h Home) APKCache() string { return h.path(CacheDir, APKCacheDir) }

// NPMCache is the cache of agent tarballs.
func (h Home) NPMCache() string { return h.path(CacheDir, NPMCacheDir) }

// PreflightCache is the secrets scan's cache folder.
func (h Home) PreflightCache() string { return h.path(CacheDir, PreflightCacheDir) }

// GuestAgentCache is the private folder a release binary extracts its
// guest agents into.
func (h Home) GuestAgentCache() string { return h.path(CacheDir, GuestAgentCacheDir) }

// PreflightApprovalKey is the key that signs the user's secrets approvals.
func (h Home) PreflightApprovalKey() string { return h.path(KeysDir, PreflightApprovalKey) }

// TrustedDomains is the user's allowlist file.
func (h Home) TrustedDomains() string { return h.path(TrustedDomainsFile) }

// DLPClasses is the user's destination classes for the DLP.
func (h Home) DLPClasses() string { return h.path(DLPClassesFile) }

// GitleaksConfig is the user's extension of the default gitleaks rules.
func (h Home) GitleaksConfig() string { return h.path(GitleaksConfigFile) }

// Config is the user's settings file.
func (h Home) Config() string { return h.path(ConfigFile) }

// PackagesFile is the user's list of extra guest packages.
func (h Home) PackagesFile() string { return h.path(PackagesFile) }

// WorkspaceApprovals is the store of approved workspace files.
func (h Home) WorkspaceApprovals() string { return h.path(WorkspaceApprovalsFile) }

// GuestManifest is the guest image manifest for an Alpine arch.
func (h Home) GuestManifest(alpineArch string) string {
	return h.path(GuestDir, alpineArch+guestManifestSuffix)
}
