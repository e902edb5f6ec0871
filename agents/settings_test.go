package agents

import (
	"strings"
	"testing"
)

func TestSanitizeAgentSettings(t *testing.T) {
	claude := `{"model":"opus","apiKeyHelper":"/usr/local/bin/print-key","env":{"ANTHROPIC_API_KEY":"sk-ant-x","HTTP_PROXY_TOKEN":"t","EDITOR":"vim"},"permissions":{"allow":["Bash"]}}`
	b, err := sanitizeClaudeSettings([]byte(claude))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, gone := range []string{"apiKeyHelper", "sk-ant-x", "HTTP_PROXY_TOKEN"} {
		if strings.Contains(out, gone) {
			t.Errorf("claude settings kept %q:\n%s", gone, out)
		}
	}
	for _, kept := range []string{`"EDITOR": "vim"`, `"model": "opus"`, `"Bash"`} {
		if !strings.Contains(out, kept) {
			t.Errorf("claude settings lost %q:\n%s", kept, out)
		}
	}
	if _, err := sanitizeClaudeSettings([]byte("{not json")); err == nil {
		t.Error("unparsable settings were copied")
	}

	toml := "model = \"o4\"\n[model_providers.x]\nenv_key = \"X_KEY\"\nexperimental_bearer_token = \"abc\"\n# api_key = \"commented\"\n"
	b, _ = sanitizeTOML([]byte(toml))
	if out := string(b); strings.Contains(out, `"abc"`) || !strings.Contains(out, `env_key = "X_KEY"`) || !strings.Contains(out, `model = "o4"`) {
		t.Errorf("codex config:\n%s", out)
	}

	oc := `{"provider":{"anthropic":{"options":{"apiKey":"sk-ant-y","baseURL":"https://x"}}},"theme":"dark"}`
	b, err = sanitizeOpenCode([]byte(oc))
	if err != nil {
		t.Fatal(err)
	}
	if out := string(b); strings.Contains(out, "sk-ant-y") || !strings.Contains(out, "baseURL") || !strings.Contains(out, "dark") {
		t.Errorf("opencode config:\n%s", out)
	}
}
