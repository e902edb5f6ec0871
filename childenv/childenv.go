// Package childenv builds the environment of every program vibedom starts
// on the host (qemu-system-*, virtiofsd, mitmdump, git, xz, the pager): the
// host's own environment without the credentials vibedom keeps from the
// guest. A child's environment is readable by every process of the same
// user (/proc/PID/environ), and a child outlives the moment it was started
// for: the real API keys must not sit there.
//
// It is a leaf (it imports nothing of the project) so that every package
// that starts a program can use it; credentials' tests check that Secret
// names every variable a credentials.Provider reads.
package childenv

import (
	"os"
	"strings"
)

// Secret lists the variables that hold credentials vibedom keeps on the
// host: every credentials.Provider's Env, and the providers' other token
// variables.
var Secret = []string{
	"ANTHROPIC_API_KEY",
	"OPENAI_API_KEY",
	"GEMINI_API_KEY",
	"GOOGLE_API_KEY",
	"ANTHROPIC_AUTH_TOKEN",
	"CLAUDE_CODE_OAUTH_TOKEN",
	"CLAUDE_CODE_OAUTH_REFRESH_TOKEN",
	"OPENAI_ADMIN_KEY",
}

// Environ is the host's environment (os.Environ) without the Secret
// variables, with extra ("NAME=value") added; a later entry wins over an
// earlier one of the same name, as exec.Cmd does.
func Environ(extra ...string) []string {
	return Filter(os.Environ(), extra...)
}

// Filter is env without the Secret variables, with extra added (extra
// entries naming a Secret variable are dropped too).
func Filter(env []string, extra ...string) []string {
	out := make([]string, 0, len(env)+len(extra))
	for _, kv := range append(env[:len(env):len(env)], extra...) {
		if !IsSecret(kv) {
			out = append(out, kv)
		}
	}
	return out
}

// IsSecret reports whether the "NAME=value" entry kv sets a Secret
// variable.
func IsSecret(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	for _, s := range Secret {
		if name == s {
			return true
		}
	}
	return false
}
