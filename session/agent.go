package session

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/vibedom/vibedom/agents"
	"github.com/vibedom/vibedom/atomicfile"
	"github.com/vibedom/vibedom/guest/proto"
	"github.com/vibedom/vibedom/home"
	"github.com/vibedom/vibedom/image/ext4"
)

// AgentShell is the --agent name of a plain login shell.
const AgentShell = "shell"

// AgentOptions says which coding agent a session starts.
type AgentOptions struct {
	// Name is claude, codex, opencode or shell.
	Name string
	// Args are passed to the agent after vibedom's own flags.
	Args []string
	// HomeDir is the host user's home, where the agent's settings are
	// read from; "" means os.UserHomeDir.
	HomeDir string
}

// agentFlags turn each agent's permission prompts off: the VM is the
// sandbox, and nothing leaves it but through the proxy and the review.
var agentFlags = map[string][]string{
	"claude": {"--dangerously-skip-permissions"},
	// --no-daemon: codex otherwise starts a shared background app server,
	// which a one-session VM has no use for (and whose start-up check fails
	// in the guest: "failed to read start time for pid-managed app server").
	"codex":    {"--dangerously-bypass-approvals-and-sandbox", "--no-daemon"},
	"opencode": nil, // permissions come from its config: see agentEnv
}

// agentEnv is each agent's extra environment in the guest.
var agentEnv = map[string]map[string]string{
	// No telemetry, error reports or auto-update: their hosts are not
	// allowed anyway, and waiting for them slows the agent down.
	"claude": {"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1"},
	"codex": {"CODEX_SANDBOX_NETWORK_DISABLED": "0"},
	// Every tool allowed without asking.
	"opencode": {"OPENCODE_PERMISSION": `{"edit":"allow","bash":"allow","webfetch":"allow"}`},
}

// agentLayerLabel is the ext4 label of an agent's layer image.
const agentLayerLabel = "vibedom-agent"

// prepareAgent finds the agent's installed binary and its layer image,
// and turns the session's command into the agent's. It runs before the
// guest boots.
func (s *sess) prepareAgent() error {
	a := s.opts.Agent
	if a == nil {
		return nil
	}
	if a.Name == AgentShell {
		if len(a.Args) > 0 {
			s.opts.Command = a.Args
		}
		return nil
	}
	if _, ok := agentFlags[a.Name]; !ok {
		return fmt.Errorf("unknown agent %q: use claude, codex, opencode or shell", a.Name)
	}
	if s.rootImage == "" {
		return fmt.Errorf("--agent %s needs the guest image, which this home does not have: run `vibedom init`", a.Name)
	}
	arch, err := agents.GuestArch(string(s.opts.Arch))
	if err != nil {
		return err
	}
	libc := s.guestLibc
	if libc == "" {
		libc = agents.LibcMusl
	}
	inst, err := agents.FindAgent(string(s.opts.Home), a.Name, arch, libc)
	if err != nil {
		return err
	}
	layer, err := agentLayer(s.opts.Home, inst)
	if err != nil {
		return err
	}
	s.layers = append(s.layers, layerDisk{path: layer, label: agentLayerLabel, mount: proto.AgentMount})
	bin := path.Join(proto.AgentMount, inst.Binary)
	s.opts.Command = append(append([]string{bin}, agentFlags[a.Name]...), a.Args...)
	s.agentTTY = len(a.Args) == 0 || s.opts.Terminal != nil
	s.log.Info("agent", "name", a.Name, "version", inst.Version, "libc", libc, "layer", layer)
	return nil
}

// layerDisk is a read-only layer image attached to the VM.
type layerDisk struct {
	path, label, mount string
}

// agentLayer returns the agent's layer image, <dir>.ext4 beside its
// directory, building it when it is missing or older than the directory's
// manifest. Its content comes from the verified, read-only directory.
func agentLayer(h home.Home, inst *agents.Installed) (string, error) {
	img := inst.Dir + ".ext4"
	mf, err := os.Stat(filepath.Join(inst.Dir, agents.ManifestFile))
	if err != nil {
		return "", fmt.Errorf("%w: run `vibedom init --agents %s`", agents.ErrNotInstalled, inst.Agent)
	}
	if fi, err := os.Stat(img); err == nil && fi.Mode().IsRegular() && !fi.ModTime().Before(mf.ModTime()) {
		return img, nil
	}
	tree, err := ext4.TreeFromDir(inst.Dir, inst.Installed)
	if err != nil {
		return "", err
	}
	os.Remove(img + ".tmp") // left by a version that built under this name
	f, err := atomicfile.New(img, 0o444)
	if err != nil {
		return "", err
	}
	defer f.Abort()
	sum := sha256.Sum256([]byte(inst.Integrity))
	var uuid [16]byte
	copy(uuid[:], sum[:])
	uuid[6], uuid[8] = uuid[6]&0x0f|0x40, uuid[8]&0x3f|0x80
	_, err = ext4.Write(f.File, tree, ext4.Options{Label: agentLayerLabel, UUID: uuid, Time: inst.Installed})
	if err == nil {
		err = f.Commit()
	}
	if err != nil {
		return "", fmt.Errorf("build the %s layer: %w", inst.Agent, err)
	}
	return img, nil
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

// copyAgentSettings copies the agent's settings (sanitized) into the agent
// user's home in the root image, owned by the agent.
func (s *sess) copyAgentSettings(ctx context.Context) error {
	a := s.opts.Agent
	if a == nil || s.rootImage == "" {
		return nil
	}
	home := a.HomeDir
	if home == "" {
		var err error
		if home, err = os.UserHomeDir(); err != nil {
			return nil
		}
	}
	files := agentSettings[a.Name]
	if len(files) == 0 {
		return nil
	}
	sc, err := s.client.SFTP()
	if err != nil {
		return fmt.Errorf("copy the agent's settings: %w", err)
	}
	defer sc.Close()
	guestHome := path.Join(proto.RootDir, "home", proto.RootAgentUser)
	for _, f := range files {
		src := filepath.Join(home, filepath.FromSlash(f.rel))
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxSettingsFile {
			s.log.Warn("agent settings file skipped", "file", src, "err", err)
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			continue
		}
		if f.sanitize != nil {
			if b, err = f.sanitize(b); err != nil {
				s.log.Warn("agent settings file not copied: it does not parse", "file", src, "err", err)
				continue
			}
		}
		dst := path.Join(guestHome, f.rel)
		// Make the parents, owned by the agent.
		for d := path.Dir(dst); len(d) > len(guestHome); d = path.Dir(d) {
			defer func(d string) { _ = sc.Chown(d, 1000, 1000) }(d)
		}
		if err := sc.MkdirAll(path.Dir(dst)); err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		w, err := sc.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		_, err = w.Write(b)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy the agent's settings: %w", err)
		}
		_ = sc.Chown(dst, 1000, 1000)
		_ = sc.Chmod(dst, 0o600)
		s.log.Info("agent settings copied", "file", f.rel)
	}
	return nil
}

// agentEnvFor is the agent's extra environment, nil for none.
func agentEnvFor(name string) map[string]string { return agentEnv[name] }
