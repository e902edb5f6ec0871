package session

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/overlay"
	"github.com/vibedom/vibedom/preflight"
	"github.com/vibedom/vibedom/termtext"
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
func DLPConfig(h Home, workspace string, preflightSecrets []string, o DLPOptions) (dlp.Config, []string, error) {
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
		trust, err := LoadWorkspaceTrust(h, workspace)
		if err != nil {
			return cfg, nil, err
		}
		f := trust.File(WorkspaceDLPAllowlistRel)
		wsFile := WorkspaceDLPAllowlist(workspace)
		switch {
		case f == nil || !f.Present || len(f.Widening) == 0:
		case !f.Approved():
			notes = append(notes, ignoredNote(trust, f.Rel, len(f.Widening), "DLP allowlist entry", "DLP allowlist entries"))
		default:
			allow, err = dlp.ParseAllowlist(bytes.NewReader(f.data), wsFile)
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

// setupDLP builds the session's DLP engine and encrypted audit log and
// plugs them into the proxy, unless a test gave a filter of its own.
func (s *sess) setupDLP() error {
	o := &s.opts
	if o.Egress.Disabled || o.Egress.Filter != nil {
		return nil
	}
	var found []string
	if s.secrets != nil {
		found = s.secrets.Secrets()
	}
	cfg, notes, err := DLPConfig(o.Home, o.Workspace, found, o.DLP)
	if err != nil {
		return err
	}
	if err := s.setupCredentials(); err != nil {
		return err
	}
	if s.creds != nil {
		cfg.Secrets = append(cfg.Secrets, s.creds.KnownValues()...)
	}
	e, err := dlp.New(cfg)
	if err != nil {
		return err
	}
	for _, n := range notes {
		s.progress("DLP: %s", termtext.Inline(n))
		s.log.Info("dlp", "note", n)
	}
	s.progress("DLP: scrubbing %d known values (%d from the preflight, the rest from .env files) and the built-in recognizers", e.KnownValues(), len(found))
	key, _, err := keys.EnsureAuditKey(o.Home.Keys())
	if err != nil {
		return fmt.Errorf("the DLP audit key: %w", err)
	}
	audit, err := dlp.CreateAuditLog(filepath.Join(s.logDir, dlp.AuditFile), key.Recipient())
	if err != nil {
		return err
	}
	s.cleanup.add("close the DLP audit log", audit.Close)
	// Every string logged from here on (session.log, network.jsonl,
	// alerts.jsonl) goes through the same known values first: a refused
	// request's host name, SNI or path is the guest's to choose.
	s.redact = logredact.LogRedactor(e)
	s.logRed.SetRedactor(s.redact)
	o.Egress.Filter = &netfilter.DLPFilter{Engine: e, Audit: audit, OnAuditError: func(err error) {
		s.log.Error("DLP audit log", "err", err)
	}}
	if s.creds != nil {
		o.Egress.Filter = netfilter.NewSwapFilter(o.Egress.Filter, s.creds.Swaps())
	}
	s.log.Info("dlp ready", "known_values", e.KnownValues(), "patterns", e.Patterns(), "allowlist", cfg.Allow.String())
	return nil
}

// WorkspaceDLPConfig is DLPConfig for a workspace as a session would see
// it, the preflight's gitleaks scan included (quiet, cached) unless
// noScan.
func WorkspaceDLPConfig(ctx context.Context, h Home, workspace string, noScan bool, o DLPOptions) (dlp.Config, []string, error) {
	ws, err := CheckWorkspace(workspace)
	if err != nil {
		return dlp.Config{}, nil, err
	}
	var found []string
	if !noScan {
		rep, err := preflight.Scan(ctx, ScanOptions(h, ws))
		if err != nil {
			return dlp.Config{}, nil, fmt.Errorf("secrets preflight: %w", err)
		}
		found = rep.Secrets()
	}
	return DLPConfig(h, ws, found, o)
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

// setupCredentials loads the host's API keys (the environment, then
// ~/.vibedom/credentials) and makes this session's placeholders.
func (s *sess) setupCredentials() error {
	ks, err := credentials.Load(string(s.opts.Home), os.Getenv)
	if err != nil {
		return err
	}
	if len(ks) == 0 {
		return nil
	}
	cs, err := credentials.NewSession(ks)
	if err != nil {
		return err
	}
	s.creds = cs
	for _, k := range ks {
		s.log.Info("api key held on the host; the guest gets a placeholder", "key", k.String(), "fingerprint", k.Fingerprint())
	}
	s.progress("API keys stay on the host (%s): the guest gets placeholders", strings.Join(cs.Providers(), ", "))
	return nil
}
