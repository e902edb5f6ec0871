package credentials

import (
	"net/url"
	"testing"
)

// TestLoginAPIPaths (issue 21, adversarial): the subscription logins' rows
// allow the paths the pinned CLIs send their token to and nothing else of
// the account: not Claude's API-key minting or organisation endpoints, not
// ChatGPT's conversations, cloud tasks, connectors or plugins. API-key
// swaps name no paths.
func TestLoginAPIPaths(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		login         string
		allow, refuse []string
	}{
		{"claude",
			[]string{"/v1/messages", "/v1/messages/count_tokens", "/api/oauth/profile", "/api/oauth/usage",
				"/api/claude_cli/bootstrap", "/api/claude_code/settings", "/api/claude_code/policy_limits"},
			[]string{"/api/oauth/claude_cli/create_api_key", "/api/oauth/claude_cli/roles", "/api/oauth/organizations/o/payment_method",
				"/api/oauth/files/f/content", "/api/oauth/file_upload", "/api/oauth/account/settings", "/api/organizations/o/projects/p",
				"/v1/files", "/v1/messages/batches", "/v1/sessions", "/v1/code/sessions/s", "/api/claude_code_shared_session_transcripts",
				"/v1/messages/", "/v1/messages/../files", "/v1/Messages", "/api/oauth/profile/../claude_cli/create_api_key"}},
		{"codex",
			[]string{"/backend-api/codex/responses", "/backend-api/codex/models", "/backend-api/codex/responses/compact",
				"/backend-api/wham/accounts/check", "/backend-api/wham/usage"},
			[]string{"/backend-api/conversations", "/backend-api/conversation/c", "/backend-api/me", "/backend-api/wham/tasks/list",
				"/backend-api/wham/apps", "/backend-api/plugins/export/curated", "/backend-api/connectors/directory/list",
				"/backend-api/wham/usage/thread_usage/query", "/backend-api/codex", "/backend-api/codex/", "/backend-api/codex/../conversations"}},
	} {
		k, err := LookupLogin(c.login)
		if err != nil {
			t.Fatal(err)
		}
		s := Swap{Paths: k.APIPaths}
		for _, p := range c.allow {
			if u, _ := url.ParseRequestURI(p); !s.PathAllowed(u) {
				t.Errorf("%s: %s refused", c.login, p)
			}
		}
		for _, p := range c.refuse {
			if u, _ := url.ParseRequestURI(p); s.PathAllowed(u) {
				t.Errorf("%s: %s allowed", c.login, p)
			}
		}
	}
	a, _ := Lookup("anthropic")
	sess, err := NewSession([]Key{{Provider: a, value: "sk-ant-api03-" + "abcdefghijklmnopqrstuvwxyz0123456789"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, sw := range sess.Swaps() {
		if sw.Paths != nil || !sw.PathAllowed(&url.URL{Path: "/anything/../at/all"}) {
			t.Errorf("the %s API key's swap is limited to paths %q", sw.Name, sw.Paths)
		}
	}
}
