package policy

import (
	"bytes"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/wstrust"
)

// DLPOptions configure the scrubbing of what the agent sends out.
type DLPOptions struct {
	// AllowPatterns are values never redacted (--allow-pattern; "re:"
	// prefixes a regular expression).
	AllowPatterns []string
	// AllowContexts are categories let through to every destination
	// (--allow-context, e.g. internal_ips).
	AllowContexts []string
}

// DLPConfig gathers what the DLP engine of a session scrubs: the known
// values (the preflight's secrets and the workspace's .env secrets), the
// destination classes (~/.vibedom/dlp_classes.txt) and the allowlists
// (<workspace>/.vibedom/dlp_allowlist.txt and the options). preflightSecrets
// may be nil. It reports what it loaded in notes, for the user.
func DLPConfig(h home.Home, workspace string, preflightSecrets []string, o DLPOptions) (dlp.Config, []string, error) {
	var cfg dlp.Config
	var notes []string
	// .env values first: their sources (file, line, name) are the more
	// precise when both found the same value.
	if workspace != "" {
		env, warnings, err := workspaceEnvSecrets(workspace)
		if err != nil {
			return cfg, nil, fmt.Errorf("read the workspace's .env files: %w", err)
		}
		cfg.Secrets = append(cfg.Secrets, env...)
		notes = append(notes, warnings...)
	}
	for _, s := range preflightSecrets {
		cfg.Secrets = append(cfg.Secrets, dlp.Secret{Value: s, Source: "preflight (gitleaks)"})
	}
	rules, err := dlp.LoadClassRules(h.DLPClasses())
	if err != nil {
		return cfg, nil, fmt.Errorf("destination classes: %w (fix the file or remove it)", err)
	}
	cfg.ClassRules = rules
	var allow dlp.Allowlist
	if workspace != "" {
		// The allowlist widens what leaves the VM unscrubbed: like the
		// workspace's allow rules, it applies only once approved.
		trust, err := LoadTrust(h, workspace)
		if err != nil {
			return cfg, nil, err
		}
		f := trust.File(wstrust.DLPAllowlistRel)
		wsFile := WorkspaceDLPAllowlist(workspace)
		switch {
		case f == nil || !f.Present || len(f.Widening) == 0:
		case !f.Approved():
			notes = append(notes, wstrust.IgnoredNote(trust, f.Rel, len(f.Widening), "DLP allowlist entry", "DLP allowlist entries"))
		default:
			allow, err = dlp.ParseAllowlist(bytes.NewReader(f.Data()), wsFile)
			if err != nil {
				return cfg, nil, fmt.Errorf("DLP allowlist: %w (fix the file or remove it)", err)
			}
			notes = append(notes, fmt.Sprintf("%s (approved) exempts %s from scrubbing", wsFile, allow))
		}
	}
	for _, p := range o.AllowPatterns {
		a, err := dlp.ParseAllowPattern(p)
		if err != nil {
			return cfg, nil, err
		}
		allow = allow.Merge(a)
	}
	for _, c := range o.AllowContexts {
		for _, name := range strings.Split(c, ",") {
			if strings.TrimSpace(name) == "" {
				continue
			}
			cat, err := dlp.ParseCategory(name)
			if err != nil {
				return cfg, nil, fmt.Errorf("--allow-context: %w", err)
			}
			allow.Categories = append(allow.Categories, cat)
		}
	}
	cfg.Allow = allow
	return cfg, notes, nil
}

// WorkspaceDLPAllowlist is the workspace's DLP allowlist file, read from
// the host's copy.
func WorkspaceDLPAllowlist(workspace string) string {
	return filepath.Join(workspace, ".vibedom", "dlp_allowlist.txt")
}

// Limits of workspaceEnvSecrets.
const (
	maxEnvFiles    = 200
	maxEnvFileSize = 1 << 20
)

// envSkipDirs are not searched for environment files.
var envSkipDirs = map[string]bool{".git": true, "node_modules": true, ".venv": true, "venv": true, "__pycache__": true}

// workspaceEnvSecrets finds the environment files of a workspace
// (dlp.IsEnvFile; .git, node_modules and virtualenvs skipped, never
// through a symlink, files over 1 MiB skipped) and returns their secrets
// (dlp.EnvSecrets) with workspace-relative sources. Problems that skip a
// file are returned as warnings.
func workspaceEnvSecrets(workspace string) ([]dlp.Secret, []string, error) {
	var secrets []dlp.Secret
	var warnings []string
	files := 0
	err := filepath.WalkDir(workspace, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == workspace {
				return err
			}
			warnings = append(warnings, fmt.Sprintf("skipped %s: %v", p, err))
			return nil
		}
		if d.IsDir() {
			if p != workspace && envSkipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !dlp.IsEnvFile(d.Name()) {
			return nil
		}
		rel, err := filepath.Rel(workspace, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if files++; files > maxEnvFiles {
			warnings = append(warnings, fmt.Sprintf("more than %d environment files: %s and later ones not read", maxEnvFiles, rel))
			return filepath.SkipAll
		}
		data, err := overlay.ReadWorkspaceFile(workspace, rel, maxEnvFileSize)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("skipped %v", err))
			return nil
		}
		secrets = append(secrets, dlp.EnvSecrets(dlp.ParseEnv(data), rel)...)
		return nil
	})
	return secrets, warnings, err
}
