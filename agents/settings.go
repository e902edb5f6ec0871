package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// How each agent runs in the guest and which of the user's settings it
// takes along. The VM is the sandbox: the agents' own permission prompts
// are turned off, and no credential of the host's goes in.

// flags turn each agent's permission prompts off: the VM is the sandbox,
// and nothing leaves it but through the proxy and the review.
var flags = map[string][]string{
	"claude": {"--dangerously-skip-permissions"},
	// --no-daemon: codex otherwise starts a shared background app server,
	// which a one-session VM has no use for (and whose start-up check fails
	// in the guest: "failed to read start time for pid-managed app server").
	"codex":    {"--dangerously-bypass-approvals-and-sandbox", "--no-daemon"},
	"opencode": nil, // permissions come from its config: see env
	// --yolo: every tool call approved without asking.
	"gemini": {"--yolo"},
}

// env is each agent's extra environment in the guest.
var env = map[string]map[string]string{
	// No telemetry, error reports or auto-update: their hosts are not
	// allowed anyway, and waiting for them slows the agent down.
	"claude": {"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1"},
	"codex": {"CODEX_SANDBOX_NETWORK_DISABLED": "0"},
	// Every tool allowed without asking.
	"opencode": {"OPENCODE_PERMISSION": `{"edit":"allow","bash":"allow","webfetch":"allow"}`},
	// No second node started with a larger heap (the guest's memory is
	// what it is); /work trusted (otherwise --yolo is overridden and a
	// headless run stops): the VM is the boundary.
	"gemini": {"GEMINI_CLI_NO_RELAUNCH": "true", "GEMINI_CLI_TRUST_WORKSPACE": "true"},
}

// Flags are the agent's own flags vibedom passes first; ok is false for an
// agent it does not know.
func Flags(agent string) (f []string, ok bool) {
	if strings.HasPrefix(agent, NPMPrefix) {
		return nil, true // an npm: agent gets only the words after --
	}
	f, ok = flags[agent]
	return f, ok
}

// Env is the agent's extra environment in the guest, nil for none.
func Env(agent string) map[string]string { return env[agent] }

// SettingsFile is one of the user's settings files, cleaned, ready to be
// copied into the agent user's home in the guest.
type SettingsFile struct {
	Rel  string // relative to the home directory, slash-separated
	Data []byte
}

// SettingsSkipped is a settings file left behind, and why.
type SettingsSkipped struct {
	Path string
	Err  error
}

// Settings reads the agent's settings files from the user's home
// directory homeDir (regular files only, never through a symlink at the
// last element, at most 1 MiB) and cleans them of what could carry or
// fetch a credential. Missing files are left out silently; unreadable or
// unparsable ones are returned in skipped.
func Settings(agent, homeDir string) (files []SettingsFile, skipped []SettingsSkipped) {
	for _, f := range agentSettings[agent] {
		src := filepath.Join(homeDir, filepath.FromSlash(f.rel))
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil && (!fi.Mode().IsRegular() || fi.Size() > maxSettingsFile) {
			err = fmt.Errorf("not a regular file of at most %d bytes", maxSettingsFile)
		}
		if err != nil {
			skipped = append(skipped, SettingsSkipped{Path: src, Err: err})
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			continue
		}
		if f.sanitize != nil {
			if b, err = f.sanitize(b); err != nil {
				skipped = append(skipped, SettingsSkipped{Path: src, Err: fmt.Errorf("it does not parse: %w", err)})
				continue
			}
		}
		files = append(files, SettingsFile{Rel: f.rel, Data: b})
	}
	return files, skipped
}

// agentSetting is one settings file copied into the guest.
type agentSetting struct {
	rel      string                       // relative to the home directory
	sanitize func([]byte) ([]byte, error) // nil copies as is
}

// agentSettings are the files each agent's user settings live in. Files
// holding credentials (~/.claude/.credentials.json, ~/.claude.json,
// ~/.codex/auth.json, OpenCode's auth.json) are never copied.
var agentSettings = map[string][]agentSetting{
	"claude":   {{".claude/settings.json", sanitizeClaudeSettings}, {".claude/CLAUDE.md", nil}},
	"codex":    {{".codex/config.toml", sanitizeTOML}, {".codex/AGENTS.md", nil}},
	"opencode": {{".config/opencode/opencode.json", sanitizeOpenCode}, {".config/opencode/AGENTS.md", nil}},
}

// maxSettingsFile bounds one settings file.
const maxSettingsFile = 1 << 20

var secretName = regexp.MustCompile(`(?i)(key|token|secret|password|passwd|credential|auth)`)

// sanitizeClaudeSettings drops what could carry or fetch a credential:
// apiKeyHelper and the AWS helpers (commands that print keys), and env
// entries with secret-looking names.
func sanitizeClaudeSettings(b []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for _, k := range []string{"apiKeyHelper", "awsAuthRefresh", "awsCredentialExport", "otelHeadersHelper"} {
		delete(m, k)
	}
	if env, ok := m["env"].(map[string]any); ok {
		for k := range env {
			if secretName.MatchString(k) {
				delete(env, k)
			}
		}
	}
	return json.MarshalIndent(m, "", "  ")
}

// sanitizeOpenCode drops provider options that hold keys.
func sanitizeOpenCode(b []byte) ([]byte, error) {
	var m any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				if _, isObj := c.(map[string]any); !isObj && secretName.MatchString(k) {
					delete(x, k)
					continue
				}
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(m)
	return json.MarshalIndent(m, "", "  ")
}

// sanitizeTOML drops assignments whose key looks secret (Codex keeps
// bearer tokens and header values in config.toml); env_key names a
// variable, not a value, and stays.
func sanitizeTOML(b []byte) ([]byte, error) {
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		k, _, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if ok && !strings.HasPrefix(strings.TrimSpace(line), "#") && secretName.MatchString(k) && k != "env_key" {
			out = append(out, "# (removed by vibedom: a credential stays on the host) "+k+" = …")
			continue
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "\n")), nil
}
