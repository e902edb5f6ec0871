package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// IgnoreFile is the name of gitleaks' ignore file at the workspace root.
const IgnoreFile = ".gitleaksignore"

// maxIgnoreSize bounds the ignore file read.
const maxIgnoreSize = 4 << 20

var commitRE = regexp.MustCompile(`^[0-9a-fA-F]{7,64}$`)

// ignoreSet holds the fingerprints of a .gitleaksignore, normalised to
// "file:rule:line" with file workspace-relative and slash-separated.
type ignoreSet map[string]bool

// readIgnore reads <workspace>/.gitleaksignore. Each non-comment line is a
// gitleaks fingerprint, `file:rule-id:line` or `commit:file:rule-id:line`.
// A commit-prefixed entry is honoured for the working tree by its
// file:rule:line part (gitleaks itself only applies it to that commit's
// history; a directory scan has no commits). Paths may use backslashes,
// a leading "./", or be absolute inside the workspace. Lines that do not
// parse are returned as warnings. A file that cannot be used (a symlink, a
// FIFO, over 4 MiB, unreadable) is a warning too, and ignores nothing.
// roots are the workspace's absolute spellings (as given, symlinks
// resolved) that absolute entries may start with.
func readIgnore(workspace string, roots []string) (ignoreSet, []string) {
	set := ignoreSet{}
	b, err := readNoFollow(filepath.Join(workspace, IgnoreFile), maxIgnoreSize+1)
	if errors.Is(err, fs.ErrNotExist) {
		return set, nil
	}
	if err == nil && len(b) > maxIgnoreSize {
		err = fmt.Errorf("larger than %d bytes", maxIgnoreSize)
	}
	if err != nil {
		// Fail towards showing more: without the file nothing is ignored.
		return set, []string{fmt.Sprintf("%s not used (every finding is shown): %v", IgnoreFile, err)}
	}
	var warnings []string
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fp, ok := parseFingerprint(line, roots)
		if !ok {
			// The line is not echoed: a secret pasted there by mistake
			// must not reach the report.
			warnings = append(warnings, fmt.Sprintf("%s:%d: not a fingerprint (want FILE:RULE:LINE, as the report's \"fingerprint\"); the line ignores nothing", IgnoreFile, n+1))
			continue
		}
		set[fp] = true
	}
	return set, warnings
}

// parseFingerprint normalises one ignore entry. It splits from the right,
// so file names holding colons survive.
func parseFingerprint(s string, roots []string) (string, bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", false
	}
	lineNo, err := strconv.Atoi(s[i+1:])
	if err != nil || lineNo < 0 {
		return "", false
	}
	rest := s[:i]
	j := strings.LastIndexByte(rest, ':')
	if j < 0 {
		return "", false
	}
	rule, file := rest[j+1:], rest[:j]
	if rule == "" {
		return "", false
	}
	if k := strings.IndexByte(file, ':'); k > 0 && commitRE.MatchString(file[:k]) {
		file = file[k+1:]
	}
	file = normalisePath(file, roots)
	if file == "" {
		return "", false
	}
	return fingerprint(file, rule, lineNo), true
}

// normalisePath turns a path as gitleaks printed it into a workspace-
// relative slash path; it returns "" for a path outside the workspace.
func normalisePath(file string, roots []string) string {
	file = strings.ReplaceAll(file, `\`, "/")
	if path.IsAbs(file) {
		abs := path.Clean(file)
		file = ""
		for _, r := range roots {
			if rel, ok := strings.CutPrefix(abs, strings.TrimSuffix(filepath.ToSlash(r), "/")+"/"); ok {
				file = rel
				break
			}
		}
		if file == "" {
			return ""
		}
	}
	file = path.Clean(file)
	if file == "." || file == ".." || strings.HasPrefix(file, "../") {
		return ""
	}
	return file
}

func fingerprint(file, rule string, line int) string {
	return file + ":" + rule + ":" + strconv.Itoa(line)
}
