package policy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibedom/vibedom/dlp"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/wstrust"
)

func j(parts ...string) string { return strings.Join(parts, "") }

func TestWorkspaceEnvSecrets(t *testing.T) {
	ws := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(filepath.Join(ws, p)), 0o755)
		if err := os.WriteFile(filepath.Join(ws, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key, pw, tok := j("hQ7vZp2L", "xK9wR4tYq"), j("S3cretPa", "ssw0rd"), j("qz8Lm2Kx", "7Vn4Tp9")
	write(".env", "API_KEY="+key+"\nAPP_ENV=production\n")
	write("svc/.env.production", "DATABASE_URL=postgres://app:"+pw+"@db/app\n")
	write("config/prod.env", "TOKEN="+tok+"\n")
	write("node_modules/pkg/.env", "API_KEY=shouldNotBeRead123\n")
	write("README.md", "API_KEY=notAnEnvFile123\n")
	outside := filepath.Join(t.TempDir(), "secret.env")
	os.WriteFile(outside, []byte("TOKEN=outsideTheWorkspace9\n"), 0o644)
	os.Symlink(outside, filepath.Join(ws, ".env.link"))
	os.Symlink(filepath.Dir(outside), filepath.Join(ws, "linkdir"))

	got, warnings, err := workspaceEnvSecrets(ws)
	if err != nil {
		t.Fatal(err)
	}
	var vals, srcs []string
	for _, s := range got {
		vals = append(vals, s.Value)
		srcs = append(srcs, s.Source)
	}
	for _, v := range []string{key, pw, tok} {
		if !slices.Contains(vals, v) {
			t.Errorf("a secret is missing; sources %v", srcs)
		}
	}
	for _, v := range []string{"production", "shouldNotBeRead123", "notAnEnvFile123", "outsideTheWorkspace9"} {
		if slices.Contains(vals, v) {
			t.Errorf("%q taken as a secret", v)
		}
	}
	if !slices.Contains(srcs, ".env:1 API_KEY") || !slices.Contains(srcs, "svc/.env.production:1 DATABASE_URL (password)") {
		t.Errorf("sources: %v", srcs)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
}

func TestDLPConfig(t *testing.T) {
	hm := home.Home(t.TempDir())
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, ".vibedom"), 0o755)
	os.WriteFile(filepath.Join(ws, ".env"), []byte("API_KEY="+j("hQ7vZp2L", "xK9wR4tYq")+"\n"), 0o644)
	os.WriteFile(WorkspaceDLPAllowlist(ws), []byte("Pearl St\ncontext:emails\n"), 0o644)
	os.WriteFile(hm.DLPClasses(), []byte("internal *.corp.example\n"), 0o600)
	cfg, notes, err := DLPConfig(hm, ws, []string{j("ghp_", "R8mKq2Lx7Vn4Tp9Wz3Yb6Hc1Jf5Gd0Se8Ua1")},
		DLPOptions{AllowPatterns: []string{"re:^build-[0-9]+$"}, AllowContexts: []string{"internal_ips,cards"}})
	if err != nil {
		t.Fatal(err)
	}
	// The workspace's allowlist widens what leaves unscrubbed: ignored
	// until approved, with a notice.
	if len(cfg.Allow.Values) != 0 || len(cfg.Allow.Categories) != 2 {
		t.Errorf("unapproved allowlist applied: %s", cfg.Allow)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "ignored 2 DLP allowlist entries of .vibedom/dlp_allowlist.txt (not approved)") ||
		!strings.Contains(notes[0], "vibedom policy approve") {
		t.Errorf("notes: %q", notes)
	}
	trust, err := LoadTrust(hm, ws)
	if err != nil {
		t.Fatal(err)
	}
	if err := wstrust.Approve(hm, trust); err != nil {
		t.Fatal(err)
	}
	cfg, notes, err = DLPConfig(hm, ws, []string{j("ghp_", "R8mKq2Lx7Vn4Tp9Wz3Yb6Hc1Jf5Gd0Se8Ua1")},
		DLPOptions{AllowPatterns: []string{"re:^build-[0-9]+$"}, AllowContexts: []string{"internal_ips,cards"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Secrets) != 2 || len(cfg.ClassRules) != 1 || len(cfg.Allow.Values) != 1 || len(cfg.Allow.Patterns) != 1 {
		t.Errorf("config: %d secrets, %d rules, allow %s", len(cfg.Secrets), len(cfg.ClassRules), cfg.Allow)
	}
	if !slices.Equal(cfg.Allow.Categories, []dlp.Category{dlp.CatEmail, dlp.CatInternalIP, dlp.CatCreditCard}) {
		t.Errorf("categories: %v", cfg.Allow.Categories)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "dlp_allowlist.txt (approved) exempts 1 values, 0 patterns, categories [EMAIL]") {
		t.Errorf("notes: %q", notes)
	}
	// Bad files are errors that name the file and line, never ignored.
	os.WriteFile(hm.DLPClasses(), []byte("internal\n"), 0o600)
	if _, _, err := DLPConfig(hm, ws, nil, DLPOptions{}); err == nil || !strings.Contains(err.Error(), "dlp_classes.txt:1") {
		t.Errorf("bad class file: %v", err)
	}
	os.Remove(hm.DLPClasses())
	if _, _, err := DLPConfig(hm, ws, nil, DLPOptions{AllowContexts: []string{"everything"}}); err == nil {
		t.Error("an unknown --allow-context was accepted")
	}
}
