package session

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibedom/vibedom/credentials"
	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/keys"
	"github.com/vibedom/vibedom/logredact"
	"github.com/vibedom/vibedom/netfilter"
	"github.com/vibedom/vibedom/policy"
	"github.com/vibedom/vibedom/termtext"
)

// setupDLP builds the session's DLP engine and encrypted audit log and
// plugs them into the proxy, unless a test gave a filter of its own.
func (s *sess) setupDLP() error {
	o := &s.opts
	if o.Egress.Disabled || s.plan.filter != nil {
		return nil
	}
	var found []string
	if s.secrets != nil {
		found = s.secrets.secrets
	}
	cfg, notes, err := policy.DLPConfig(o.Home, s.plan.workspace, found, o.DLP)
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
	if s.creds != nil && len(s.creds.Logins()) > 0 {
		// Tokens the host refreshes later are no DLP known value.
		base, creds := s.redact, s.creds
		s.redact = func(v string) string { return base(creds.Redact(v)) }
	}
	s.logRed.SetRedactor(s.redact)
	s.plan.filter = &netfilter.DLPFilter{Engine: e, Audit: audit, OnAuditError: func(err error) {
		s.log.Error("DLP audit log", "err", err)
	}}
	if s.creds != nil {
		s.plan.filter = netfilter.NewSwapFilter(s.plan.filter, s.creds.Swaps())
	}
	s.log.Info("dlp ready", "known_values", e.KnownValues(), "patterns", e.Patterns(), "allowlist", cfg.Allow.String())
	return nil
}

// setupCredentials loads the host's API keys (the environment, then
// ~/.vibedom/credentials) and makes this session's placeholders.
func (s *sess) setupCredentials() error {
	ks, err := credentials.Load(string(s.opts.Home), os.Getenv)
	if err != nil {
		return err
	}
	login, err := s.loadLogin()
	if err != nil {
		return err
	}
	if len(ks) == 0 && login == nil {
		return nil
	}
	cs, err := credentials.NewSession(ks)
	if err != nil {
		return err
	}
	if login != nil {
		cs.AddLogin(login)
	}
	s.creds = cs
	for _, k := range ks {
		s.log.Info("api key held on the host; the guest gets a placeholder", "key", k.String(), "fingerprint", k.Fingerprint())
	}
	s.progress("credentials stay on the host (%s): the guest gets placeholders", strings.Join(cs.Providers(), ", "))
	return nil
}
