package dlp

import "fmt"

// A recognizer is one row of the recognizer table: everything about one
// kind of token that must stay in step. The anchor index (anchors.go) is
// built from the table at init; nothing else lists recognizers.
type recognizer struct {
	// name identifies the row (in panics and tests); unique.
	name string
	// cat is what a match reports. The row is scanned only when the
	// policy records or redacts cat, and a redaction of its match reads
	// [REDACTED:<cat>].
	cat Category
	// anchors are the literals that start the token (or sit inside it:
	// a JWT's ".eyJ"). Finding one calls check.
	anchors []anchor
	// keywords, when set, gives more literals at init (gitleaks' rule
	// keywords), each case-insensitive, registered at the keys glKeys
	// picks.
	keywords func() []string
	// context marks a row that knows a value by the words before it (an
	// auth scheme, a secret-like name) rather than by its own shape. Such
	// a row does not run under Policy.ShapesOnly (credential headers,
	// where those words are the header's own syntax).
	context bool
	// check looks at the text around one hit of an anchor and adds what
	// it matches (scanner.add) in the hit's category. It must accept
	// anything: it runs on hostile text. Rows run on the decoded text
	// only, never on the renderings of views.go (a view adds known
	// values alone: undoing a format can make text look like a token).
	check func(s *scanner, h hit)
}

// A hit is one anchor found in the text.
type hit struct {
	lit    string // the anchor's literal, as the row spells it
	as, ae int    // where it is: buf[as:ae]
	cat    Category
}

// An anchor is one literal of a recognizer. Anchors are found by sampling
// the text every second byte: each anchor registers the 4-byte windows of
// its literal at two consecutive offsets (keys), so whatever the
// alignment one of them is sampled. The keys are chosen to be rare in
// ordinary text ("swor" and "word" for password). A case-insensitive
// literal registers every case variant of its keys; a key may end in a
// wildcard byte of a class (AKIA then any of [A-Z0-9]).
type anchor struct {
	lit string
	// off is the offset of the first key in lit; the keys are
	// lit[off:off+4] and lit[off+1:off+5], where a position past the
	// literal stands for any byte of class next.
	off  int
	next uint8
	ci   bool // case-insensitive literal
}

const (
	cUpperDigit = cUpper | cDigit
	cAlnum      = cLower | cUpper | cDigit
)

// lits lists case-sensitive anchors whose keys are at offset off and,
// for literals of 4 bytes, end in a byte of class next.
func lits(off int, next uint8, ls ...string) []anchor {
	out := make([]anchor, len(ls))
	for i, l := range ls {
		out[i] = anchor{lit: l, off: off, next: next}
	}
	return out
}

// recognizers is the table of recognizers anchored on a literal. To add
// one, add a row: its literals, its category and its check. The '@'
// (e-mail addresses, URL credentials) and digit (cards, private IPv4
// addresses, SSNs, IBANs, phone numbers) recognizers are not anchored on
// a literal and run in their own passes (scanner.run).
//
// The rows' order is the order in which the anchors sharing a key are
// checked.
var recognizers = []recognizer{
	{name: "aws-access-key-id", cat: CatCloudKey,
		anchors: lits(0, cUpperDigit, "AKIA", "ASIA", "ABIA", "ACCA"),
		check:   (*scanner).awsKeyID},
	{name: "gcp-api-key", cat: CatCloudKey,
		anchors: lits(0, cB64URL, "AIza"),
		check:   (*scanner).gcpKey},
	{name: "github", cat: CatToken,
		anchors: lits(0, cAlnum, "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
		check:   prefixed(cAlnum, 36)},
	{name: "github-pat", cat: CatToken,
		anchors: lits(3, 0, "github_pat_"),
		check:   prefixed(cB64URL, 22)},
	{name: "gitlab", cat: CatToken,
		anchors: []anchor{{lit: "glpat-", off: 1}, {lit: "gldt-"}, {lit: "glrt-"},
			{lit: "glptt-", off: 1}, {lit: "glsoat-", off: 2}, {lit: "glcbt-", off: 1}},
		check: prefixed(cB64URL, 20)},
	{name: "slack", cat: CatToken,
		anchors: lits(0, 0, "xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxe-"),
		check:   prefixed(cB64URL, 20)},
	{name: "stripe", cat: CatToken,
		anchors: append(lits(0, 0, "sk_live_", "rk_live_", "sk_test_", "rk_test_"), anchor{lit: "whsec_", off: 1}),
		check:   prefixed(cAlnum, 16)},
	{name: "anthropic", cat: CatToken,
		anchors: lits(2, 0, "sk-ant-"),
		check:   prefixed(cB64URL, 20)},
	{name: "openai", cat: CatToken,
		anchors: []anchor{{lit: "sk-proj-", off: 2}, {lit: "sk-svcacct-", off: 3}, {lit: "sk-admin-", off: 2}},
		check:   prefixed(cB64URL, 20)},
	{name: "openai-legacy", cat: CatToken,
		anchors: lits(0, 0, "T3BlbkFJ"),
		check:   (*scanner).openAILegacy},
	{name: "npm", cat: CatToken,
		anchors: lits(0, cAlnum, "npm_"),
		check:   prefixed(cAlnum, 36)},
	{name: "bearer", cat: CatToken, context: true,
		anchors: []anchor{{lit: "bearer ", off: 2, ci: true}},
		check:   (*scanner).bearer},
	{name: "basic", cat: CatToken, context: true,
		anchors: []anchor{{lit: "basic ", off: 1, ci: true}},
		check:   (*scanner).basic},
	{name: "jwt", cat: CatJWT,
		anchors: lits(0, cB64URL, ".eyJ"),
		check:   (*scanner).jwt},
	{name: "pem-private-key", cat: CatPrivateKey,
		anchors: lits(5, 0, "-----BEGIN "),
		check:   (*scanner).pem},
	{name: "age-secret-key", cat: CatPrivateKey,
		anchors: lits(0, 0, "AGE-SECRET-KEY-1"),
		check:   (*scanner).ageKey},
	{name: "home-path", cat: CatHomePath,
		anchors: lits(0, 0, "/Users/", "/home/"),
		check:   (*scanner).homePath},
	{name: "windows-home-path", cat: CatHomePath,
		anchors: []anchor{{lit: `\users\`, off: 2, ci: true}},
		check:   (*scanner).winHomePath},
	{name: "assignment", cat: CatPassword, context: true,
		anchors: assignKeywords,
		check:   (*scanner).assignment},
	{name: "email-dodged", cat: CatEmail,
		anchors: dodgedAtAnchors(), check: (*scanner).dodgedEmail},
	{name: "internal-host", cat: CatInternalIP,
		anchors: internalHostAnchors(),
		check:   (*scanner).internalHost},
	{name: "host-label-url", cat: CatInternalIP,
		anchors: urlSchemeAnchors(), check: (*scanner).urlHostLabel},
	{name: "host-label-port", cat: CatInternalIP,
		anchors: servicePortAnchors(), check: (*scanner).portHostLabel},
	{name: "host-label-header", cat: CatInternalIP,
		anchors: []anchor{{lit: "Host: ", off: 2, next: cDomain}}, check: (*scanner).headerHostLabel},
	{name: "host-label-ssh", cat: CatInternalIP,
		anchors: sshAnchors, check: (*scanner).sshHostLabel},
	{name: "ipv6-ula", cat: CatInternalIP,
		anchors: ulaAnchors(), check: (*scanner).ulaAddress},
	{name: "gitleaks", cat: CatToken,
		keywords: gitleaksKeywords,
		check:    (*scanner).gitleaksAt},
}

// assignKeywords are the names an assignment's name ends with (JSON keys
// and form fields too: secretKeyName).
var assignKeywords = []anchor{
	{lit: "password", off: 2, ci: true}, {lit: "passwd", off: 1, ci: true}, {lit: "passphrase", off: 4, ci: true},
	{lit: "secret", ci: true}, {lit: "token", ci: true},
	{lit: "apikey", ci: true}, {lit: "api_key", off: 1, ci: true}, {lit: "api-key", off: 1, ci: true},
	{lit: "access_key", off: 4, ci: true}, {lit: "accesskey", off: 4, ci: true},
	{lit: "private_key", off: 5, ci: true}, {lit: "credential", ci: true},
}

// internalHostAnchors are the internal name suffixes; ".lan", too short
// for two keys of its own, is registered with each byte that may end a
// name after it.
func internalHostAnchors() []anchor {
	out := []anchor{{lit: ".internal", off: 4, ci: true}, {lit: ".corp", ci: true}, {lit: ".local", off: 1, ci: true}}
	for _, c := range " \t\r\n:/\"'`,;)]}>" {
		out = append(out, anchor{lit: ".lan" + string(c), ci: true})
	}
	return out
}

// ulaAnchors are the first groups of IPv6 unique local addresses: fdXX:
// in either case (fc00::/8 is not assigned).
func ulaAnchors() []anchor {
	var out []anchor
	for _, digits := range []string{lowerHex, upperHex} {
		for i := 0; i < 256; i++ {
			out = append(out, anchor{lit: string([]byte{digits[15], digits[13], digits[i>>4], digits[i&15], ':'})})
		}
	}
	return out
}

// dodgedAtAnchors are the spelled-out '@' of an address written to dodge
// a scanner, glued to the domain ("[at]" then a domain byte) or spaced
// (" [at] "), and " dot " (for name at domain dot com).
func dodgedAtAnchors() []anchor {
	var out []anchor
	for _, w := range []string{"[at]", "(at)", "{at}", "<at>"} {
		out = append(out, anchor{lit: w, next: cDomain, ci: true}, anchor{lit: " " + w + " ", ci: true})
	}
	return append(out, anchor{lit: " dot ", ci: true})
}

// prefixed is the check of a prefixed token: the literal (as issued,
// lower case) followed by at least minLen and at most maxTokenLen bytes
// of cls.
func prefixed(cls uint8, minLen int) func(*scanner, hit) {
	return func(s *scanner, h hit) { s.token(h, cls, minLen) }
}

// checkRecognizers refuses a table that could not work: a row without a
// name, a recognizer's category, anchors or a check, or a name used twice.
func checkRecognizers(rs []recognizer) error {
	seen := map[string]bool{}
	for _, r := range rs {
		switch {
		case r.name == "" || seen[r.name]:
			return fmt.Errorf("dlp: recognizer %q: empty or duplicate name", r.name)
		case r.cat == CatSecret || r.cat >= numCategories:
			return fmt.Errorf("dlp: recognizer %q: category %v is not a recognizer's", r.name, r.cat)
		case len(r.anchors) == 0 && r.keywords == nil:
			return fmt.Errorf("dlp: recognizer %q has no anchors", r.name)
		case r.check == nil:
			return fmt.Errorf("dlp: recognizer %q has no check", r.name)
		}
		seen[r.name] = true
	}
	return nil
}
