package preflight

import (
	"net"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode"
)

// Risk is how bad it would be for the agent to see a finding's secret.
type Risk int

// Risk levels, lowest first. The zero value is not a level.
const (
	RiskLow Risk = iota + 1
	RiskMedium
	RiskHigh
)

// String returns "LOW", "MEDIUM" or "HIGH".
func (r Risk) String() string {
	switch r {
	case RiskLow:
		return "LOW"
	case RiskMedium:
		return "MEDIUM"
	case RiskHigh:
		return "HIGH"
	}
	return "UNKNOWN"
}

// MarshalText encodes the level as its name.
func (r Risk) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// privateKeyRules are the default rules that find private key material.
var privateKeyRules = map[string]bool{
	"private-key":    true, // PEM "-----BEGIN … PRIVATE KEY-----" blocks
	"pkcs12-file":    true, // .p12/.pfx files: a certificate with its key
	"age-secret-key": true, // AGE-SECRET-KEY-1…
}

// cloudRulePrefixes are the rule id prefixes of infrastructure cloud
// providers, whose keys can read or destroy a whole account.
var cloudRulePrefixes = []string{
	"aws-", "gcp-", "azure-", "alibaba-", "digitalocean-",
	"yandex-", "cloudflare-", "heroku-", "flyio-",
}

// infraRulePrefixes are the rule id prefixes of services that hold or
// drive a whole cloud estate: Terraform Cloud, Pulumi, HashiCorp Vault,
// OpenShift and the Scalingo platform.
var infraRulePrefixes = []string{"hashicorp-tf-", "pulumi-", "vault-", "openshift-", "scalingo-"}

// liveMarkers in a secret mark a production payment key (Stripe's secret
// and restricted live keys).
var liveMarkers = []string{"sk_live_", "rk_live_"}

// prodWords are path tokens that name a production or live environment.
var prodWords = map[string]bool{"prod": true, "production": true, "live": true}

// fixtureDirs are directory names that hold tests and their fixtures.
var fixtureDirs = map[string]bool{
	"test": true, "tests": true, "testdata": true, "fixtures": true,
	"__tests__": true, "spec": true,
}

// localEnvWords are the environments a .env file may be named for and
// still be LOW: .env.local, .env.development, .env.test and their
// combinations (.env.development.local, .env.test.local).
var localEnvWords = map[string]bool{"local": true, "development": true, "dev": true, "test": true, "testing": true}

// classify decides a finding's risk and the reason shown to the user.
//
// Signals, checked on the workspace-relative path (slash-separated), the
// rule id, the secret and the text the rule matched:
//
//	HIGH   private key (rule private-key, pkcs12-file, age-secret-key, any rule id
//	       containing "private-key", or a match holding "PRIVATE KEY-----")
//	HIGH   cloud provider key (rule ids aws-*, gcp-*, azure-*, alibaba-*,
//	       digitalocean-*, yandex-*, cloudflare-*, heroku-*, flyio-*)
//	HIGH   cloud infrastructure key (rule ids hashicorp-tf-*, pulumi-*, vault-*,
//	       openshift-*, scalingo-*)
//	HIGH   live marker in the secret (sk_live_, rk_live_)
//	HIGH   a path token is prod, production or live (tokens split at / . - _ and
//	       lower-to-upper case changes: .env.production, config/prod/, liveKeys.js;
//	       not products/ or delivery.go)
//	LOW    local env file: the base name is .env.<w>[.<w>…] with every w in
//	       local, development, dev, test, testing
//	LOW    test fixture: a directory named test, tests, testdata, fixtures,
//	       __tests__ or spec, or a file named *_test.go, *.test.*, *.spec.*
//	LOW    local value: a URL (in the match or its line) that contains the secret,
//	       or a user:password@host in the match, points at localhost, a loopback or
//	       unspecified address, example.com/.net/.org or a name under the reserved
//	       .test, .example, .invalid or .localhost
//	MEDIUM everything else
//
// Precedence: any HIGH signal beats every LOW signal (a private key or a
// cloud key is real wherever it sits, and a prod path inside a test folder
// is still a prod path); when a LOW signal is overridden the reason says so.
// Between HIGH signals the order above picks the reason.
func classify(file, ruleID, description, secret, match, line string) (Risk, string) {
	var high []string
	lowerID := strings.ToLower(ruleID)
	if privateKeyRules[lowerID] || strings.Contains(lowerID, "private-key") || strings.Contains(match, "PRIVATE KEY-----") {
		high = append(high, "private key")
	}
	for _, p := range cloudRulePrefixes {
		if strings.HasPrefix(lowerID, p) {
			high = append(high, "cloud provider key ("+strings.TrimSuffix(p, "-")+")")
			break
		}
	}
	for _, p := range infraRulePrefixes {
		if strings.HasPrefix(lowerID, p) {
			high = append(high, "cloud infrastructure key ("+strings.TrimSuffix(p, "-")+")")
			break
		}
	}
	for _, m := range liveMarkers {
		if strings.Contains(secret, m) || strings.Contains(match, m) {
			high = append(high, "live production key ("+m+")")
			break
		}
	}
	if w := prodPathWord(file); w != "" {
		high = append(high, "path names a production environment ("+w+")")
	}

	var low []string
	if isLocalEnvFile(file) {
		low = append(low, "local development env file ("+path.Base(file)+")")
	}
	if fx := fixturePath(file); fx != "" {
		low = append(low, "test fixture path ("+fx+")")
	}
	if h := localHost(secret, match, line); h != "" {
		low = append(low, "value points at a local or example host ("+h+")")
	}

	switch {
	case len(high) > 0:
		reason := strings.Join(high, "; ")
		if len(low) > 0 {
			reason += " — HIGH despite: " + strings.Join(low, "; ")
		}
		return RiskHigh, reason
	case len(low) > 0:
		return RiskLow, strings.Join(low, "; ")
	}
	if strings.HasPrefix(path.Base(file), ".env") {
		return RiskMedium, "environment file value (DLP scrubs it from traffic)"
	}
	if description != "" {
		return RiskMedium, description
	}
	return RiskMedium, "credential found by rule " + ruleID
}

// pathTokens splits a relative path into lower-case words at separators
// and at lower-to-upper case changes.
func pathTokens(p string) []string {
	var toks []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			toks = append(toks, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	var prev rune
	for _, r := range p {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
		case unicode.IsUpper(r) && unicode.IsLower(prev):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
		prev = r
	}
	flush()
	return toks
}

func prodPathWord(file string) string {
	for _, t := range pathTokens(file) {
		if prodWords[t] {
			return t
		}
	}
	return ""
}

func isLocalEnvFile(file string) bool {
	base := path.Base(file)
	rest, ok := strings.CutPrefix(base, ".env.")
	if !ok || rest == "" {
		return false
	}
	for w := range strings.SplitSeq(rest, ".") {
		if !localEnvWords[strings.ToLower(w)] {
			return false
		}
	}
	return true
}

// fixturePath returns the part of file that makes it a test fixture.
func fixturePath(file string) string {
	parts := strings.Split(file, "/")
	for _, d := range parts[:len(parts)-1] {
		if fixtureDirs[strings.ToLower(d)] {
			return d + "/"
		}
	}
	base := parts[len(parts)-1]
	if strings.HasSuffix(base, "_test.go") {
		return base
	}
	// *.test.* and *.spec.*: a non-empty stem, then .test. or .spec.
	for _, mid := range []string{".test.", ".spec."} {
		if i := strings.Index(strings.ToLower(base), mid); i > 0 && i+len(mid) < len(base) {
			return base
		}
	}
	return ""
}

var (
	urlRE  = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>\x60]+`)
	atHost = regexp.MustCompile(`@(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)`)
)

// localHost reports the local or example host a value points at: the host
// of a URL (in the line or the match) that contains the secret, or a
// user:password@host in the match.
func localHost(secret, match, line string) string {
	var urls []string
	urls = append(urls, urlRE.FindAllString(match, -1)...)
	urls = append(urls, urlRE.FindAllString(line, -1)...)
	for _, u := range urls {
		if secret != "" && !strings.Contains(u, secret) {
			continue
		}
		if h := urlHost(u); h != "" {
			if label := localHostLabel(h); label != "" {
				return label
			}
		}
	}
	for _, m := range atHost.FindAllStringSubmatch(match, -1) {
		if label := localHostLabel(strings.Trim(m[1], "[]")); label != "" {
			return label
		}
	}
	return ""
}

func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// localHostLabel names the kind of local or example host h is, or returns
// "" when it is neither. The label never holds a label of h's own beyond
// the reserved name (`*.example.com`, not `tok3n.example.com`): a secret can
// sit in a subdomain, and the reason is shown.
func localHostLabel(h string) string {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if ip := net.ParseIP(h); ip != nil {
		switch {
		case ip.IsUnspecified():
			return "unspecified address"
		case ip.IsLoopback():
			return "loopback address"
		}
		return ""
	}
	for _, name := range []string{"localhost", "example.com", "example.net", "example.org"} {
		if h == name {
			return name
		}
		if strings.HasSuffix(h, "."+name) {
			return "*." + name
		}
	}
	for _, tld := range []string{".test", ".example", ".invalid"} {
		if strings.HasSuffix(h, tld) {
			return "*" + tld
		}
	}
	return ""
}
