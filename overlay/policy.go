package overlay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"slices"
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

// AttentionRule is one row of the table of paths that run code on the host.
//
// Pattern is slash-separated and matched against a path's components after
// folding (case, Unicode normalisation, HFS+-ignorable code points, NTFS's
// trailing dots and spaces and ":stream" suffixes): a leading "**/" matches
// at any depth, else only at the top of the workspace; a trailing "/" names a
// directory and matches it and everything under it; components may hold
// path.Match wildcards; the component "{.git}" is anything git itself
// refuses as ".git" (".GIT", ".git.", "git~1" …).
type AttentionRule struct {
	Pattern string
	Level   Attention
	Why     string
}

// AttentionRules is the table of paths that need the user's eye, in the
// order they are documented (docs/overlay.md). Besides these rows, Plan
// protects directories git would take as a repository, judges package.json
// by what changed in it, and classifies symlinks by what they resolve to.
var AttentionRules = []AttentionRule{
	// Protected: refused unless allowed by name.
	{"**/{.git}/", AttentionProtected, "git internals (hooks, config, a gitdir: file) run code on the host"},
	{"**/.vibedom/", AttentionProtected, "vibedom's own settings for this workspace"},
	{"**/.husky/", AttentionProtected, "git hook manager (husky) runs these on commit"},
	{"**/.githooks/", AttentionProtected, "git hooks directory"},
	{"**/.lefthook*/", AttentionProtected, "git hook manager (lefthook) configuration and scripts"},
	{"**/lefthook*", AttentionProtected, "git hook manager (lefthook) configuration"},
	{"**/.envrc", AttentionProtected, "direnv runs it when you enter the directory"},
	{"**/.pre-commit-config.yaml", AttentionProtected, "pre-commit runs the hooks it names on commit"},
	// CI.
	{".github/workflows/", AttentionFlagged, "GitHub Actions run this"},
	{".github/actions/", AttentionFlagged, "GitHub Actions run this"},
	{"**/action.yml", AttentionFlagged, "a GitHub Action's definition: workflows run it"},
	{"**/action.yaml", AttentionFlagged, "a GitHub Action's definition: workflows run it"},
	{".forgejo/workflows/", AttentionFlagged, "Forgejo Actions run this"},
	{".gitea/workflows/", AttentionFlagged, "Gitea Actions run this"},
	{"**/.gitlab-ci.yml", AttentionFlagged, "CI configuration"},
	{".circleci/", AttentionFlagged, "CI configuration"},
	{"**/.travis.yml", AttentionFlagged, "CI configuration"},
	{"**/jenkinsfile", AttentionFlagged, "CI configuration"},
	{"**/azure-pipelines.yml", AttentionFlagged, "CI configuration"},
	{"**/bitbucket-pipelines.yml", AttentionFlagged, "CI configuration"},
	{"**/.drone.yml", AttentionFlagged, "CI configuration"},
	{".buildkite/", AttentionFlagged, "CI configuration"},
	{"**/.woodpecker*/", AttentionFlagged, "CI configuration"},
	// Editors and agents on the host.
	{"**/.vscode/", AttentionFlagged, "editor settings and tasks can run commands"},
	{"**/*.code-workspace", AttentionFlagged, "editor workspace settings and tasks can run commands"},
	{"**/.idea/", AttentionFlagged, "IDE settings and run configurations can run commands"},
	{"**/.zed/", AttentionFlagged, "Zed settings and tasks can run commands"},
	{"**/.devcontainer*/", AttentionFlagged, "dev container definition runs on the host's Docker"},
	{"**/.claude/", AttentionFlagged, "Claude Code settings: hooks run commands on the host"},
	{"**/.mcp.json", AttentionFlagged, "Claude Code starts the MCP servers it names"},
	{"**/.cursor/", AttentionFlagged, "Cursor settings and MCP servers run commands"},
	// Build tools and task runners.
	{"**/makefile", AttentionFlagged, "runs when you type make"},
	{"**/gnumakefile", AttentionFlagged, "runs when you type make"},
	{"**/*.mk", AttentionFlagged, "included by make"},
	{"**/justfile", AttentionFlagged, "runs when you type just"},
	{"**/.justfile", AttentionFlagged, "runs when you type just"},
	{"**/mise*.toml", AttentionFlagged, "mise hooks and tasks run commands"},
	{"**/.mise*/", AttentionFlagged, "mise hooks and tasks run commands"},
	{"**/.config/mise*/", AttentionFlagged, "mise hooks and tasks run commands"},
	{"**/.tool-versions", AttentionFlagged, "asdf and mise install and run the tools it names (mise backends: npm:, cargo:, ubi: …)"},
	{"**/.env", AttentionFlagged, "docker compose (COMPOSE_FILE), direnv's load_dotenv and mise read it: variables change what runs"},
	{"**/flake.nix", AttentionFlagged, "nix develop (and nix-direnv) runs its shell hook"},
	{"**/shell.nix", AttentionFlagged, "nix-shell (and nix-direnv) runs its shell hook"},
	{"**/devenv.nix", AttentionFlagged, "devenv runs its shell hook"},
	{"**/.cargo/config", AttentionFlagged, "cargo configuration can set runners and linkers"},
	{"**/.cargo/config.toml", AttentionFlagged, "cargo configuration can set runners and linkers"},
	{"**/build.rs", AttentionFlagged, "cargo runs it on build; rust-analyzer when the folder opens"},
	{"**/rust-toolchain", AttentionFlagged, "rustup runs the toolchain it names"},
	{"**/rust-toolchain.toml", AttentionFlagged, "rustup runs the toolchain it names"},
	{"**/gradlew", AttentionFlagged, "Gradle wrapper script: runs when you build"},
	{"**/gradlew.bat", AttentionFlagged, "Gradle wrapper script: runs when you build"},
	{"**/gradle/wrapper/", AttentionFlagged, "Gradle wrapper: downloads and runs the Gradle it names"},
	{"**/*.gradle", AttentionFlagged, "Gradle build script: runs on build and IDE import"},
	{"**/*.gradle.kts", AttentionFlagged, "Gradle build script: runs on build and IDE import"},
	{"**/gradle.properties", AttentionFlagged, "Gradle settings (JVM arguments) for every build"},
	{"**/mvnw", AttentionFlagged, "Maven wrapper script: runs when you build"},
	{"**/mvnw.cmd", AttentionFlagged, "Maven wrapper script: runs when you build"},
	{"**/.mvn/", AttentionFlagged, "Maven wrapper and extensions: run when you build"},
	{"**/pom.xml", AttentionFlagged, "Maven plugins run on build and IDE import"},
	// Python.
	{"**/conftest.py", AttentionFlagged, "pytest imports it when it collects tests"},
	{"**/setup.py", AttentionFlagged, "pip and setuptools run it on install"},
	{"**/*.pth", AttentionFlagged, "Python runs its import lines at every start"},
	{"**/sitecustomize.py", AttentionFlagged, "Python imports it at every start"},
	{"**/usercustomize.py", AttentionFlagged, "Python imports it at every start"},
	// JavaScript.
	{"**/.npmrc", AttentionFlagged, "npm configuration (script shell, registries)"},
	{"**/.yarnrc", AttentionFlagged, "yarn configuration"},
	{"**/.yarnrc.yml", AttentionFlagged, "yarn configuration (plugins, yarnPath run code)"},
	{"**/.yarn/plugins/", AttentionFlagged, "yarn runs its plugins"},
	{"**/.yarn/releases/", AttentionFlagged, "yarn runs the release yarnPath names"},
	{"**/.pnp.cjs", AttentionFlagged, "yarn's loader: node runs it"},
	{"**/.pnp.loader.mjs", AttentionFlagged, "yarn's loader: node runs it"},
	{"**/.pnpmfile.*", AttentionFlagged, "pnpm runs its hooks on install"},
	{"**/bunfig.toml", AttentionFlagged, "bun configuration (preload scripts)"},
	{"**/.bunfig.toml", AttentionFlagged, "bun configuration (preload scripts)"},
	{"**/package.yaml", AttentionFlagged, "package manifest: scripts run on install"},
	{"**/package.json5", AttentionFlagged, "package manifest: scripts run on install"},
	{"**/.simple-git-hooks*", AttentionFlagged, "installs git hooks"},
	{"**/simple-git-hooks*", AttentionFlagged, "installs git hooks"},
	{"**/.lintstagedrc*", AttentionFlagged, "lint-staged runs its commands on commit"},
	{"**/lint-staged.config.*", AttentionFlagged, "lint-staged runs its commands on commit"},
	{"**/eslint.config.*", AttentionFlagged, "ESLint runs its config (editor extensions load it when a file opens)"},
	{"**/.eslintrc.js", AttentionFlagged, "ESLint runs its config (editor extensions load it when a file opens)"},
	{"**/.eslintrc.cjs", AttentionFlagged, "ESLint runs its config (editor extensions load it when a file opens)"},
	{"**/.eslintrc.mjs", AttentionFlagged, "ESLint runs its config (editor extensions load it when a file opens)"},
	{"**/prettier.config.*", AttentionFlagged, "Prettier runs its config (editor extensions load it on format)"},
	{"**/.prettierrc.js", AttentionFlagged, "Prettier runs its config (editor extensions load it on format)"},
	{"**/.prettierrc.cjs", AttentionFlagged, "Prettier runs its config (editor extensions load it on format)"},
	{"**/.prettierrc.mjs", AttentionFlagged, "Prettier runs its config (editor extensions load it on format)"},
	{"**/composer.json", AttentionFlagged, "composer runs its scripts on install"},
	// Other build systems and runners.
	{"**/cmakelists.txt", AttentionFlagged, "CMake runs it on configure (IDEs configure when the folder opens)"},
	{"**/*.cmake", AttentionFlagged, "included by CMake on configure"},
	{"**/cmakepresets.json", AttentionFlagged, "CMake presets name the commands and toolchains configure runs"},
	{"**/meson.build", AttentionFlagged, "meson runs it on setup"},
	{"**/workspace", AttentionFlagged, "Bazel repository rules run commands"},
	{"**/workspace.bazel", AttentionFlagged, "Bazel repository rules run commands"},
	{"**/module.bazel", AttentionFlagged, "Bazel module extensions run commands"},
	{"**/.bazelrc", AttentionFlagged, "Bazel options for every build (wrappers, tools)"},
	{"**/gemfile", AttentionFlagged, "bundler evaluates it as Ruby on every bundle command"},
	{"**/*.gemspec", AttentionFlagged, "bundler and gem evaluate it as Ruby"},
	{"**/rakefile", AttentionFlagged, "runs when you type rake"},
	{"**/vagrantfile", AttentionFlagged, "vagrant evaluates it as Ruby on every command"},
	{"**/tox.ini", AttentionFlagged, "tox runs the commands it names"},
	{"**/noxfile.py", AttentionFlagged, "runs when you type nox"},
	{"**/pytest.ini", AttentionFlagged, "pytest options (plugins to load) for every run"},
	{"**/taskfile.yml", AttentionFlagged, "runs when you type task"},
	{"**/taskfile.yaml", AttentionFlagged, "runs when you type task"},
	{"**/docker-compose*.yml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)"},
	{"**/docker-compose*.yaml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)"},
	{"**/compose*.yml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)"},
	{"**/compose*.yaml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)"},
	// Git.
	{"**/.gitattributes", AttentionFlagged, "git attributes select filters and diff drivers"},
	{"**/.gitmodules", AttentionFlagged, "submodule URLs are fetched by git"},
}

// compiledRule is an AttentionRule split into component matchers.
type compiledRule struct {
	AttentionRule
	comps    []compPattern
	anyDepth bool
	dir      bool
}

// compPattern matches one component: a literal, "{.git}", one "*" between
// a prefix and a suffix, or (else) a path.Match pattern.
type compPattern struct {
	pat, before, after string
	kind               int // 0 literal, 1 .git, 2 one star, 3 path.Match
}

func compilePattern(pat string) compPattern {
	c := compPattern{pat: pat}
	before, after, star := strings.Cut(pat, "*")
	switch {
	case pat == "{.git}":
		c.kind = 1
	case !star && !strings.ContainsAny(pat, "?["):
	case star && !strings.ContainsAny(after, "*?[") && !strings.ContainsAny(before, "?["):
		c.kind, c.before, c.after = 2, before, after
	default:
		c.kind = 3
	}
	return c
}

func (c *compPattern) match(key string) bool {
	switch c.kind {
	case 0:
		return c.pat == key
	case 1:
		return isDotGit(key)
	case 2:
		return len(key) >= len(c.before)+len(c.after) && strings.HasPrefix(key, c.before) && strings.HasSuffix(key, c.after)
	}
	ok, _ := path.Match(c.pat, key)
	return ok
}

var compiledRules = func() []compiledRule {
	out := make([]compiledRule, 0, len(AttentionRules))
	for _, r := range AttentionRules {
		p := r.Pattern
		c := compiledRule{AttentionRule: r}
		if rest, ok := strings.CutPrefix(p, "**/"); ok {
			c.anyDepth, p = true, rest
		}
		if rest, ok := strings.CutSuffix(p, "/"); ok {
			c.dir, p = true, rest
		}
		for comp := range strings.SplitSeq(p, "/") {
			c.comps = append(c.comps, compilePattern(comp))
		}
		out = append(out, c)
	}
	return out
}()

// isDotGit reports whether a folded component is one git treats as ".git":
// git~1 is its 8.3 short name on NTFS (folding already dropped trailing dots,
// spaces and stream suffixes).
func isDotGit(key string) bool {
	if key == ".git" {
		return true
	}
	if n, ok := strings.CutPrefix(key, "git~"); ok && n != "" {
		return strings.Trim(n, "0123456789") == ""
	}
	return false
}

// classKey is the key a component is classified under: folded as on
// APFS/HFS+ (case, normalisation, ignorable code points) and as on NTFS
// (".git." and ".git::$INDEX_ALLOCATION" are ".git").
func classKey(name string) string {
	k := foldName(name)
	if i := strings.IndexByte(k, ':'); i > 0 {
		k = k[:i]
	}
	if t := strings.TrimRight(k, ". "); t != "" {
		k = t
	}
	return k
}

func classKeys(p string) []string {
	var out []string
	for c := range strings.SplitSeq(p, "/") {
		// A backslash is a separator on Windows file systems.
		for s := range strings.SplitSeq(c, `\`) {
			if s != "" {
				out = append(out, classKey(s))
			}
		}
	}
	return out
}

func compsMatch(pats []compPattern, keys []string) bool {
	for i := range pats {
		if !pats[i].match(keys[i]) {
			return false
		}
	}
	return true
}

// matchRule reports whether r applies to the path with components keys.
// With asDir the path stands for a directory (a symlink to one): a rule
// also applies when what it names could be inside it (".github" for
// ".github/workflows/", "x/.cargo" for "**/.cargo/config.toml").
func (r *compiledRule) match(keys []string, asDir bool) bool {
	n, m := len(keys), len(r.comps)
	last := 0
	if r.anyDepth {
		last = n - 1
	}
	for s := 0; s <= last; s++ {
		left := n - s
		switch {
		case left == m || (r.dir && left > m):
			if compsMatch(r.comps, keys[s:s+m]) {
				return true
			}
		case asDir && left < m && left > 0:
			// The directory keys[s:] could hold the rule's path. For a rule
			// at any depth only its own leading components count (a symlink
			// to "src" is not flagged for the Makefile it might hold).
			if compsMatch(r.comps[:left], keys[s:]) {
				return true
			}
		}
	}
	return false
}

func classify(p string, asDir bool) (Attention, string) {
	keys := classKeys(p)
	best, why := AttentionNone, ""
	for i := range compiledRules {
		r := &compiledRules[i]
		if r.Level > best && r.match(keys, asDir) {
			best, why = r.Level, r.Why
		}
	}
	return best, why
}

// ClassifyPath says whether p needs attention and why, from its name alone
// (AttentionRules). package.json is judged by Plan on what changed in it;
// new executables, symlinks and planted git repositories are judged there
// too.
func ClassifyPath(p string) (Attention, string) { return classify(p, false) }

// ClassifyDir is ClassifyPath for a directory, or a symlink standing for
// one: a symlink named ".github" or ".cargo" is what those directories are.
func ClassifyDir(p string) (Attention, string) {
	a, why := classify(p, true)
	if b, whyF := classify(p, false); b > a {
		return b, whyF
	}
	return a, why
}

// package.json fields whose change alters what runs: compared whole.
var packageExecFields = []string{
	"scripts", "bin", "directories", "gypfile", "binary", "config",
	"husky", "simple-git-hooks", "pre-commit", "lint-staged", "packageManager",
	"pnpm", "workspaces",
}

// package.json fields mapping names to version specs: a new or changed spec
// that is not a registry version range (git+…, github shorthand, file:,
// link:, a URL, an npm: alias …) fetches and runs code from elsewhere.
var packageDepFields = []string{
	"dependencies", "devDependencies", "optionalDependencies", "peerDependencies",
	"overrides", "resolutions",
}

// packageJSONRisk compares two package.json contents (old may be empty: a
// new file) and says what changed that runs code, or "" when nothing did: a
// version bump within the registry is not flagged, a new script or a git
// dependency is.
func packageJSONRisk(old, new []byte) string {
	parse := func(b []byte) (map[string]json.RawMessage, bool) {
		if len(bytes.TrimSpace(b)) == 0 {
			return map[string]json.RawMessage{}, true
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) != nil {
			return nil, false
		}
		return m, true
	}
	a, ok1 := parse(old)
	b, ok2 := parse(new)
	if !ok1 || !ok2 {
		return "package.json is not a JSON object (tools may read it differently)"
	}
	var changed []string
	for _, f := range packageExecFields {
		if !sameJSON(a[f], b[f]) {
			changed = append(changed, f)
		}
	}
	for _, f := range packageDepFields {
		if sameJSON(a[f], b[f]) {
			continue
		}
		oldSpecs, okA := flattenSpecs(a[f])
		newSpecs, okB := flattenSpecs(b[f])
		if !okA || !okB {
			changed = append(changed, f)
			continue
		}
		var names []string
		for name, spec := range newSpecs {
			if oldSpecs[name] != spec && !registrySpec(spec) {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			slices.Sort(names)
			if len(names) > 3 {
				names = append(names[:3], "…")
			}
			changed = append(changed, fmt.Sprintf("%s from outside the registry (%s)", f, strings.Join(names, ", ")))
		}
	}
	if len(changed) == 0 {
		return ""
	}
	return "package.json changes what runs: " + strings.Join(changed, "; ")
}

func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

// flattenSpecs maps each leaf of a dependency object (nested for npm's
// overrides) to its spec; a non-string leaf is kept as its JSON.
func flattenSpecs(raw json.RawMessage) (map[string]string, bool) {
	out := map[string]string{}
	if len(raw) == 0 {
		return out, true
	}
	var walk func(prefix string, raw json.RawMessage, depth int) bool
	walk = func(prefix string, raw json.RawMessage, depth int) bool {
		var m map[string]json.RawMessage
		if depth > 16 || json.Unmarshal(raw, &m) != nil {
			return false
		}
		for k, v := range m {
			var s string
			if json.Unmarshal(v, &s) == nil {
				out[prefix+k] = s
				continue
			}
			if !walk(prefix+k+">", v, depth+1) {
				out[prefix+k] = string(v)
			}
		}
		return true
	}
	return out, walk("", raw, 0)
}

// registrySpec reports whether a dependency spec names versions of a
// registry package (a range, a version or a tag) rather than a git
// repository, a path, a URL, an alias or a protocol.
func registrySpec(s string) bool {
	s = strings.TrimSpace(s)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case strings.IndexByte(".^~<>=|*-+ _", c) >= 0:
		default:
			return false
		}
	}
	return !strings.HasPrefix(s, ".")
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

// manifestRisk judges the manifests that are flagged by what changed in
// them rather than by name (a dependency or a version bump is everyday
// work): it returns why the change from old to new runs code, or "" when
// it does not. ok is false for a name that is not such a manifest.
func manifestRisk(name string, old, new []byte) (why string, ok bool) {
	switch classKey(name) {
	case "package.json":
		return packageJSONRisk(old, new), true
	case "cargo.toml":
		return tomlRisk("Cargo.toml", old, new, func(section, line string) bool {
			return strings.HasPrefix(section, "patch") || strings.HasPrefix(section, "replace") ||
				strings.HasPrefix(section, "target") || section == "lib" || strings.HasSuffix(section, "build-dependencies") ||
				tomlKeyIn(line, "build", "links", "proc-macro", "proc_macro", "git", "path", "registry", "registry-index", "runner", "linker", "rustflags", "workspace", "members", "default-members", "metadata")
		}), true
	case "pyproject.toml":
		return tomlRisk("pyproject.toml", old, new, func(section, line string) bool {
			return section == "build-system" || strings.HasPrefix(section, "tool.") && section != "tool.black" &&
				section != "tool.ruff" && !strings.HasPrefix(section, "tool.ruff.") && section != "tool.isort" ||
				strings.Contains(line, "git+") || strings.Contains(line, "file:") || strings.Contains(line, " @ ")
		}), true
	}
	return "", false
}

// tomlRisk reports a TOML manifest whose lines changed where risky says so:
// each line is taken with its section, and a line of new that is not in
// old (same section, same trimmed text) counts. A multi-line value is
// seen line by line, which errs toward flagging.
func tomlRisk(name string, old, new []byte, risky func(section, line string) bool) string {
	lines := func(b []byte) map[string]bool {
		out := map[string]bool{}
		section := ""
		for l := range strings.SplitSeq(string(b), "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "[") {
				section = strings.ToLower(strings.Trim(strings.SplitN(l, "#", 2)[0], "[] \t"))
				section = strings.ReplaceAll(section, "\"", "")
			}
			out[section+"\x00"+l] = true
		}
		return out
	}
	before, after := lines(old), lines(new)
	var what []string
	for k := range after {
		if before[k] || strings.HasSuffix(k, "\x00") {
			continue
		}
		section, line, _ := strings.Cut(k, "\x00")
		if strings.HasPrefix(line, "#") {
			continue
		}
		if risky(section, line) {
			what = append(what, line)
		}
	}
	// A removed build-relevant line changes what runs as much as an added one.
	for k := range before {
		if after[k] || strings.HasSuffix(k, "\x00") {
			continue
		}
		section, line, _ := strings.Cut(k, "\x00")
		if !strings.HasPrefix(line, "#") && risky(section, line) {
			what = append(what, line)
		}
	}
	if len(what) == 0 {
		return ""
	}
	slices.Sort(what)
	if len(what) > 2 {
		what = append(what[:2], "…")
	}
	return name + " changes how it builds: " + termtextSafeJoin(what)
}

// termtextSafeJoin joins manifest lines for a reason (escaped when printed).
func termtextSafeJoin(what []string) string {
	for i, w := range what {
		if len(w) > 80 {
			what[i] = w[:80] + "…"
		}
	}
	return strings.Join(what, "; ")
}

// tomlKeyIn reports whether a TOML line assigns one of keys (also inside
// an inline table: evil = { git = "…" }).
func tomlKeyIn(line string, keys ...string) bool {
	l := strings.ToLower(line)
	for _, k := range keys {
		for i := 0; ; {
			j := strings.Index(l[i:], k)
			if j < 0 {
				break
			}
			j += i
			beforeOK := j == 0 || strings.IndexByte(" \t{,.\"", l[j-1]) >= 0
			rest := strings.TrimLeft(l[j+len(k):], " \t\"")
			if beforeOK && (strings.HasPrefix(rest, "=") || strings.HasPrefix(rest, ".")) {
				return true
			}
			i = j + len(k)
		}
	}
	return false
}
