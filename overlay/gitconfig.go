package overlay

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Programs git's config names. Git runs more than the hooks directory: a
// hook.<name>.command (git 2.54 and later), clean and smudge filters,
// textconv and merge drivers, core.fsmonitor, the editor, the pager, ssh,
// gpg, a credential helper. When the user's config (the repository's, what
// it includes, the global and system config) names a file of the workspace
// as one of these, the agent changing that file gets code run on the host
// at the user's next commit, diff or checkout: the file is protected like
// the hooks directory.

// configRunsShell are the keys whose value git runs as a shell command (or
// as a program, which is the command's first word too). A "*" stands for
// one subsection or variable name.
var configRunsShell = []string{
	"hook.*.command", "core.sshcommand", "core.editor", "core.pager", "core.askpass", "core.gitproxy",
	"sequence.editor", "diff.external", "diff.*.textconv", "diff.*.command", "difftool.*.cmd", "mergetool.*.cmd",
	"filter.*.clean", "filter.*.smudge", "filter.*.process", "merge.*.driver", "interactive.difffilter",
	"gpg.program", "gpg.*.program", "sendemail.*.sendmailcmd", "sendemail.sendmailcmd",
	"mergetool.*.path", "difftool.*.path", "gpg.ssh.defaultkeycommand", "browser.*.cmd", "browser.*.path",
	"man.*.cmd", "man.*.path", "core.alternaterefscommand", "uploadpack.packobjectshook", "remote.*.uploadpack",
	"remote.*.receivepack", "tar.*.command", "trailer.*.command", "trailer.*.cmd", "sendemail.tocmd",
	"sendemail.cccmd", "sendemail.headercmd", "sendemail.smtpserver", "guitool.*.cmd",
}

// configRunsUnlessBool are keys whose value is a boolean or a command.
var configRunsUnlessBool = []string{"core.fsmonitor", "pager.*"}

// interpreters run the script their first argument names.
var interpreters = []string{"sh", "bash", "zsh", "dash", "ksh", "fish", "python", "python3", "node", "perl", "ruby", "deno", "bun", "env",
	"exec", "command", "nohup", "nice", "time", "xargs"}

// configProgram is a file of the workspace git runs (or reads config from).
type configProgram struct {
	rel string // slash-separated, relative to the workspace
	why string
}

// gitConfigPrograms is the files inside ws that ws's repository's config
// names as programs git runs, or as config files it reads (an include.path
// into the workspace, or any config file there): nil when there is no
// repository or no git.
func gitConfigPrograms(ctx context.Context, ws string) []configProgram {
	real, err := filepath.EvalSymlinks(ws)
	if err != nil {
		return nil
	}
	top, entries, err := repoConfig(ctx, real)
	if err != nil {
		return nil
	}
	return configPrograms(real, top, entries)
}

// configPrograms is gitConfigPrograms on config already read: ws is the
// workspace, top the repository's top directory (where git runs what its
// config names), both absolute and symlink-free.
func configPrograms(ws, top string, entries []configEntry) []configProgram {
	var out []configProgram
	seen := map[string]bool{}
	add := func(abs, why string) {
		rel, ok := insideWorkspace(ws, abs)
		if ok && !seen[rel] {
			seen[rel] = true
			out = append(out, configProgram{rel, why})
		}
	}
	for _, e := range entries {
		where := ""
		if e.origin != "" {
			where = " in " + DisplayPath(e.origin)
			add(e.origin, "git reads its config from here: the hooks, filters and tools it names run on the host")
		}
		why := fmt.Sprintf("git runs it on the host (%s%s)", e.key, where)
		switch {
		case configKeyIn(e.key, "include.path", "includeif.*.path"):
			p := expandHome(e.value)
			if !filepath.IsAbs(p) && e.origin != "" {
				p = filepath.Join(filepath.Dir(e.origin), p)
			}
			if filepath.IsAbs(p) {
				add(p, fmt.Sprintf("git reads its config from here (%s%s): the hooks, filters and tools it names run on the host", e.key, where))
			}
		case configKeyIn(e.key, "credential.helper", "credential.*.helper"):
			// "!cmd" is a shell command; an absolute path is run; any other
			// name is git credential-<name>, looked up in PATH.
			if cmd, ok := strings.CutPrefix(e.value, "!"); ok {
				for _, p := range commandFiles(top, cmd) {
					add(p, why)
				}
			} else if p := expandHome(e.value); filepath.IsAbs(p) {
				add(strings.Fields(p + " ")[0], why)
			}
		case configKeyIn(e.key, "alias.*", "submodule.*.update"):
			if cmd, ok := strings.CutPrefix(e.value, "!"); ok {
				for _, p := range commandFiles(top, cmd) {
					add(p, why)
				}
			}
		case configKeyIn(e.key, configRunsUnlessBool...) && gitBool(e.value):
		case configKeyIn(e.key, configRunsShell...), configKeyIn(e.key, configRunsUnlessBool...):
			for _, p := range commandFiles(top, e.value) {
				add(p, why)
			}
		}
	}
	return out
}

// configKeyIn reports whether key matches one of the patterns, a "*"
// standing for any subsection (which may hold dots) or variable name.
func configKeyIn(key string, patterns ...string) bool {
	for _, p := range patterns {
		ps := strings.Split(p, ".")
		sec, rest, _ := strings.Cut(key, ".")
		i := strings.LastIndexByte(rest, '.')
		ks := []string{sec, rest}
		if i >= 0 {
			ks = []string{sec, rest[:i], rest[i+1:]}
		}
		if len(ks) != len(ps) {
			continue
		}
		ok := true
		for j := range ps {
			if ps[j] != "*" && ps[j] != strings.ToLower(ks[j]) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// gitBool reports whether git takes v as a boolean (then it names no
// program).
func gitBool(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "true", "false", "yes", "no", "on", "off":
		return true
	}
	_, err := strconv.Atoi(strings.TrimSpace(v))
	return err == nil
}

// commandFiles is the files a command line runs, as absolute paths: in
// each of its simple commands (split at ;, &, |, newlines, parentheses and
// backquotes: "npm test && ./scripts/check.sh" runs both), the first word
// (after NAME=value assignments), and the script an interpreter there is
// given, when they are paths (a bare name is looked up in PATH, not in the
// work tree); the string of an interpreter's -c is a command line of its
// own. Relative paths are taken from top, where git runs what its config
// names.
func commandFiles(top, cmd string) []string {
	return commandFilesDepth(top, cmd, 0)
}

func commandFilesDepth(top, cmd string, depth int) []string {
	var out []string
	for _, words := range shellCommands(cmd) {
		for len(words) > 0 && (strings.Contains(words[0], "=") && !strings.Contains(words[0], "/") || slices.Contains(shellReserved, words[0])) {
			words = words[1:]
		}
		for i := 0; i < len(words); i++ {
			w := words[i]
			if i > 0 && w == "-c" && i+1 < len(words) && slices.Contains(interpreters, path.Base(words[0])) {
				if depth < 4 {
					out = append(out, commandFilesDepth(top, words[i+1], depth+1)...)
				}
				break
			}
			if i > 0 && strings.HasPrefix(w, "-") {
				continue
			}
			if p := expandHome(w); strings.Contains(p, "/") {
				if !filepath.IsAbs(p) {
					p = filepath.Join(top, p)
				}
				out = append(out, p)
			}
			if !slices.Contains(interpreters, path.Base(w)) || i > 8 {
				break
			}
		}
	}
	return out
}

// shellReserved are words a shell takes before a command ("!f() { ./x; }; f",
// "if ./x; then ./y; fi"): the command is the word after.
var shellReserved = []string{"{", "}", "!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until"}

// shellCommands splits a command line into simple commands, each into
// words, the way a POSIX shell would for the simple cases (blanks, single
// and double quotes, backslashes); an operator (;, &, |, <, >, newline,
// parentheses, backquote) ends a command.
func shellCommands(s string) [][]string {
	var out [][]string
	var cmd []string
	var w strings.Builder
	in, quote := false, byte(0)
	word := func() {
		if in {
			cmd = append(cmd, w.String())
			w.Reset()
			in = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(s):
				i++
				w.WriteByte(s[i])
			default:
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
			in = true
		case c == ' ' || c == '\t':
			word()
		case strings.IndexByte(";&|<>\n()`", c) >= 0:
			word()
			if len(cmd) > 0 {
				out = append(out, cmd)
				cmd = nil
			}
			if c == '<' || c == '>' {
				// A redirection's target is a file, not a command: skip it.
				for i+1 < len(s) && (s[i+1] == ' ' || s[i+1] == '\t' || s[i+1] == '>' || s[i+1] == '&') {
					i++
				}
				for i+1 < len(s) && strings.IndexByte(" \t;&|<>\n()`", s[i+1]) < 0 {
					i++
				}
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	word()
	if len(cmd) > 0 {
		out = append(out, cmd)
	}
	return out
}

// expandHome expands a leading "~/" as git and the shell do.
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if h := os.Getenv("HOME"); h != "" {
			return filepath.Join(h, rest)
		}
	}
	return p
}

// insideWorkspace is abs relative to ws (slash-separated) when it is inside
// it, its existing leading directories resolved.
func insideWorkspace(ws, abs string) (string, bool) {
	abs = filepath.Clean(abs)
	// Resolve the longest existing prefix: the file itself may not exist
	// yet (the agent may add it).
	// Its last component is kept as it is: a symlink there is the
	// workspace's file, whatever it points at.
	rest := filepath.Base(abs)
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			abs = filepath.Join(r, rest)
			break
		}
		if p == filepath.Dir(p) {
			break
		}
		rest = filepath.Join(filepath.Base(p), rest)
	}
	rel, err := filepath.Rel(ws, abs)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}
