package dlp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// Category names a kind of sensitive value. It appears in placeholders
// ([REDACTED:SECRET]), in logs and in --allow-context.
type Category uint8

// Categories, in the order a merged redaction picks its label (the first
// present wins).
const (
	// CatSecret is a known value: a preflight finding or a .env secret.
	CatSecret Category = iota
	// CatPrivateKey is a PEM private-key block or an age secret key.
	CatPrivateKey
	// CatCloudKey is an AWS access key id or a GCP API key.
	CatCloudKey
	// CatToken is a service token (GitHub, GitLab, Slack, Stripe, AI
	// APIs, npm …) or a bearer/basic credential.
	CatToken
	// CatJWT is a JSON Web Token.
	CatJWT
	// CatCredentials is the password of a URL's user:password@.
	CatCredentials
	// CatPassword is a high-entropy value assigned to a secret-sounding
	// name (password = …, "api_key": …).
	CatPassword
	// CatCreditCard is a Luhn-valid card number.
	CatCreditCard
	// CatEmail is an e-mail address outside the RFC 2606 names.
	CatEmail
	// CatInternalIP is a private (RFC 1918) IPv4 address.
	CatInternalIP
	// CatHomePath is the user name in a home directory path.
	CatHomePath
	// CatSSN is a US social security number (AAA-GG-SSSS, valid ranges).
	CatSSN
	// CatIBAN is an international bank account number (mod-97 checked).
	CatIBAN
	// CatPhone is a phone number: E.164 (+CC …) or NANP next to a word
	// that says it is one.
	CatPhone
	numCategories
)

var categoryNames = [numCategories]string{
	"SECRET", "PRIVATE_KEY", "CLOUD_KEY", "TOKEN", "JWT", "CREDENTIALS", "PASSWORD",
	"CREDIT_CARD", "EMAIL", "INTERNAL_IP", "HOME_PATH", "SSN", "IBAN", "PHONE",
}

// String returns the category's upper-case name, e.g. "CLOUD_KEY".
func (c Category) String() string {
	if c < numCategories {
		return categoryNames[c]
	}
	return fmt.Sprintf("CATEGORY(%d)", c)
}

// MarshalText encodes the category as its name.
func (c Category) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Categories lists every category.
func Categories() []Category {
	out := make([]Category, numCategories)
	for i := range out {
		out[i] = Category(i)
	}
	return out
}

// categoryAliases are the extra names ParseCategory accepts (the seed's
// --allow-context=internal_ips among them).
var categoryAliases = map[string]Category{
	"internal_ips": CatInternalIP, "ips": CatInternalIP, "ip": CatInternalIP,
	"emails": CatEmail, "pii": CatEmail,
	"credit_cards": CatCreditCard, "cards": CatCreditCard,
	"secrets": CatSecret, "known": CatSecret,
	"tokens": CatToken, "jwts": CatJWT, "passwords": CatPassword,
	"private_keys": CatPrivateKey, "cloud_keys": CatCloudKey,
	"home_paths": CatHomePath, "paths": CatHomePath,
	"ssns": CatSSN, "ibans": CatIBAN, "phones": CatPhone, "phone_numbers": CatPhone,
}

// ParseCategory reads a category name, case-insensitively, also accepting
// plurals and the aliases of --allow-context (internal_ips, pii …).
func ParseCategory(s string) (Category, error) {
	t := strings.ToUpper(strings.TrimSpace(strings.ReplaceAll(s, "-", "_")))
	for i, n := range categoryNames {
		if t == n {
			return Category(i), nil
		}
	}
	if c, ok := categoryAliases[strings.ToLower(t)]; ok {
		return c, nil
	}
	return 0, fmt.Errorf("unknown category %q: use one of %s", s, strings.Join(categoryNames[:], ", "))
}

// Class is a destination's class; it decides what is scrubbed on the way
// there.
type Class uint8

// Classes.
const (
	// ClassPublic is any site not named otherwise (package registries,
	// code hosts …): everything is scrubbed, home directory paths too.
	ClassPublic Class = iota
	// ClassExternal is an AI API the agent talks to: everything is
	// scrubbed but file paths.
	ClassExternal
	// ClassInternal is the user's own infrastructure: nothing is scrubbed,
	// known secrets are logged.
	ClassInternal
)

var classNames = []string{"public", "external", "internal"}

// String returns "public", "external" or "internal".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", c)
}

// MarshalText encodes the class as its name.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// ParseClass reads "public", "external" or "internal".
func ParseClass(s string) (Class, error) {
	for i, n := range classNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("unknown destination class %q: use external, internal or public", s)
}

// Action is what happens to a finding of one category.
type Action uint8

// Actions.
const (
	// Pass lets the value through unrecorded.
	Pass Action = iota
	// Log lets the value through and records the finding.
	Log
	// Redact replaces the value with a placeholder and records it.
	Redact
	// Refuse is no policy's choice but what became of a finding where a
	// value cannot be replaced (a header that frames the message): the
	// request carrying it was not sent.
	Refuse
)

// String returns "pass", "log", "redact" or "refuse".
func (a Action) String() string {
	switch a {
	case Log:
		return "log"
	case Redact:
		return "redact"
	case Refuse:
		return "refuse"
	}
	return "pass"
}

// ParseAction reads an action's name (Action.String), as the network log
// and the audit log write it.
func ParseAction(s string) (Action, error) {
	for _, a := range []Action{Pass, Log, Redact, Refuse} {
		if s == a.String() {
			return a, nil
		}
	}
	return Redact, fmt.Errorf("unknown action %q: use pass, log, redact or refuse", s)
}

// MarshalText encodes the action as its name.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Policy is what to do with each category for one destination.
type Policy struct {
	Class Class
	act   [numCategories]Action
	// shapes: only rows that know a value by its shape run (ShapesOnly).
	shapes bool
}

// ShapesOnly returns a copy of p under which a value is found only as a
// known value or by its own shape (an AWS key id, a provider's token, a
// JWT, a private key …), never by the words before it: the rows that
// take what follows "Bearer ", "Basic " or a secret-like name (token=,
// password:) do not run. It is the policy of a credential header, where
// those words are the header's syntax and a server-issued session token
// or cookie is what the guest is meant to send back.
func (p Policy) ShapesOnly() Policy {
	p.shapes = true
	return p
}

// Action returns what the policy does with c.
func (p *Policy) Action(c Category) Action { return p.act[c] }

// With returns a copy of p that does a with c.
func (p Policy) With(c Category, a Action) Policy {
	p.act[c] = a
	return p
}

// active reports whether the policy records or redacts c.
func (p *Policy) active(c Category) bool { return p.act[c] != Pass }

// anyOf reports whether the policy records or redacts one of cats.
func (p *Policy) anyOf(cats []Category) bool {
	for _, c := range cats {
		if p.act[c] != Pass {
			return true
		}
	}
	return false
}

// any reports whether the policy records or redacts anything.
func (p *Policy) any() bool {
	for _, a := range p.act {
		if a != Pass {
			return true
		}
	}
	return false
}

// DefaultPolicy is the seed's table for a class:
//
//	category            external  internal  public
//	SECRET (known)      redact    log       redact
//	keys, tokens, JWTs,
//	passwords, cards    redact    pass      redact
//	EMAIL, INTERNAL_IP  redact    pass      redact
//	HOME_PATH, SSN,
//	IBAN, PHONE         pass      pass      redact
func DefaultPolicy(c Class) Policy {
	p := Policy{Class: c}
	for i := range p.act {
		p.act[i] = Redact
	}
	switch c {
	case ClassInternal:
		for i := range p.act {
			p.act[i] = Pass
		}
		p.act[CatSecret] = Log
		// An SSN is redacted to every class: no service of yours
		// needs the agent to send one.
		p.act[CatSSN] = Redact
	case ClassExternal:
		p.act[CatHomePath] = Pass
		p.act[CatIBAN], p.act[CatPhone] = Pass, Pass
	}
	return p
}

// ClassRule assigns a class to the names a pattern matches: "name" exactly,
// "*.name" any name below it (not name itself), or an IP prefix
// ("10.0.0.0/8").
type ClassRule struct {
	Pattern string
	Class   Class
	// Source is where the rule came from, e.g. "builtin" or "dlp_classes.txt:3".
	Source string
}

// DefaultClassRules are the built-in classes: the agent APIs are external;
// names under .internal, .local, .lan, .corp, .intranet and .home.arpa,
// localhost and private addresses are internal; everything else is public.
var DefaultClassRules = []ClassRule{
	{"api.anthropic.com", ClassExternal, "builtin"},
	{"*.anthropic.com", ClassExternal, "builtin"},
	{"api.openai.com", ClassExternal, "builtin"},
	{"*.openai.com", ClassExternal, "builtin"},
	{"generativelanguage.googleapis.com", ClassExternal, "builtin"},
	{"api.mistral.ai", ClassExternal, "builtin"},
	{"openrouter.ai", ClassExternal, "builtin"},
	{"*.internal", ClassInternal, "builtin"},
	{"*.local", ClassInternal, "builtin"},
	{"*.lan", ClassInternal, "builtin"},
	{"*.corp", ClassInternal, "builtin"},
	{"*.intranet", ClassInternal, "builtin"},
	{"*.home.arpa", ClassInternal, "builtin"},
	{"localhost", ClassInternal, "builtin"},
	{"10.0.0.0/8", ClassInternal, "builtin"},
	{"172.16.0.0/12", ClassInternal, "builtin"},
	{"192.168.0.0/16", ClassInternal, "builtin"},
}

// classOf returns the class of name under rules: the most specific match
// wins (an exact name over a wildcard, a longer wildcard over a shorter
// one, a longer IP prefix over a shorter one); no match is public.
func classOf(rules []ClassRule, name string) (Class, string) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	addr, ipErr := netip.ParseAddr(strings.Trim(name, "[]"))
	isIP := ipErr == nil
	best, bestScore, src := ClassPublic, -1, ""
	for _, r := range rules {
		score := -1
		switch p := r.Pattern; {
		case strings.Contains(p, "/"):
			if pfx, err := netip.ParsePrefix(p); err == nil && isIP && pfx.Contains(addr.Unmap()) {
				score = pfx.Bits()
			}
		case strings.HasPrefix(p, "*."):
			if !isIP && strings.HasSuffix(name, p[1:]) && len(name) > len(p)-1 {
				score = 1000 + len(p)
			}
		default:
			if name == p {
				score = 1 << 20
			}
		}
		if score > bestScore {
			best, bestScore, src = r.Class, score, r.Source
		}
	}
	return best, src
}

// ParseClassRules reads a class file: one "CLASS PATTERN" a line
// ("internal *.corp.example.com", "external api.example.ai",
// "internal 10.20.0.0/16"), # comments. source names the file in errors.
// Every bad line is reported; none is skipped silently.
func ParseClassRules(r io.Reader, source string) ([]ClassRule, error) {
	var rules []ClassRule
	var errs []error
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		at := fmt.Sprintf("%s:%d", source, line)
		if len(f) != 2 {
			errs = append(errs, fmt.Errorf("%s: want \"CLASS PATTERN\", e.g. \"internal *.corp.example.com\"", at))
			continue
		}
		c, err := ParseClass(f[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
			continue
		}
		p := strings.TrimSuffix(strings.ToLower(f[1]), ".")
		if err := checkClassPattern(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
			continue
		}
		rules = append(rules, ClassRule{Pattern: p, Class: c, Source: at})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("read %s: %w", source, err))
	}
	return rules, errors.Join(errs...)
}

func checkClassPattern(p string) error {
	if strings.Contains(p, "/") {
		if _, err := netip.ParsePrefix(p); err != nil {
			return fmt.Errorf("%q is not an IP prefix like 10.0.0.0/8", p)
		}
		return nil
	}
	if _, err := netip.ParseAddr(p); err == nil {
		return nil
	}
	n := strings.TrimPrefix(p, "*.")
	if n == "" || strings.Contains(n, "*") {
		return fmt.Errorf("%q: a pattern is a name, *.name or an IP prefix", p)
	}
	for _, l := range strings.Split(n, ".") {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
			return fmt.Errorf("%q is not a host name pattern", p)
		}
	}
	return nil
}

// LoadClassRules reads a class file; a missing file is no rules.
func LoadClassRules(path string) ([]ClassRule, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseClassRules(f, path)
}
