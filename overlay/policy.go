package overlay

import (
	"bytes"
	"encoding/json"
	"path"
	"strings"
)

// Attention is how much a path needs the user's eye before it is applied.
type Attention int

// Attention levels.
const (
	AttentionNone Attention = iota
	// AttentionFlagged paths run code in the user's tools later (CI, editor
	// tasks, build scripts): applied, but listed first.
	AttentionFlagged
	// AttentionProtected paths would let the agent run code on the host
	// (git hooks and config, direnv, hook managers, vibedom's own settings):
	// refused unless the user allows them by name.
	AttentionProtected
)

func (a Attention) String() string {
	switch a {
	case AttentionFlagged:
		return "flagged"
	case AttentionProtected:
		return "protected"
	}
	return "none"
}

// Protected names, compared after folding (case, Unicode normalisation,
// ignorable code points), so ".GIT" or ".g\u200cit" are ".git" too.
var (
	protectedDirs = map[string]string{ // any component
		".git":      "git internals (hooks, config, objects …) run code on the host",
		".vibedom":  "vibedom's own settings for this workspace",
		".husky":    "git hook manager (husky) runs these on commit",
		".githooks": "git hooks directory",
		".lefthook": "git hook manager (lefthook) scripts",
	}
	protectedFiles = map[string]string{ // base name, any depth
		".envrc":                  "direnv runs it when you enter the directory",
		".pre-commit-config.yaml": "pre-commit runs the hooks it names on commit",
		"lefthook.yml":            "git hook manager (lefthook) configuration",
		".lefthook.yml":           "git hook manager (lefthook) configuration",
		"lefthook-local.yml":      "git hook manager (lefthook) configuration",
	}
	flaggedDirs = map[string]string{ // top-level or any-depth directories
		".vscode":       "editor settings and tasks can run commands",
		".idea":         "IDE settings and run configurations can run commands",
		".devcontainer": "dev container definition runs on the host's Docker",
		".circleci":     "CI configuration",
		".buildkite":    "CI configuration",
	}
	flaggedFiles = map[string]string{ // base name, any depth
		".gitlab-ci.yml":          "CI configuration",
		".travis.yml":             "CI configuration",
		"jenkinsfile":             "CI configuration",
		"azure-pipelines.yml":     "CI configuration",
		"bitbucket-pipelines.yml": "CI configuration",
		".drone.yml":              "CI configuration",
		"makefile":                "runs when you type make",
		"gnumakefile":             "runs when you type make",
		".gitattributes":          "git attributes select filters and diff drivers",
		".gitmodules":             "submodule URLs are fetched by git",
		".npmrc":                  "npm configuration (script shell, registries)",
		".yarnrc":                 "yarn configuration",
		".yarnrc.yml":             "yarn configuration (plugins run code)",
		"mise.toml":               "mise hooks and tasks run commands",
		".mise.toml":              "mise hooks and tasks run commands",
	}
)

// ClassifyPath says whether p needs attention and why, from its name alone.
// (package.json is flagged by Plan only when its scripts change, and new
// executables and symlinks are judged there too.)
func ClassifyPath(p string) (Attention, string) {
	comps := strings.Split(foldPath(p), "/")
	for i, c := range comps {
		last := i == len(comps)-1
		if why, ok := protectedDirs[c]; ok {
			return AttentionProtected, why
		}
		if last {
			if why, ok := protectedFiles[c]; ok {
				return AttentionProtected, why
			}
		}
	}
	if len(comps) >= 2 && comps[0] == ".github" && (comps[1] == "workflows" || comps[1] == "actions") {
		return AttentionFlagged, "GitHub Actions run this"
	}
	if len(comps) >= 3 && comps[0] == ".cargo" && strings.HasPrefix(comps[len(comps)-1], "config") {
		return AttentionFlagged, "cargo configuration can set runners and linkers"
	}
	if len(comps) == 2 && comps[0] == ".cargo" && strings.HasPrefix(comps[1], "config") {
		return AttentionFlagged, "cargo configuration can set runners and linkers"
	}
	for i, c := range comps {
		last := i == len(comps)-1
		if why, ok := flaggedDirs[c]; ok && !last {
			return AttentionFlagged, why
		}
		if last {
			if why, ok := flaggedFiles[c]; ok {
				return AttentionFlagged, why
			}
			if strings.HasSuffix(c, ".code-workspace") {
				return AttentionFlagged, "editor workspace settings and tasks can run commands"
			}
			if strings.HasSuffix(c, ".mk") {
				return AttentionFlagged, "included by make"
			}
		}
	}
	return AttentionNone, ""
}

// packageScriptsChanged reports whether the "scripts" of two package.json
// contents differ (or either cannot be read as JSON).
func packageScriptsChanged(old, new []byte) bool {
	get := func(b []byte) (json.RawMessage, bool) {
		if len(bytes.TrimSpace(b)) == 0 {
			return nil, true
		}
		var v struct {
			Scripts json.RawMessage `json:"scripts"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, false
		}
		return v.Scripts, true
	}
	a, ok1 := get(old)
	b, ok2 := get(new)
	if !ok1 || !ok2 {
		return true
	}
	var ca, cb bytes.Buffer
	if len(a) > 0 && json.Compact(&ca, a) != nil {
		return true
	}
	if len(b) > 0 && json.Compact(&cb, b) != nil {
		return true
	}
	return !bytes.Equal(ca.Bytes(), cb.Bytes())
}

// allowedBy reports whether p matches one of the user's --allow-protected
// patterns: an exact path, a directory prefix ending in "/", or a
// path.Match glob.
func allowedBy(p string, patterns []string) bool {
	for _, pat := range patterns {
		pat = strings.TrimPrefix(pat, "./")
		switch {
		case pat == "":
		case pat == p:
			return true
		case strings.HasSuffix(pat, "/") && strings.HasPrefix(p, pat):
			return true
		default:
			if ok, _ := path.Match(pat, p); ok {
				return true
			}
		}
	}
	return false
}

// symlinkEscapes reports whether a symlink at linkPath with target stays
// outside the tree: absolute targets, and relative ones that climb above
// the root.
func symlinkEscapes(linkPath, target string) bool {
	if strings.HasPrefix(target, "/") {
		return true
	}
	joined := path.Join(parentDir(linkPath), target)
	return joined == ".." || strings.HasPrefix(joined, "../")
}
