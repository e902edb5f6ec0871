package baseline

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// EnvVar is one assignment of a .env file.
type EnvVar struct {
	Key   string
	Value string
	Line  int
}

// String never shows the value.
func (v EnvVar) String() string {
	return fmt.Sprintf("%s (line %d, %d chars)", v.Key, v.Line, len(v.Value))
}

// ParseEnv reads a .env file: KEY=VALUE lines, an optional "export ",
// # comments, single-quoted (literal) and double-quoted (with \n \t \"
// \\ escapes) values that may span lines, and unquoted values ending at
// " #". Lines that are not assignments are skipped.
func ParseEnv(data []byte) []EnvVar {
	var out []EnvVar
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(strings.TrimSuffix(lines[i], "\r"))
		if line == "" || line[0] == '#' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		if !ok || !envKey(k) {
			continue
		}
		start := i + 1
		v = strings.TrimLeft(v, " \t")
		switch {
		case strings.HasPrefix(v, `"`):
			val, next, ok := envQuoted(lines, i, v[1:], '"')
			if !ok {
				continue
			}
			v, i = unescapeEnv(val), next
		case strings.HasPrefix(v, "'"):
			val, next, ok := envQuoted(lines, i, v[1:], '\'')
			if !ok {
				continue
			}
			v, i = val, next
		default:
			if j := strings.Index(v, " #"); j >= 0 {
				v = v[:j]
			}
			v = strings.TrimSpace(v)
		}
		out = append(out, EnvVar{Key: k, Value: v, Line: start})
	}
	return out
}

func envKey(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '.' || c == '-')) {
			return false
		}
	}
	return true
}

// envQuoted reads a quoted value that starts with rest on line i and may
// continue on the following lines; it returns the raw value and the last
// line used.
func envQuoted(lines []string, i int, rest string, q byte) (string, int, bool) {
	var b strings.Builder
	for j := i; j < len(lines) && j < i+200; j++ {
		s := rest
		if j > i {
			b.WriteByte('\n')
			s = strings.TrimSuffix(lines[j], "\r")
		}
		for k := 0; k < len(s); k++ {
			if s[k] == '\\' && q == '"' && k+1 < len(s) {
				b.WriteByte(s[k])
				b.WriteByte(s[k+1])
				k++
				continue
			}
			if s[k] == q {
				return b.String(), j, true
			}
			b.WriteByte(s[k])
		}
	}
	return "", i, false
}

func unescapeEnv(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// secretKeyWords in an environment variable's name mark its value as a
// secret.
var secretKeyWords = []string{"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "PASS", "PWD", "CREDENTIAL",
	"AUTH", "PRIVATE", "SALT", "SIGNATURE", "DSN", "COOKIE", "CERT"}

// EnvSecret decides whether a .env value is a secret to scrub, and says
// why (or why not). A value is one when it is at least MinSecretLen long,
// is not a number, a boolean, a placeholder, a path, or a URL without a
// password, and either its name holds a secret word (KEY, SECRET, TOKEN,
// PASSWORD, PASS, PWD, AUTH, PRIVATE, SALT, DSN …) or it looks random (16
// or more characters of high entropy mixing letter cases or digits). A
// URL's password counts on its own too (see EnvSecrets).
func EnvSecret(key, value string) (bool, string) {
	v := strings.TrimSpace(value)
	switch {
	case len(v) < MinSecretLen:
		return false, fmt.Sprintf("shorter than %d characters", MinSecretLen)
	case isBoolWord(v):
		return false, "a boolean"
	case isNumber(v):
		return false, "a number"
	case placeholder([]byte(v)):
		return false, "a placeholder"
	case strings.HasPrefix(v, "/") || strings.HasPrefix(v, "./") || strings.HasPrefix(v, "../") || strings.HasPrefix(v, "~/"):
		return false, "a path"
	}
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		if _, ok := u.User.Password(); ok {
			return true, "a URL with a password"
		}
		return false, "a URL without a password"
	}
	upper := strings.ToUpper(key)
	for _, w := range secretKeyWords {
		if strings.Contains(upper, w) {
			return true, "its name holds " + w
		}
	}
	if len(v) >= 16 && !strings.ContainsAny(v, " \t\n") && classCount([]byte(v)) >= 2 && entropy([]byte(v)) >= 3.5 {
		return true, "it looks random"
	}
	return false, "not secret-looking (name and value)"
}

func isBoolWord(v string) bool {
	switch strings.ToLower(v) {
	case "true", "false", "yes", "no", "on", "off", "enabled", "disabled":
		return true
	}
	return false
}

func isNumber(v string) bool {
	_, err := strconv.ParseFloat(v, 64)
	return err == nil
}

// EnvSecrets returns the secrets of a parsed .env file (see EnvSecret),
// each with its source "<file>:<line> <KEY>", plus the password of a URL
// value on its own.
func EnvSecrets(vars []EnvVar, file string) []Secret {
	var out []Secret
	for _, v := range vars {
		ok, _ := EnvSecret(v.Key, v.Value)
		if !ok {
			continue
		}
		src := fmt.Sprintf("%s:%d %s", file, v.Line, v.Key)
		out = append(out, Secret{Value: strings.TrimSpace(v.Value), Source: src})
		if u, err := url.Parse(strings.TrimSpace(v.Value)); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && len(pw) >= MinSecretLen {
				out = append(out, Secret{Value: pw, Source: src + " (password)"})
			}
		}
	}
	return out
}

// IsEnvFile reports names of environment files: .env, .env.<anything>
// and <anything>.env.
func IsEnvFile(name string) bool {
	return name == ".env" || strings.HasPrefix(name, ".env.") || (strings.HasSuffix(name, ".env") && len(name) > 4)
}

// ParseAllowlist reads a DLP allowlist (<workspace>/.vibedom/dlp_allowlist.txt):
// one entry a line, lines starting with # are comments. A plain line is a
// value never redacted (exactly, whitespace at its ends trimmed);
// "re:<regexp>" a pattern a whole value must match; "context:<category>"
// a category let through (as --allow-context). Bad lines are reported
// with their source and line; none widens the allowlist.
func ParseAllowlist(r io.Reader, source string) (Allowlist, error) {
	var a Allowlist
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		at := fmt.Sprintf("%s:%d", source, n)
		switch {
		case strings.HasPrefix(line, "re:"):
			re, err := compileAllowPattern(line[3:])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at, err))
				continue
			}
			a.Patterns = append(a.Patterns, re)
		case strings.HasPrefix(line, "context:"):
			c, err := ParseCategory(line[len("context:"):])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", at, err))
				continue
			}
			a.Categories = append(a.Categories, c)
		default:
			a.Values = append(a.Values, line)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read %s: %w", source, err))
	}
	return a, errors.Join(errs...)
}

// LoadAllowlist reads an allowlist file; a missing file is an empty list.
func LoadAllowlist(path string) (Allowlist, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Allowlist{}, nil
	}
	if err != nil {
		return Allowlist{}, err
	}
	defer f.Close()
	return ParseAllowlist(f, path)
}

// Merge adds b's entries to a.
func (a Allowlist) Merge(b Allowlist) Allowlist {
	a.Values = append(append([]string(nil), a.Values...), b.Values...)
	a.Patterns = append(a.Patterns[:len(a.Patterns):len(a.Patterns)], b.Patterns...)
	a.Categories = append(a.Categories[:len(a.Categories):len(a.Categories)], b.Categories...)
	return a
}

// Empty reports an allowlist with no entries.
func (a Allowlist) Empty() bool {
	return len(a.Values) == 0 && len(a.Patterns) == 0 && len(a.Categories) == 0
}

// String summarises the allowlist without its values.
func (a Allowlist) String() string {
	var cats []string
	for _, c := range a.Categories {
		cats = append(cats, c.String())
	}
	return fmt.Sprintf("%d values, %d patterns, categories [%s]", len(a.Values), len(a.Patterns), strings.Join(cats, " "))
}

// ParseAllowPattern reads an --allow-pattern: "re:<regexp>" is a pattern,
// anything else a literal value.
func ParseAllowPattern(s string) (Allowlist, error) {
	if strings.HasPrefix(s, "re:") {
		re, err := compileAllowPattern(s[3:])
		if err != nil {
			return Allowlist{}, fmt.Errorf("--allow-pattern: %w", err)
		}
		return Allowlist{Patterns: append([]*regexp.Regexp(nil), re)}, nil
	}
	if strings.TrimSpace(s) == "" {
		return Allowlist{}, errors.New("--allow-pattern: empty value")
	}
	return Allowlist{Values: []string{s}}, nil
}

var errEmptyPattern = errors.New("empty pattern")

func compileAllowPattern(s string) (*regexp.Regexp, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errEmptyPattern
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("bad pattern %q: %w", s, err)
	}
	if re.MatchString("") {
		return nil, fmt.Errorf("pattern %q matches the empty string, which would exempt everything it touches", s)
	}
	return re, nil
}
