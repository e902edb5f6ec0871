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
//
// Check, when set, makes the row content-aware: it applies only when Check
// finds, comparing the file's old content (empty when new) with its new
// one, that what runs changed, and its answer is the reason shown. Why then
// says what the check looks for.
type AttentionRule struct {
	Pattern string
	Level   Attention
	Why     string
	Check   func(old, new []byte) string
}

// Reasons shared by several rows.
const (
	whyShell    = "your shell runs it when it starts (in $HOME, or linked there from a dotfiles repository)"
	whyLogin    = "your session runs it at login (in $HOME, or linked there from a dotfiles repository)"
	whyEditorRC = "your editor runs it when it starts (in $HOME, or linked there from a dotfiles repository)"
	whyVCS      = "version-control metadata: its config names hooks and tools the VCS runs"
	whyCI       = "CI configuration"
	whyAgentCfg = "a coding agent on the host reads it: hooks, MCP servers and tools it names run commands"
	whyAgentMD  = "instructions your coding agents on the host follow (they can tell them to run commands)"
	whyESLint   = "ESLint loads it and the parsers and plugins it names, local paths included (editors run ESLint when a file opens)"
	whyPrettier = "Prettier loads it and the plugins it names, local paths included (editors run Prettier on format)"
	whyBuildCfg = "a build or test tool runs this config as code (editors and dev servers load it)"
	whyTSConfig = "the TypeScript language service reads it when the folder opens: it names plugins and files to load"
	whyRuby     = "a Ruby DSL evaluated by its tool (bundle, pod, brew, fastlane, danger, guard, cap)"
	whyBazel    = "Bazel evaluates it: rules and macros run commands on build"
	whyDotnet   = "MSBuild evaluates it on build and IDE load: tasks and targets run commands"
	whyLock     = "a lockfile: a source outside the registry (git, a path, another host) is fetched and its install scripts run"
	whyCd       = "runs when you enter the directory (autoenv)"
)

// AttentionRules is the table of paths that need the user's eye, in the
// order they are documented (docs/overlay.md, generated from it). Besides
// these rows, Plan protects directories git would take as a repository,
// the repository's hooks directory and the workspace files its config names
// as programs git runs (gitconfig.go), flags a file that becomes executable
// or that was executable and changed, and classifies symlinks by what they
// resolve to.
var AttentionRules = []AttentionRule{
	// Version control and vibedom.
	{"**/{.git}/", AttentionProtected, "git internals (hooks, config, a gitdir: file) run code on the host", nil},
	{"**/.hg/", AttentionProtected, whyVCS + " (Mercurial: hgrc hooks)", nil},
	{"**/.jj/", AttentionProtected, whyVCS + " (Jujutsu: repo/config.toml)", nil},
	{"**/.sl/", AttentionProtected, whyVCS + " (Sapling: config hooks)", nil},
	{"**/.vibedom/", AttentionProtected, "vibedom's own settings for this workspace", nil},
	// Git hook managers.
	{"**/.husky/", AttentionProtected, "git hook manager (husky) runs these on commit", nil},
	{"**/.githooks/", AttentionProtected, "git hooks directory", nil},
	{"**/.lefthook*/", AttentionProtected, "git hook manager (lefthook) configuration and scripts", nil},
	{"**/lefthook*", AttentionProtected, "git hook manager (lefthook) configuration", nil},
	{"**/.pre-commit-config.yaml", AttentionProtected, "pre-commit runs the hooks it names on commit", nil},
	{"**/.overcommit.yml", AttentionProtected, "overcommit runs the hooks it names on commit", nil},
	// Run on cd.
	{"**/.envrc", AttentionProtected, "direnv runs it when you enter the directory", nil},
	{"**/.autoenv.zsh", AttentionProtected, whyCd, nil},
	{"**/.autoenv_leave.zsh", AttentionProtected, "runs when you leave the directory (autoenv)", nil},
	{"**/.env.leave", AttentionProtected, "runs when you leave the directory (autoenv)", nil},
	// Dotfiles: `vibedom run ~` is refused, but a dotfiles repository is
	// often linked into $HOME (stow, chezmoi's symlink mode): at any depth.
	{"**/.bashrc", AttentionProtected, whyShell, nil},
	{"**/.bash_profile", AttentionProtected, whyShell, nil},
	{"**/.bash_login", AttentionProtected, whyShell, nil},
	{"**/.bash_logout", AttentionProtected, whyShell, nil},
	{"**/.profile", AttentionProtected, whyShell, nil},
	{"**/.zshrc", AttentionProtected, whyShell, nil},
	{"**/.zshenv", AttentionProtected, whyShell, nil},
	{"**/.zprofile", AttentionProtected, whyShell, nil},
	{"**/.zlogin", AttentionProtected, whyShell, nil},
	{"**/.zlogout", AttentionProtected, whyShell, nil},
	{"**/.config/fish/", AttentionProtected, whyShell, nil},
	{"**/.tmux.conf", AttentionProtected, "tmux runs the commands it names (run-shell) when it starts", nil},
	{"**/.xprofile", AttentionProtected, whyLogin, nil},
	{"**/.xinitrc", AttentionProtected, whyLogin, nil},
	{"**/.config/autostart/", AttentionProtected, whyLogin, nil},
	{"**/.config/systemd/", AttentionProtected, "systemd user units run at login and on timers", nil},
	{"**/.config/environment.d/", AttentionProtected, "systemd sets these variables for your whole session", nil},
	{"**/Library/LaunchAgents/", AttentionProtected, "macOS launchd runs these at login", nil},
	{"**/.local/bin/", AttentionProtected, "on your PATH: runs in place of the command of that name", nil},
	{"**/.ssh/", AttentionProtected, "ssh reads it: config runs ProxyCommand and LocalCommand, authorized_keys grants logins", nil},
	{"**/.gitconfig", AttentionProtected, "git's user config: filters, hooksPath, fsmonitor and aliases run commands", nil},
	{"**/.config/git/", AttentionProtected, "git's user config: filters, hooksPath, fsmonitor and aliases run commands", nil},
	{"**/.kube/config", AttentionFlagged, "kubectl's config: exec credential plugins run commands", nil},
	{"**/.terraformrc", AttentionFlagged, "Terraform's CLI config: provider overrides run local binaries", nil},
	{"**/terraform.rc", AttentionFlagged, "Terraform's CLI config: provider overrides run local binaries", nil},
	{"**/.vimrc", AttentionProtected, whyEditorRC, nil},
	{"**/.gvimrc", AttentionProtected, whyEditorRC, nil},
	{"**/.config/nvim/", AttentionProtected, whyEditorRC, nil},
	{"**/.emacs", AttentionProtected, whyEditorRC, nil},
	{"**/.emacs.d/", AttentionProtected, whyEditorRC, nil},
	// CI.
	{".github/workflows/", AttentionFlagged, "GitHub Actions run this", nil},
	{".github/actions/", AttentionFlagged, "GitHub Actions run this", nil},
	{"**/action.yml", AttentionFlagged, "a GitHub Action's definition: workflows run it", nil},
	{"**/action.yaml", AttentionFlagged, "a GitHub Action's definition: workflows run it", nil},
	{".forgejo/workflows/", AttentionFlagged, "Forgejo Actions run this", nil},
	{".gitea/workflows/", AttentionFlagged, "Gitea Actions run this", nil},
	{"**/.gitlab-ci.yml", AttentionFlagged, whyCI, nil},
	{".circleci/", AttentionFlagged, whyCI, nil},
	{"**/.travis.yml", AttentionFlagged, whyCI, nil},
	{"**/Jenkinsfile", AttentionFlagged, whyCI, nil},
	{"**/azure-pipelines.yml", AttentionFlagged, whyCI, nil},
	{"**/bitbucket-pipelines.yml", AttentionFlagged, whyCI, nil},
	{"**/.drone.yml", AttentionFlagged, whyCI, nil},
	{".buildkite/", AttentionFlagged, whyCI, nil},
	{"**/.woodpecker*/", AttentionFlagged, whyCI, nil},
	// Editors.
	{"**/.vscode/", AttentionFlagged, "editor settings and tasks can run commands", nil},
	{"**/*.code-workspace", AttentionFlagged, "editor workspace settings and tasks can run commands", nil},
	{"**/.idea/", AttentionFlagged, "IDE settings and run configurations can run commands", nil},
	{"**/.zed/", AttentionFlagged, "Zed settings and tasks can run commands", nil},
	{"**/.helix/", AttentionFlagged, "Helix starts the language servers and formatters it names", nil},
	{"**/.nvim.lua", AttentionFlagged, "Neovim runs it when the folder opens (exrc)", nil},
	{"**/.nvimrc", AttentionFlagged, "Neovim runs it when the folder opens (exrc)", nil},
	{"**/.exrc", AttentionFlagged, "Vim and Neovim run it when the folder opens (exrc)", nil},
	{"**/.dir-locals.el", AttentionFlagged, "Emacs evaluates it for files below it (eval: variables)", nil},
	{"**/.dir-locals-2.el", AttentionFlagged, "Emacs evaluates it for files below it (eval: variables)", nil},
	{"**/.devcontainer*/", AttentionFlagged, "dev container definition runs on the host's Docker", nil},
	// Coding agents on the host.
	{"**/.claude/", AttentionFlagged, "Claude Code settings: hooks run commands on the host", nil},
	{"**/.mcp.json", AttentionFlagged, "Claude Code starts the MCP servers it names", nil},
	{"**/.cursor/", AttentionFlagged, "Cursor settings and MCP servers run commands", nil},
	{"**/.gemini/", AttentionFlagged, whyAgentCfg + " (Gemini CLI)", nil},
	{"**/opencode.json", AttentionFlagged, whyAgentCfg + " (opencode)", nil},
	{"**/opencode.jsonc", AttentionFlagged, whyAgentCfg + " (opencode)", nil},
	{"**/.opencode/", AttentionFlagged, whyAgentCfg + " (opencode: plugins run as code)", nil},
	{"**/.aider.conf.yml", AttentionFlagged, whyAgentCfg + " (aider: lint and test commands)", nil},
	{"**/.continue/", AttentionFlagged, whyAgentCfg + " (Continue)", nil},
	{"**/.roo/", AttentionFlagged, whyAgentCfg + " (Roo Code)", nil},
	{"**/.amazonq/", AttentionFlagged, whyAgentCfg + " (Amazon Q)", nil},
	{"**/.codex/", AttentionFlagged, whyAgentCfg + " (Codex)", nil},
	{"**/.kiro/", AttentionFlagged, whyAgentCfg + " (Kiro: hooks)", nil},
	{"**/.windsurf/", AttentionFlagged, whyAgentCfg + " (Windsurf)", nil},
	{"**/CLAUDE.md", AttentionFlagged, whyAgentMD, nil},
	{"**/CLAUDE.local.md", AttentionFlagged, whyAgentMD, nil},
	{"**/AGENTS.md", AttentionFlagged, whyAgentMD, nil},
	{"**/GEMINI.md", AttentionFlagged, whyAgentMD, nil},
	{"**/.cursorrules", AttentionFlagged, whyAgentMD, nil},
	{"**/.clinerules/", AttentionFlagged, whyAgentMD, nil},
	{"**/.windsurfrules", AttentionFlagged, whyAgentMD, nil},
	{".github/copilot-instructions.md", AttentionFlagged, whyAgentMD, nil},
	// Build tools and task runners.
	{"**/Makefile", AttentionFlagged, "runs when you type make", nil},
	{"**/GNUmakefile", AttentionFlagged, "runs when you type make", nil},
	{"**/*.mk", AttentionFlagged, "included by make", nil},
	{"**/justfile", AttentionFlagged, "runs when you type just", nil},
	{"**/.justfile", AttentionFlagged, "runs when you type just", nil},
	{"**/Taskfile*.yml", AttentionFlagged, "runs when you type task", nil},
	{"**/Taskfile*.yaml", AttentionFlagged, "runs when you type task", nil},
	{"**/Procfile", AttentionFlagged, "foreman, overmind and heroku local run the commands it names", nil},
	{"**/Tiltfile", AttentionFlagged, "tilt up evaluates it (Starlark: local() runs commands)", nil},
	{"**/skaffold.yaml", AttentionFlagged, "skaffold runs the build hooks it names", nil},
	{"**/Earthfile", AttentionFlagged, "earthly runs it (LOCALLY runs on the host)", nil},
	{"**/SConstruct", AttentionFlagged, "SCons runs it as Python", nil},
	{"**/SConscript", AttentionFlagged, "SCons runs it as Python", nil},
	{"**/wscript", AttentionFlagged, "waf runs it as Python", nil},
	{"**/conanfile.py", AttentionFlagged, "conan runs it as Python", nil},
	{"**/tasks.py", AttentionFlagged, "invoke runs it as Python", nil},
	{"**/fabfile.py", AttentionFlagged, "fabric runs it as Python", nil},
	{"**/hatch_build.py", AttentionFlagged, "hatch runs it as a build hook", nil},
	{"**/.config/nextest.toml", AttentionFlagged, "cargo nextest runs the setup scripts it names", nil},
	{"**/mise*.toml", AttentionFlagged, "mise hooks and tasks run commands", nil},
	{"**/.mise*/", AttentionFlagged, "mise hooks and tasks run commands", nil},
	{"**/.config/mise*/", AttentionFlagged, "mise hooks and tasks run commands", nil},
	{"**/.tool-versions", AttentionFlagged, "asdf and mise install and run the tools it names (mise backends: npm:, cargo:, ubi: …)", nil},
	{"**/.env", AttentionFlagged, "docker compose (COMPOSE_FILE), direnv's load_dotenv, mise and autoenv read or run it", nil},
	// Environment managers (often entered automatically with direnv).
	{"**/flake.nix", AttentionFlagged, "nix develop (and nix-direnv) runs its shell hook", nil},
	{"**/shell.nix", AttentionFlagged, "nix-shell (and nix-direnv) runs its shell hook", nil},
	{"**/default.nix", AttentionFlagged, "nix-shell and nix-build evaluate it (and nix-direnv)", nil},
	{"**/devenv.nix", AttentionFlagged, "devenv runs its shell hook", nil},
	{"**/devbox.json", AttentionFlagged, "devbox shell runs its init hook and scripts", nil},
	{"**/pixi.toml", AttentionFlagged, "pixi runs its tasks and activation scripts", nil},
	{"**/.flox/", AttentionFlagged, "flox activate runs its hooks", nil},
	{"**/.venv/", AttentionFlagged, "a Python environment: its activate script and interpreter run when you use it", nil},
	{"**/.direnv/", AttentionFlagged, "direnv's environments (layouts): on your PATH once you enter the directory", nil},
	{"**/node_modules/.bin/", AttentionFlagged, "npm scripts and npx run these by name", nil},
	// Rust, JVM, .NET, Swift, Elixir, Clojure, Bazel, Terraform.
	{"**/.cargo/config", AttentionFlagged, "cargo configuration can set runners and linkers", nil},
	{"**/.cargo/config.toml", AttentionFlagged, "cargo configuration can set runners and linkers", nil},
	{"**/build.rs", AttentionFlagged, "cargo runs it on build; rust-analyzer when the folder opens", nil},
	{"**/rust-toolchain", AttentionFlagged, "rustup runs the toolchain it names", nil},
	{"**/rust-toolchain.toml", AttentionFlagged, "rustup runs the toolchain it names", nil},
	{"**/gradlew", AttentionFlagged, "Gradle wrapper script: runs when you build", nil},
	{"**/gradlew.bat", AttentionFlagged, "Gradle wrapper script: runs when you build", nil},
	{"**/gradle/wrapper/", AttentionFlagged, "Gradle wrapper: downloads and runs the Gradle it names", nil},
	{"**/*.gradle", AttentionFlagged, "Gradle build script: runs on build and IDE import", nil},
	{"**/*.gradle.kts", AttentionFlagged, "Gradle build script: runs on build and IDE import", nil},
	{"**/gradle.properties", AttentionFlagged, "Gradle settings (JVM arguments) for every build", nil},
	{"**/mvnw", AttentionFlagged, "Maven wrapper script: runs when you build", nil},
	{"**/mvnw.cmd", AttentionFlagged, "Maven wrapper script: runs when you build", nil},
	{"**/.mvn/", AttentionFlagged, "Maven wrapper and extensions: run when you build", nil},
	{"**/pom.xml", AttentionFlagged, "Maven plugins run on build and IDE import", nil},
	{"**/*.sbt", AttentionFlagged, "sbt evaluates it as Scala on load (IDE import too)", nil},
	{"**/project/*.scala", AttentionFlagged, "sbt compiles and runs the build definition on load", nil},
	{"**/project.clj", AttentionFlagged, "Leiningen evaluates it as Clojure", nil},
	{"**/mix.exs", AttentionFlagged, "mix evaluates it as Elixir on every command", nil},
	{"**/Package.swift", AttentionFlagged, "SwiftPM runs it as Swift (Xcode when the folder opens)", nil},
	{"**/Directory.Build.props", AttentionFlagged, whyDotnet, nil},
	{"**/Directory.Build.targets", AttentionFlagged, whyDotnet, nil},
	{"**/*.csproj", AttentionFlagged, whyDotnet, nil},
	{"**/*.fsproj", AttentionFlagged, whyDotnet, nil},
	{"**/*.vbproj", AttentionFlagged, whyDotnet, nil},
	{"**/nuget.config", AttentionFlagged, "NuGet sources and credential providers for every restore", nil},
	{"**/BUILD", AttentionFlagged, whyBazel, nil},
	{"**/BUILD.bazel", AttentionFlagged, whyBazel, nil},
	{"**/*.bzl", AttentionFlagged, whyBazel, nil},
	{"**/WORKSPACE", AttentionFlagged, "Bazel repository rules run commands", nil},
	{"**/WORKSPACE.bazel", AttentionFlagged, "Bazel repository rules run commands", nil},
	{"**/MODULE.bazel", AttentionFlagged, "Bazel module extensions run commands", nil},
	{"**/.bazelrc", AttentionFlagged, "Bazel options for every build (wrappers, tools)", nil},
	{"tools/bazel", AttentionFlagged, "bazelisk runs it in place of bazel", nil},
	{"**/*.tf", AttentionFlagged, "terraform plan runs the providers and external programs it names", nil},
	{"**/CMakeLists.txt", AttentionFlagged, "CMake runs it on configure (IDEs configure when the folder opens)", nil},
	{"**/*.cmake", AttentionFlagged, "included by CMake on configure", nil},
	{"**/CMakePresets.json", AttentionFlagged, "CMake presets name the commands and toolchains configure runs", nil},
	{"**/meson.build", AttentionFlagged, "meson runs it on setup", nil},
	// Python.
	{"**/conftest.py", AttentionFlagged, "pytest imports it when it collects tests", nil},
	{"**/setup.py", AttentionFlagged, "pip and setuptools run it on install", nil},
	{"**/*.pth", AttentionFlagged, "Python runs its import lines at every start", nil},
	{"**/sitecustomize.py", AttentionFlagged, "Python imports it at every start", nil},
	{"**/usercustomize.py", AttentionFlagged, "Python imports it at every start", nil},
	{"**/tox.ini", AttentionFlagged, "tox runs the commands it names", nil},
	{"**/noxfile.py", AttentionFlagged, "runs when you type nox", nil},
	{"**/pytest.ini", AttentionFlagged, "pytest options (plugins to load) for every run", nil},
	{"**/Pipfile", AttentionFlagged, "pipenv runs its scripts and installs from the sources it names", nil},
	{"**/.pdbrc", AttentionFlagged, "pdb runs its commands when the debugger starts", nil},
	{"**/.pdbrc.py", AttentionFlagged, "pdb++ runs it when the debugger starts", nil},
	{"**/.pylintrc", AttentionFlagged, "pylint runs init-hook and loads the plugins named (editors run pylint on open): flagged when these change", pylintRisk},
	{"**/pylintrc", AttentionFlagged, "pylint runs init-hook and loads the plugins named (editors run pylint on open): flagged when these change", pylintRisk},
	{"**/requirements*.txt", AttentionFlagged, "pip: flagged when an index, URL, path or editable source is added (--extra-index-url …): its code runs on install", requirementsRisk},
	{"**/requirements/*.txt", AttentionFlagged, "pip: flagged when an index, URL, path or editable source is added (--extra-index-url …): its code runs on install", requirementsRisk},
	{"**/constraints*.txt", AttentionFlagged, "pip: flagged when an index, URL, path or editable source is added (--extra-index-url …): its code runs on install", requirementsRisk},
	{"**/pyproject.toml", AttentionFlagged, "flagged when the build system, a tool section (pytest, setuptools …) or a git/path dependency changes", pyprojectRisk},
	{"**/uv.lock", AttentionFlagged, whyLock, lockfileRisk},
	{"**/poetry.lock", AttentionFlagged, whyLock, lockfileRisk},
	{"**/Pipfile.lock", AttentionFlagged, whyLock, lockfileRisk},
	// Ruby and other DSLs.
	{"**/Gemfile", AttentionFlagged, "bundler evaluates it as Ruby on every bundle command", nil},
	{"**/*.gemspec", AttentionFlagged, "bundler and gem evaluate it as Ruby", nil},
	{"**/Rakefile", AttentionFlagged, "runs when you type rake", nil},
	{"**/Vagrantfile", AttentionFlagged, "vagrant evaluates it as Ruby on every command", nil},
	{"**/Podfile", AttentionFlagged, whyRuby, nil},
	{"**/Brewfile", AttentionFlagged, whyRuby, nil},
	{"**/Fastfile", AttentionFlagged, whyRuby, nil},
	{"**/Dangerfile", AttentionFlagged, whyRuby, nil},
	{"**/Guardfile", AttentionFlagged, whyRuby, nil},
	{"**/Capfile", AttentionFlagged, whyRuby, nil},
	{"**/.irbrc", AttentionFlagged, "irb runs it when it starts", nil},
	{"**/.pryrc", AttentionFlagged, "pry runs it when it starts", nil},
	{"**/composer.json", AttentionFlagged, "composer runs its scripts on install", nil},
	// JavaScript.
	{"**/package.json", AttentionFlagged, "flagged when what runs changes: scripts, bin, hooks, tool configs (eslintConfig, prettier, jest …) or a dependency from outside the registry", packageJSONRisk},
	{"**/package-lock.json", AttentionFlagged, whyLock, lockfileRisk},
	{"**/npm-shrinkwrap.json", AttentionFlagged, whyLock, lockfileRisk},
	{"**/yarn.lock", AttentionFlagged, whyLock, lockfileRisk},
	{"**/pnpm-lock.yaml", AttentionFlagged, whyLock, lockfileRisk},
	{"**/bun.lock", AttentionFlagged, whyLock, lockfileRisk},
	{"**/bun.lockb", AttentionFlagged, "bun's binary lockfile: sources cannot be checked", nil},
	{"**/pnpm-workspace.yaml", AttentionFlagged, "pnpm settings: build-script allowlists, hooks, overrides and catalogs", nil},
	{"**/.npmrc", AttentionFlagged, "npm configuration (script shell, registries)", nil},
	{"**/.bundle/config", AttentionFlagged, "Bundler configuration (gem mirrors, Gemfile path)", nil},
	{"**/.yarnrc", AttentionFlagged, "yarn configuration", nil},
	{"**/.yarnrc.yml", AttentionFlagged, "yarn configuration (plugins, yarnPath run code)", nil},
	{"**/.yarn/plugins/", AttentionFlagged, "yarn runs its plugins", nil},
	{"**/.yarn/releases/", AttentionFlagged, "yarn runs the release yarnPath names", nil},
	{"**/.pnp.cjs", AttentionFlagged, "yarn's loader: node runs it", nil},
	{"**/.pnp.loader.mjs", AttentionFlagged, "yarn's loader: node runs it", nil},
	{"**/.pnpmfile.*", AttentionFlagged, "pnpm runs its hooks on install", nil},
	{"**/bunfig.toml", AttentionFlagged, "bun configuration (preload scripts)", nil},
	{"**/.bunfig.toml", AttentionFlagged, "bun configuration (preload scripts)", nil},
	{"**/package.yaml", AttentionFlagged, "package manifest: scripts run on install", nil},
	{"**/package.json5", AttentionFlagged, "package manifest: scripts run on install", nil},
	{"**/.simple-git-hooks*", AttentionFlagged, "installs git hooks", nil},
	{"**/simple-git-hooks*", AttentionFlagged, "installs git hooks", nil},
	{"**/.lintstagedrc*", AttentionFlagged, "lint-staged runs its commands on commit", nil},
	{"**/lint-staged.config.*", AttentionFlagged, "lint-staged runs its commands on commit", nil},
	{"**/eslint.config.*", AttentionFlagged, whyESLint, nil},
	{"**/.eslintrc", AttentionFlagged, whyESLint, nil},
	{"**/.eslintrc.*", AttentionFlagged, whyESLint, nil},
	{"**/prettier.config.*", AttentionFlagged, whyPrettier, nil},
	{"**/.prettierrc", AttentionFlagged, whyPrettier, nil},
	{"**/.prettierrc.*", AttentionFlagged, whyPrettier, nil},
	{"**/stylelint.config.*", AttentionFlagged, whyBuildCfg + " (stylelint)", nil},
	{"**/.stylelintrc", AttentionFlagged, whyBuildCfg + " (stylelint)", nil},
	{"**/.stylelintrc.*", AttentionFlagged, whyBuildCfg + " (stylelint)", nil},
	{"**/tailwind.config.*", AttentionFlagged, whyBuildCfg + " (Tailwind; its editor extension loads it)", nil},
	{"**/babel.config.*", AttentionFlagged, whyBuildCfg + " (Babel)", nil},
	{"**/.babelrc", AttentionFlagged, whyBuildCfg + " (Babel)", nil},
	{"**/.babelrc.*", AttentionFlagged, whyBuildCfg + " (Babel)", nil},
	{"**/jest.config.*", AttentionFlagged, whyBuildCfg + " (Jest)", nil},
	{"**/vitest.config.*", AttentionFlagged, whyBuildCfg + " (Vitest)", nil},
	{"**/vitest.workspace.*", AttentionFlagged, whyBuildCfg + " (Vitest)", nil},
	{"**/vite.config.*", AttentionFlagged, whyBuildCfg + " (Vite)", nil},
	{"**/svelte.config.*", AttentionFlagged, whyBuildCfg + " (Svelte; its language server loads it)", nil},
	{"**/postcss.config.*", AttentionFlagged, whyBuildCfg + " (PostCSS)", nil},
	{"**/webpack.config.*", AttentionFlagged, whyBuildCfg + " (webpack)", nil},
	{"**/rollup.config.*", AttentionFlagged, whyBuildCfg + " (Rollup)", nil},
	{"**/next.config.*", AttentionFlagged, whyBuildCfg + " (Next.js)", nil},
	{"**/nuxt.config.*", AttentionFlagged, whyBuildCfg + " (Nuxt)", nil},
	{"**/astro.config.*", AttentionFlagged, whyBuildCfg + " (Astro)", nil},
	{"**/tsconfig*.json", AttentionFlagged, whyTSConfig, nil},
	{"**/jsconfig*.json", AttentionFlagged, whyTSConfig, nil},
	// Containers.
	{"**/docker-compose*.yml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)", nil},
	{"**/docker-compose*.yaml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)", nil},
	{"**/compose*.yml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)", nil},
	{"**/compose*.yaml", AttentionFlagged, "docker compose runs it on the host's Docker (host mounts, privileged)", nil},
	// Git.
	{"**/.gitattributes", AttentionFlagged, "git attributes select filters and diff drivers", nil},
	{"**/.gitmodules", AttentionFlagged, "submodule URLs are fetched by git", nil},
	{"**/.lfsconfig", AttentionFlagged, "git-lfs pushes and fetches large files at the URL it names", nil},
	// Rust manifests, judged by what changed.
	{"**/Cargo.toml", AttentionFlagged, "flagged when a build script, proc macro, git/path source, patch or target runner changes", cargoRisk},
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
			if comp != "{.git}" {
				comp = foldName(comp)
			}
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
		if r.Check != nil {
			continue // judged on content (contentRisk)
		}
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
	"pnpm", "workspaces", "eslintConfig", "prettier", "jest", "stylelint", "babel",
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

// contentRisk judges a path the table's content-aware rows name (a
// manifest, a lockfile, a linter config: changing them is everyday work,
// only some changes run code): it returns why the change from old to new
// runs code, or "" when it does not. ok is false for a path no such row
// names.
func contentRisk(p string, old, new []byte) (why string, ok bool) {
	keys := classKeys(p)
	for i := range compiledRules {
		r := &compiledRules[i]
		if r.Check != nil && r.match(keys, false) {
			return r.Check(old, new), true
		}
	}
	return "", false
}

func cargoRisk(old, new []byte) string {
	return tomlRisk("Cargo.toml", old, new, func(section, line string) bool {
		return strings.HasPrefix(section, "patch") || strings.HasPrefix(section, "replace") ||
			strings.HasPrefix(section, "target") || section == "lib" || strings.HasSuffix(section, "build-dependencies") ||
			tomlKeyIn(line, "build", "links", "proc-macro", "proc_macro", "git", "path", "registry", "registry-index", "runner", "linker", "rustflags", "workspace", "members", "default-members", "metadata")
	})
}

func pyprojectRisk(old, new []byte) string {
	return tomlRisk("pyproject.toml", old, new, func(section, line string) bool {
		return section == "build-system" || strings.HasPrefix(section, "tool.") && section != "tool.black" &&
			section != "tool.ruff" && !strings.HasPrefix(section, "tool.ruff.") && section != "tool.isort" ||
			strings.Contains(line, "git+") || strings.Contains(line, "file:") || strings.Contains(line, " @ ")
	})
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

// addedLines is the trimmed lines of new that old lacks (comments and
// blank lines left out), in order.
func addedLines(old, new []byte, comment string) []string {
	have := map[string]bool{}
	for l := range strings.SplitSeq(string(old), "\n") {
		have[strings.TrimSpace(l)] = true
	}
	var out []string
	for l := range strings.SplitSeq(string(new), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || have[l] || (comment != "" && strings.HasPrefix(l, comment)) {
			continue
		}
		out = append(out, l)
	}
	return out
}

// firstLines is up to two lines for a reason, each cut short.
func firstLines(what []string) string {
	if len(what) > 2 {
		what = append(what[:2:2], "…")
	}
	return termtextSafeJoin(what)
}

// registryHosts are the default package registries a lockfile's URLs may
// name without a flag.
var registryHosts = []string{"registry.npmjs.org", "registry.yarnpkg.com", "pypi.org", "files.pythonhosted.org"}

// lockSourceMarkers are what lockfiles write for a source outside the
// registry: git, a path, a tarball, a link.
var lockSourceMarkers = []string{
	"git+", "git://", "git@", "github:", "gitlab:", "bitbucket:", "codeload.github.com",
	"file:", "link:", "portal:", "exec:", "tarball", "type: git", "type: directory",
	`"link": true`, `git = "`, `path = "`, `directory = "`, `editable = "`, `type = "git"`,
	`type = "directory"`, `type = "file"`, `"git":`, `"path":`, `"editable": true`,
}

// lockfileRisk flags a lockfile change that adds a source outside the
// default registries (npm, yarn, pnpm, bun, uv, poetry, pipenv): a git
// repository, a path, a tarball or another host.
func lockfileRisk(old, new []byte) string {
	var what []string
	for _, l := range addedLines(old, new, "#") {
		if lockLineRisky(l) {
			what = append(what, l)
		}
	}
	if len(what) == 0 {
		return ""
	}
	return "lockfile adds a source outside the registry: " + firstLines(what)
}

func lockLineRisky(l string) bool {
	for _, m := range lockSourceMarkers {
		if strings.Contains(l, m) {
			return true
		}
	}
	// npm: "resolved" is a URL of the registry or something else (a path).
	if v, ok := strings.CutPrefix(l, `"resolved": "`); ok && !strings.HasPrefix(v, "https://") && !strings.HasPrefix(v, "http://") {
		return true
	}
	for rest := l; ; {
		i := strings.Index(rest, "://")
		if i < 0 {
			return false
		}
		rest = rest[i+3:]
		host := rest
		if j := strings.IndexAny(host, "/\\\"' ?#:"); j >= 0 {
			host = host[:j]
		}
		if !slices.Contains(registryHosts, strings.ToLower(host)) {
			return true
		}
	}
}

// riskyPipOptions are requirement-file options that add a source or pass
// options to a package's build.
var riskyPipOptions = []string{
	"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host", "-e", "--editable",
	"--global-option", "--config-settings", "--install-option", "--no-index",
}

// requirementsRisk flags requirement lines that install from outside the
// index (another index, a URL, a VCS, a local path, an editable): their
// setup code runs on install.
func requirementsRisk(old, new []byte) string {
	var what []string
	for _, l := range addedLines(old, new, "#") {
		low := strings.ToLower(l)
		switch {
		case strings.HasPrefix(low, "-"):
			// Options: only those that add a source or build options
			// (--hash, --only-binary … are everyday pip-compile output; -r
			// and -c name files judged by their own names).
			opt, _, _ := strings.Cut(strings.Fields(low)[0], "=")
			if slices.Contains(riskyPipOptions, opt) {
				what = append(what, l)
			}
		case strings.Contains(low, "://"), strings.Contains(low, "git+"), strings.Contains(low, "file:"),
			strings.Contains(low, " @ "), strings.HasPrefix(low, "."), strings.HasPrefix(low, "/"), strings.HasPrefix(low, "~"):
			what = append(what, l)
		}
	}
	if len(what) == 0 {
		return ""
	}
	return "pip installs from outside the index: " + firstLines(what)
}

// pylintRisk flags a pylintrc change to what pylint runs: init-hook (Python
// run at start) and the plugins it loads.
func pylintRisk(old, new []byte) string {
	var what []string
	for _, l := range addedLines(old, new, "#") {
		key := strings.ToLower(strings.TrimSpace(strings.FieldsFunc(l, func(r rune) bool { return r == '=' || r == ':' })[0]))
		if key == "init-hook" || key == "load-plugins" || key == "init_hook" || key == "load_plugins" {
			what = append(what, l)
		}
	}
	if len(what) == 0 {
		return ""
	}
	return "pylint runs this on start: " + firstLines(what)
}
