package egress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// ErrMalformedRule is wrapped by every error about a rule that cannot be
// parsed. Such a rule never widens the policy: loading fails instead.
var ErrMalformedRule = errors.New("malformed rule")

// ErrInvalidName is wrapped by NormalizeName's errors.
var ErrInvalidName = errors.New("invalid host name")

// Source labels for rules that do not come from a file.
const (
	SourceBuiltin = "builtin"
	SourceFlag    = "--allow"
)

// BuiltinRules is the built-in scope: the model APIs of the agents vibedom
// runs (Claude Code, Codex, OpenCode with those providers), HTTPS only.
// Everything else, including the agents' telemetry, login and update hosts,
// must be allowed explicitly. docs/policy.md explains the choice.
const BuiltinRules = `# Claude Code (and OpenCode with the Anthropic provider)
api.anthropic.com:443
# Codex (and OpenCode with the OpenAI provider)
api.openai.com:443
# Gemini CLI
generativelanguage.googleapis.com:443
`

// maxPolicyFile bounds how much of a rule file is read.
const maxPolicyFile = 1 << 20

// Rule is one parsed policy rule. Its zero value matches nothing.
type Rule struct {
	// Text is the rule as written, without comment and surrounding space.
	Text string
	// Source is where the rule came from: "builtin", "--allow", or a file
	// path and line ("~/.vibedom/trusted_domains.txt:12").
	Source string
	// Deny is true for a "!" rule.
	Deny bool

	host     string // normalised name, wildcard base, or IP literal
	ip       netip.Addr
	wildcard bool
	port     uint16 // 0: the default ports (allow: 80 and 443; deny: all)
	anyPort  bool
	private  netip.Prefix // an allow-private rule's range; such a rule matches no name
	noMITM   string       // a no-mitm rule's name; such a rule matches no name either
}

// noMITMPrefix starts a rule that passes TLS to one allowed name through
// uninspected (user scope only): "no-mitm pinned.example".
const noMITMPrefix = "no-mitm "

// allowPrivatePrefix starts a rule that lets upstream names and IP rules
// lead into a private range: "allow-private 10.1.0.0/16".
const allowPrivatePrefix = "allow-private "

// String is the rule text and its source.
func (r Rule) String() string { return r.Text + " (" + r.Source + ")" }

func (r Rule) matchesPort(p uint16) bool {
	switch {
	case r.anyPort:
		return true
	case r.port != 0:
		return p == r.port
	default:
		return p == 80 || p == 443
	}
}

// matchesName reports whether the rule covers the normalised name n.
func (r Rule) matchesName(n string) bool {
	if r.ip.IsValid() || r.host == "" {
		return false
	}
	if !r.wildcard {
		return n == r.host
	}
	return len(n) > len(r.host)+1 && strings.HasSuffix(n, r.host) && n[len(n)-len(r.host)-1] == '.'
}

// RuleError is a malformed rule, with where it was found.
type RuleError struct {
	Source string // file path, "builtin" or "--allow"
	Line   int    // 1-based; 0 when the rule did not come from a file
	Text   string // the offending text, shortened
	Reason string
}

func (e *RuleError) Error() string {
	where := e.Source
	if e.Line > 0 {
		where += ":" + strconv.Itoa(e.Line)
	}
	return fmt.Sprintf("%s: %s %q: %s", where, ErrMalformedRule, e.Text, e.Reason)
}

// Unwrap makes errors.Is(err, ErrMalformedRule) true.
func (e *RuleError) Unwrap() error { return ErrMalformedRule }

var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.Transitional(false),
	idna.BidiRule(),
	idna.VerifyDNSLength(true),
	idna.StrictDomainName(true),
)

// NormalizeName turns a host name into the form the policy compares: IDN
// labels to punycode (UTS #46, non-transitional), lower case, one trailing
// dot removed. It refuses (ErrInvalidName) empty names, empty labels, labels
// over 63 or names over 253 bytes, characters outside letters, digits and
// hyphens (after mapping), names whose last label is numeric (they would be
// read as an IPv4 address by many resolvers) and IP literals (see
// ParseAddr).
func NormalizeName(s string) (string, error) {
	orig := s
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", fmt.Errorf("%w %q: empty", ErrInvalidName, orig)
	}
	if _, ok := ParseAddr(s); ok {
		return "", fmt.Errorf("%w %q: an IP address, not a name", ErrInvalidName, orig)
	}
	a, err := idnaProfile.ToASCII(s)
	if err != nil {
		return "", fmt.Errorf("%w %q: %v", ErrInvalidName, orig, err)
	}
	a = strings.ToLower(a)
	if len(a) > 253 {
		return "", fmt.Errorf("%w %q: longer than 253 bytes", ErrInvalidName, orig)
	}
	labels := strings.Split(a, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("%w %q: empty label or label over 63 bytes", ErrInvalidName, orig)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%w %q: label %q starts or ends with a hyphen", ErrInvalidName, orig, l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
				return "", fmt.Errorf("%w %q: character %q not allowed", ErrInvalidName, orig, c)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return "", fmt.Errorf("%w %q: the last label is numeric (not a valid IP address either)", ErrInvalidName, orig)
	}
	return a, nil
}

// ParseAddr parses an IP literal as the policy accepts it: IPv4 dotted quad,
// IPv6 with or without brackets, no zone. IPv4-mapped IPv6 addresses are
// unmapped, so "::ffff:192.0.2.1" is 192.0.2.1.
func ParseAddr(s string) (netip.Addr, bool) {
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
		if !strings.Contains(s, ":") {
			return netip.Addr{}, false
		}
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// ParseRule parses one rule (no comment, no surrounding space) from source.
// The language is described in docs/policy.md:
//
//	example.com          allow example.com on ports 443 and 80
//	*.example.com        allow any name one or more labels below example.com (not example.com itself)
//	example.com:8443     allow one port (1-65535); ":*" allows every port
//	!example.com         deny (every port unless one is given); a deny beats any allow
//	192.0.2.7, [2001:db8::1]:443   IP literals (never wildcards)
func ParseRule(text, source string) (Rule, error) {
	r := Rule{Text: text, Source: source}
	bad := func(reason string) (Rule, error) {
		return Rule{}, &RuleError{Source: source, Text: Shorten(text), Reason: reason}
	}
	if text == "" {
		return bad("empty rule")
	}
	if rest, ok := strings.CutPrefix(text, noMITMPrefix); ok {
		rest = strings.TrimSpace(rest)
		if strings.ContainsAny(rest, "*:/[") {
			return bad("no-mitm names one host: no-mitm pinned.example (no wildcard, port, scheme or IP)")
		}
		n, err := NormalizeName(rest)
		if err != nil {
			return bad("no-mitm names one host: " + strings.TrimPrefix(err.Error(), ErrInvalidName.Error()+" "))
		}
		r.noMITM = n
		return r, nil
	}
	if rest, ok := strings.CutPrefix(text, allowPrivatePrefix); ok {
		return parseAllowPrivate(r, strings.TrimSpace(rest), bad)
	}
	if strings.ContainsFunc(text, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return bad("whitespace or control character inside a rule (one rule a line)")
	}
	s := text
	if strings.HasPrefix(s, "!") {
		r.Deny = true
		s = s[1:]
	}
	if strings.Contains(s, "://") {
		return bad("write the host name only, without a scheme (e.g. example.com:443)")
	}
	if strings.ContainsAny(s, "/?@") {
		return bad("write the host name only, without path, query or user")
	}
	host, port, hasPort := s, "", false
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return bad("unclosed [ in IPv6 literal")
		}
		host, port = s[:end+1], s[end+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return bad("unexpected text after ]")
			}
			port, hasPort = port[1:], true
		}
	case strings.Count(s, ":") == 1:
		i := strings.Index(s, ":")
		host, port, hasPort = s[:i], s[i+1:], true
	}
	if hasPort {
		switch port {
		case "*":
			r.anyPort = true
		default:
			n, err := strconv.ParseUint(port, 10, 16)
			if err != nil || n == 0 || port[0] == '+' {
				return bad("port must be a number from 1 to 65535, or *")
			}
			r.port = uint16(n)
		}
	} else if r.Deny {
		r.anyPort = true
	}
	if ip, ok := ParseAddr(host); ok {
		r.ip, r.host = ip, ip.String()
		return r, nil
	}
	if strings.HasPrefix(host, "[") || strings.Contains(host, ":") {
		return bad("not a valid IP address (IPv6 with a port needs brackets: [2001:db8::1]:443)")
	}
	if strings.HasPrefix(host, "*.") {
		r.wildcard = true
		host = host[2:]
	}
	if strings.Contains(host, "*") {
		return bad(`"*" is allowed only as a whole first label ("*.example.com")`)
	}
	if r.wildcard {
		if _, ok := ParseAddr(host); ok {
			return bad("a wildcard cannot cover an IP address")
		}
	}
	n, err := NormalizeName(host)
	if err != nil {
		return bad(strings.TrimPrefix(err.Error(), ErrInvalidName.Error()+" "))
	}
	if r.wildcard && !r.Deny && !strings.Contains(n, ".") {
		return bad("an allow wildcard must name at least two labels (*.example.com, not *.com)")
	}
	r.host = n
	return r, nil
}

// Shorten cuts s to 80 bytes (and an ellipsis) for a log line or a message.
func Shorten(s string) string {
	const max = 80
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// parseAllowPrivate parses the range of an allow-private rule: a prefix
// inside the RFC 1918, ULA or CGNAT ranges (a bare address means /32 or
// /128).
func parseAllowPrivate(r Rule, s string, bad func(string) (Rule, error)) (Rule, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, ok := ParseAddr(s)
		if !ok {
			return bad("allow-private wants a range like 10.1.0.0/16 or an address")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	if p.Addr().Is4In6() {
		return bad("write IPv4 ranges as IPv4 (10.1.0.0/16)")
	}
	inside := false
	for _, pr := range privateRanges {
		if pr.Bits() <= p.Bits() && pr.Contains(p.Addr()) {
			inside = true
		}
	}
	if !inside {
		return bad("allow-private takes a range inside 10/8, 172.16/12, 192.168/16, 100.64/10 or fc00::/7; loopback, link-local and the host's own addresses are never reachable")
	}
	r.private = p
	return r, nil
}

// ParseRules reads rules one a line from r: blank lines and everything from
// "#" to the end of a line are ignored. source names the rules (a file path
// for file:line references). All malformed lines are reported together; when
// there is any, no rule is returned.
func ParseRules(r io.Reader, source string) ([]Rule, error) {
	var rules []Rule
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 {
			text = strings.TrimPrefix(text, "\ufeff")
		}
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		src := source + ":" + strconv.Itoa(line)
		rule, err := ParseRule(text, src)
		if err != nil {
			var re *RuleError
			if errors.As(err, &re) {
				re.Source, re.Line = source, line
			}
			errs = append(errs, err)
			continue
		}
		rules = append(rules, rule)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read rules from %s after line %d: %w", source, line, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rules, nil
}

// PolicyConfig names the scopes LoadPolicy merges, lowest first.
type PolicyConfig struct {
	// NoBuiltins leaves out BuiltinRules.
	NoBuiltins bool
	// UserFile is the user's rule file (~/.vibedom/trusted_domains.txt). A
	// missing file is an empty scope.
	UserFile string
	// Workspace is the workspace's scope; nil is an empty one.
	Workspace *WorkspaceScope
	// Allow holds rules given on the command line (--allow), in order.
	Allow []string
}

// WorkspaceScope is the content of a workspace's rule file. A workspace
// comes from anywhere (a cloned repository), so its rules may narrow the
// policy at once, but its allow rules apply only once the user approved
// this content.
type WorkspaceScope struct {
	// Data is the file's content, read by the caller from the host's copy
	// of the workspace (never through a symlink, size-capped).
	Data []byte
	// Source names the file in rule sources and errors.
	Source string
	// AllowApproved lets the file's allow rules apply. When false they are
	// left out of the policy and reported by Policy.Ignored; deny rules
	// apply either way.
	AllowApproved bool
}

// LoadPolicy reads and merges the scopes of cfg: built-in rules < user file <
// workspace file < --allow rules. Any malformed rule, an unreadable file or a
// file that is not a regular file fails the whole load: the error lists
// every problem with its file and line. The workspace's allow rules are
// left out unless approved (WorkspaceScope.AllowApproved); Policy.Ignored
// lists them.
func LoadPolicy(cfg PolicyConfig) (*Policy, error) {
	var rules, ignored []Rule
	var errs []error
	if !cfg.NoBuiltins {
		rs, err := ParseRules(strings.NewReader(BuiltinRules), SourceBuiltin)
		if err != nil {
			return nil, fmt.Errorf("built-in rules: %w", err)
		}
		for i := range rs {
			rs[i].Source = SourceBuiltin
		}
		rules = append(rules, rs...)
	}
	if cfg.UserFile != "" {
		rs, err := readRuleFile(cfg.UserFile)
		if err != nil {
			errs = append(errs, err)
		}
		rules = append(rules, rs...)
	}
	if ws := cfg.Workspace; ws != nil {
		if len(ws.Data) > maxPolicyFile {
			errs = append(errs, fmt.Errorf("read rules %q: larger than %d bytes", ws.Source, maxPolicyFile))
		} else if rs, err := ParseRules(bytes.NewReader(ws.Data), displayPath(ws.Source)); err != nil {
			errs = append(errs, err)
		} else {
			for _, r := range rs {
				if r.private.IsValid() {
					// Approval does not lift this: a private range is the
					// user's own to open.
					errs = append(errs, &RuleError{Source: r.Source, Text: r.Text,
						Reason: "allow-private is honoured only in ~/.vibedom/trusted_domains.txt or --allow, never from the workspace: remove the line"})
					continue
				}
				if r.noMITM != "" {
					errs = append(errs, &RuleError{Source: r.Source, Text: r.Text,
						Reason: "no-mitm is honoured only in ~/.vibedom/trusted_domains.txt, never from the workspace: remove the line"})
					continue
				}
				if r.Deny || ws.AllowApproved {
					rules = append(rules, r)
				} else {
					ignored = append(ignored, r)
				}
			}
		}
	}
	for _, a := range cfg.Allow {
		r, err := ParseRule(strings.TrimSpace(a), SourceFlag)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.noMITM != "" {
			errs = append(errs, &RuleError{Source: SourceFlag, Text: r.Text, Reason: "for one session write --no-mitm " + r.noMITM + "; no-mitm rules belong in ~/.vibedom/trusted_domains.txt"})
			continue
		}
		rules = append(rules, r)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("load egress policy (fix or remove the rules named, then retry): %w", errors.Join(errs...))
	}
	p := NewPolicy(rules)
	p.ignored = ignored
	return p, nil
}

func readRuleFile(path string) ([]Rule, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read rules %q: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read rules %q: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > maxPolicyFile {
		return nil, fmt.Errorf("read rules %q: larger than %d bytes", path, maxPolicyFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read rules %q: %w", path, err)
	}
	defer f.Close()
	return ParseRules(io.LimitReader(f, maxPolicyFile), displayPath(path))
}

// displayPath shortens the user's home directory to "~".
func displayPath(p string) string {
	home, err := os.UserHomeDir()
	if err != nil || home == "" || home == "/" {
		return p
	}
	if rel, err := filepath.Rel(home, p); err == nil && filepath.IsLocal(rel) {
		return "~/" + filepath.ToSlash(rel)
	}
	return p
}

// Policy is a merged, immutable egress policy. A name and port are allowed
// when an allow rule covers both and no deny rule does; anything else is
// denied. A Policy is safe for concurrent use.
type Policy struct {
	rules   []Rule
	ignored []Rule           // loaded but not in effect (unapproved workspace allow rules)
	exact   map[string][]int // name or IP → rule indices
	wild    map[string][]int // wildcard base → rule indices
}

// NewPolicy builds a Policy from rules, lowest scope first.
func NewPolicy(rules []Rule) *Policy {
	p := &Policy{rules: slices.Clone(rules), exact: map[string][]int{}, wild: map[string][]int{}}
	for i, r := range p.rules {
		switch {
		case r.host == "":
		case r.wildcard:
			p.wild[r.host] = append(p.wild[r.host], i)
		default:
			p.exact[r.host] = append(p.exact[r.host], i)
		}
	}
	return p
}

// PrivateRanges are the ranges the policy's allow-private rules open.
// LoadPolicy accepts such rules only from the user's file and --allow.
func (p *Policy) PrivateRanges() []netip.Prefix {
	var out []netip.Prefix
	for _, r := range p.rules {
		if r.private.IsValid() {
			out = append(out, r.private)
		}
	}
	return out
}

// NoMITM are the names the policy's no-mitm rules pass through
// uninspected. LoadPolicy accepts such rules only from the user's file.
func (p *Policy) NoMITM() []string {
	var out []string
	for _, r := range p.rules {
		if r.noMITM != "" {
			out = append(out, r.noMITM)
		}
	}
	return out
}

// Rules are the policy's rules, lowest scope first.
func (p *Policy) Rules() []Rule { return slices.Clone(p.rules) }

// Ignored are the rules LoadPolicy read but left out: the workspace's allow
// rules while the user has not approved its file.
func (p *Policy) Ignored() []Rule { return slices.Clone(p.ignored) }

// candidates returns the indices of rules whose name part covers n (a
// normalised name or IP string), most specific first: exact rules, then
// wildcards with the longest base; ties in scope order.
func (p *Policy) candidates(n string, isIP bool) []int {
	out := slices.Clone(p.exact[n])
	if isIP {
		return out
	}
	for i := strings.IndexByte(n, '.'); i >= 0; {
		base := n[i+1:]
		out = append(out, p.wild[base]...)
		j := strings.IndexByte(base, '.')
		if j < 0 {
			break
		}
		i += j + 1
	}
	return out
}

// Decide decides whether name:port may be reached. name is a host name in
// any form NormalizeName accepts, or an IP literal (decided as DecideAddr).
// The Decision names the deciding rule and its source.
func (p *Policy) Decide(name string, port uint16) Decision {
	if ip, ok := ParseAddr(name); ok {
		return p.DecideAddr(ip, port)
	}
	n, err := NormalizeName(name)
	if err != nil {
		return Decision{Reason: err.Error()}
	}
	return p.decide(n, false, port)
}

// DecideAddr decides whether ip:port may be reached: only a rule that names
// the address (never a wildcard, never a name) allows it.
func (p *Policy) DecideAddr(ip netip.Addr, port uint16) Decision {
	if !ip.IsValid() {
		return Decision{Reason: "invalid IP address"}
	}
	return p.decide(ip.Unmap().WithZone("").String(), true, port)
}

func (p *Policy) decide(n string, isIP bool, port uint16) Decision {
	if port == 0 {
		return Decision{Reason: "port 0 is never allowed"}
	}
	cands := p.candidates(n, isIP)
	for _, i := range cands {
		if r := p.rules[i]; r.Deny && r.matchesPort(port) {
			return Decision{Rule: r.Text, Source: r.Source, Reason: "denied by a deny rule"}
		}
	}
	for _, i := range cands {
		if r := p.rules[i]; !r.Deny && r.matchesPort(port) {
			return Decision{Allow: true, Rule: r.Text, Source: r.Source, Reason: "allowed by a rule"}
		}
	}
	for _, i := range cands {
		if r := p.rules[i]; !r.Deny {
			return Decision{Reason: fmt.Sprintf("port %d is not allowed: rule %q (%s) allows other ports only", port, r.Text, r.Source)}
		}
	}
	if isIP {
		return Decision{Reason: "no rule names this IP address (IP literals are allowed only by a rule naming them)"}
	}
	return Decision{Reason: "no rule allows this name"}
}

// DecideName decides whether name may be reached on at least one port: the
// question the DNS server asks before answering. It is allowed when some
// allow rule covers the name on a port no deny rule covers.
func (p *Policy) DecideName(name string) Decision {
	isIP := false
	n := name
	if ip, ok := ParseAddr(name); ok {
		n, isIP = ip.String(), true
	} else {
		var err error
		if n, err = NormalizeName(name); err != nil {
			return Decision{Reason: err.Error()}
		}
	}
	cands := p.candidates(n, isIP)
	var denied []uint16
	for _, i := range cands {
		r := p.rules[i]
		if !r.Deny {
			continue
		}
		if r.anyPort {
			return Decision{Rule: r.Text, Source: r.Source, Reason: "denied on every port by a deny rule"}
		}
		denied = append(denied, r.port)
	}
	for _, i := range cands {
		r := p.rules[i]
		if r.Deny {
			continue
		}
		ports := []uint16{r.port}
		switch {
		case r.anyPort:
			return Decision{Allow: true, Rule: r.Text, Source: r.Source, Reason: "allowed on every port by a rule"}
		case r.port == 0:
			ports = []uint16{443, 80}
		}
		for _, pt := range ports {
			if !slices.Contains(denied, pt) {
				return Decision{Allow: true, Rule: r.Text, Source: r.Source, Reason: fmt.Sprintf("allowed by a rule (port %d at least)", pt)}
			}
		}
	}
	return Decision{Reason: "no rule allows this name on any port"}
}

// HostPort joins a host name or IP literal and a port ("[::1]:443").
func HostPort(h string, port uint16) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + strconv.Itoa(int(port))
	}
	return h + ":" + strconv.Itoa(int(port))
}

// Decider decides whether a name (or IP literal) and port may be reached.
// *Policy is the Decider; the explicit proxy asks it about every CONNECT
// target and absolute-URI request.
type Decider interface {
	Decide(name string, port uint16) Decision
}

var _ Decider = (*Policy)(nil)

// StackPolicy is what the network stack asks the egress policy. *Policy
// implements it.
type StackPolicy interface {
	// Decide decides whether name (a host name or an IP literal) may be
	// reached on port.
	Decide(name string, port uint16) Decision
	// DecideName decides whether name may be reached on any port: the DNS
	// server's question.
	DecideName(name string) Decision
}
