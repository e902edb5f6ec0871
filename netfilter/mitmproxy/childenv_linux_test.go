package mitmproxy

import (
	"bytes"
	"os"
	"strconv"
	"testing"

	"github.com/vibedom/vibedom/netfilter/internal/mitmtest"
)

// TestMitmdumpHoldsNoAPIKey (issue 18, item 15): the mitmdump a session
// starts, with the host's API keys in vibedom's environment, holds none of
// them in /proc/PID/environ.
func TestMitmdumpHoldsNoAPIKey(t *testing.T) {
	keys := map[string]string{
		"ANTHROPIC_API_KEY": "sk-ant-api03-" + "MitmEnvRealKey0123456789abcdef", // gitleaks:allow
		"OPENAI_API_KEY":    "sk-proj-" + "MitmEnvRealKey0123456789abcdef",      // gitleaks:allow
	}
	for k, v := range keys {
		t.Setenv(k, v)
	}
	_, m := newEnv(t, mitmtest.Rules, nil)
	env, err := os.ReadFile("/proc/" + strconv.Itoa(m.cmd.Process.Pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(env, []byte("PATH=")) {
		t.Fatalf("read no environment: %q", env)
	}
	for k, val := range keys {
		if bytes.Contains(env, []byte(val)) || bytes.Contains(env, []byte(k+"=")) {
			t.Errorf("mitmdump holds $%s in its environment", k)
		}
	}
}
