package home

import (
	"path/filepath"
	"testing"
)

func TestDefault(t *testing.T) {
	t.Run("VIBEDOM_HOME made absolute", func(t *testing.T) {
		t.Chdir(t.TempDir())
		t.Setenv(EnvHome, "rel")
		h, err := Default()
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsAbs(string(h)) || filepath.Base(string(h)) != "rel" {
			t.Errorf("Default() = %q, want an absolute path ending in rel", h)
		}
	})
	t.Run("under the user's home", func(t *testing.T) {
		t.Setenv(EnvHome, "")
		t.Setenv("HOME", "/home/u")
		h, err := Default()
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join("/home/u", DirName); string(h) != want {
			t.Errorf("Default() = %q, want %q", h, want)
		}
	})
}

// TestLayout pins the names on disk: a renamed constant would strand every
// existing home's files.
func TestLayout(t *testing.T) {
	t.Parallel()
	h := Home("/h")
	tests := []struct{ got, want string }{
		{h.Sessions(), "/h/sessions"},
		{h.Session("s-1"), "/h/sessions/s-1"},
		{h.Logs(), "/h/logs"},
		{h.Images(), "/h/images"},
		{h.CA(), "/h/ca"},
		{h.Keys(), "/h/keys"},
		{h.Cache(), "/h/cache"},
		{h.Credentials(), "/h/credentials"},
		{h.Agents(), "/h/agents"},
		{h.Assets(), "/h/assets"},
		{h.APKCache(), "/h/cache/apk"},
		{h.NPMCache(), "/h/cache/npm"},
		{h.PreflightCache(), "/h/cache/preflight"},
		{h.PreflightApprovalKey(), "/h/keys/preflight_approvals.key"},
		{h.TrustedDomains(), "/h/trusted_domains.txt"},
		{h.DLPClasses(), "/h/dlp_classes.txt"},
		{h.GitleaksConfig(), "/h/gitleaks.toml"},
		{h.Config(), "/h/config"},
		{h.PackagesFile(), "/h/packages.txt"},
		{h.WorkspaceApprovals(), "/h/workspace_approvals.json"},
		{h.GuestManifest("x86_64"), "/h/guest/x86_64.json"},
		{filepath.Join(h.Images(), RootImagesDir), "/h/images/root"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %s, want %s", tt.got, tt.want)
		}
	}
}
