package childenv

import (
	"slices"
	"testing"
)

func TestFilter(t *testing.T) {
	env := []string{"PATH=/bin", "ANTHROPIC_API_KEY=sk-ant-x", "OPENAI_API_KEY=sk-y", "HOME=/h", "ANTHROPIC_API_KEY_FILE=/f"}
	got := Filter(env, "LESS=FRX", "OPENAI_API_KEY=again")
	want := []string{"PATH=/bin", "HOME=/h", "ANTHROPIC_API_KEY_FILE=/f", "LESS=FRX"}
	if !slices.Equal(got, want) {
		t.Fatalf("Filter: %q, want %q", got, want)
	}
	if len(env) != 5 || env[1] != "ANTHROPIC_API_KEY=sk-ant-x" {
		t.Fatalf("Filter changed its input: %q", env)
	}
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-secret")
	for _, kv := range Environ() {
		if IsSecret(kv) {
			t.Fatalf("Environ holds %q", kv)
		}
	}
}
