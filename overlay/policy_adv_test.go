package overlay

import "testing"

// TestClassifyHostConfigsAdv (adversarial): files an agent can write that
// make the host run or fetch what it names later: git-lfs's .lfsconfig
// (lfs.url: the user's next push uploads the LFS objects there, a fetch
// takes content from there), Bundler's .bundle/config (a gem mirror: the
// next bundle install runs code from it), and, in a dotfiles repository
// linked into the home folder, kubectl's config (exec credential plugins
// run commands) and Terraform's CLI config (dev_overrides run a local
// provider binary). None was flagged.
func TestClassifyHostConfigsAdv(t *testing.T) {
	t.Parallel()
	for _, p := range []string{".lfsconfig", "sub/.lfsconfig", ".bundle/config", "app/.bundle/config", ".kube/config",
		"dotfiles/.kube/config", ".terraformrc", "terraform.rc"} {
		if a, why := ClassifyPath(p); a < AttentionFlagged || why == "" {
			t.Errorf("ClassifyPath(%s): %s %q, want flagged with a reason", p, a, why)
		}
	}
	for _, p := range []string{".lfsconfig.md", "docs/bundle/config", "kube/config"} {
		if a, _ := ClassifyPath(p); a != AttentionNone {
			t.Errorf("ClassifyPath(%s): %s, want none", p, a)
		}
	}
}
