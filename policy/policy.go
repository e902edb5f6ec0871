// Package policy assembles what a session may reach and what it scrubs
// from the files that say so: the egress policy from the built-in rules,
// ~/.vibedom/trusted_domains.txt, the workspace's .vibedom/trusted_domains.txt
// (its allow rules once approved: package wstrust) and the session's
// --allow; the DLP configuration from the preflight's secrets, the
// workspace's .env values, ~/.vibedom/dlp_classes.txt and the allowlists
// (the workspace's once approved, the session's options). It gives wstrust
// the parsers of the workspace's files.
//
// It starts nothing and enforces nothing: netfilter applies the policy,
// dlp scrubs with the configuration.
package policy

import (
	"bytes"
	"fmt"
	"path/filepath"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	nfegress "github.com/vibedom/vibedom/netfilter/egress"
	"github.com/vibedom/vibedom/wstrust"
)

// parsers sort the entries of the workspace's trust files for wstrust:
// allow rules and DLP allowlist entries widen, deny rules narrow.
var parsers = map[string]wstrust.Parse{
	wstrust.PolicyRel: func(data []byte, source string) (widening, narrowing []string, err error) {
		rules, err := nfegress.ParseRules(bytes.NewReader(data), source)
		if err != nil {
			return nil, nil, fmt.Errorf("workspace egress rules: %w", err)
		}
		for _, r := range rules {
			if r.Deny {
				narrowing = append(narrowing, r.Text)
			} else {
				widening = append(widening, r.Text)
			}
		}
		return widening, narrowing, nil
	},
	wstrust.DLPAllowlistRel: func(data []byte, source string) (widening, narrowing []string, err error) {
		a, err := dlp.ParseAllowlist(bytes.NewReader(data), source)
		if err != nil {
			return nil, nil, fmt.Errorf("DLP allowlist: %w (fix the file or remove it)", err)
		}
		widening = append(widening, a.Values...)
		for _, p := range a.Patterns {
			widening = append(widening, "re:"+p.String())
		}
		for _, c := range a.Categories {
			widening = append(widening, "context:"+c.String())
		}
		return widening, nil, nil
	},
}

// LoadTrust reads the workspace's trust files and their approvals
// (wstrust.Load with this room's parsers).
func LoadTrust(h home.Home, workspace string) (*wstrust.Trust, error) {
	return wstrust.Load(h, workspace, parsers)
}

// EgressPolicy merges the session's egress policy as a session would:
// built-in rules, the user's file, the workspace's file (its allow rules
// only when approved: see LoadTrust) and allow (--allow). notes
// tell the user what was left out and how to approve it.
func EgressPolicy(h home.Home, t *wstrust.Trust, allow []string) (*nfegress.Policy, []string, error) {
	cfg := nfegress.PolicyConfig{UserFile: h.TrustedDomains(), Allow: allow}
	if f := t.File(wstrust.PolicyRel); f != nil && f.Present {
		cfg.Workspace = &nfegress.WorkspaceScope{
			Data:          f.Data(),
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
		notes = append(notes, wstrust.IgnoredNote(t, wstrust.PolicyRel, n, "allow rule", "allow rules"))
	}
	return pol, notes, nil
}
