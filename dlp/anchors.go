package dlp

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// anchorKind says which recognizer an anchor starts.
type anchorKind uint8

const (
	akAWS anchorKind = iota + 1
	akGCP
	akGitHub
	akGitHubPAT
	akGitLab
	akSlack
	akStripe
	akAnthropic
	akOpenAI
	akOpenAILegacy
	akNPM
	akBearer
	akBasic
	akJWT
	akPEM
	akAge
	akHome
	akWinHome
	akAssign
	// akGitleaks: a keyword of gitleaks rules (see gitleaks.go).
	akGitleaks
)

// anchorCats is the category each kind reports; a kind is scanned only
// when the policy records or redacts its category.
var anchorCats = [...]Category{
	akAWS: CatCloudKey, akGCP: CatCloudKey,
	akGitHub: CatToken, akGitHubPAT: CatToken, akGitLab: CatToken, akSlack: CatToken, akStripe: CatToken,
	akAnthropic: CatToken, akOpenAI: CatToken, akOpenAILegacy: CatToken, akNPM: CatToken,
	akBearer: CatToken, akBasic: CatToken,
	akJWT: CatJWT, akPEM: CatPrivateKey, akAge: CatPrivateKey,
	akHome: CatHomePath, akWinHome: CatHomePath, akAssign: CatPassword, akGitleaks: CatToken,
}

// Anchors are found by sampling the text every second byte: each anchor
// registers the 4-byte windows of its literal at two consecutive offsets
// (keys), so whatever the alignment one of them is sampled. The keys are
// chosen to be rare in ordinary text ("swor" and "word" for password).
// Case-insensitive literals register every case variant of their keys; a
// key may end in a wildcard byte of a class (AKIA then any of [A-Z0-9]).
type anchorDef struct {
	lit string
	// off is the offset of the first key in lit; the keys are
	// lit[off:off+4] and lit[off+1:off+5], where a position past the
	// literal stands for any byte of class next.
	off  int
	next uint8
	ci   bool // case-insensitive literal
	kind anchorKind
}

const (
	cUpperDigit = cUpper | cDigit
	cAlnum      = cLower | cUpper | cDigit
)

// anchorDefs are the literals that start (or, for JWTs, sit inside) a
// recognizer; the recognizers check the rest. '@' (addresses and URL
// credentials) and digits (cards and addresses) have their own passes.
var anchorDefs = []anchorDef{
	{"AKIA", 0, cUpperDigit, false, akAWS}, {"ASIA", 0, cUpperDigit, false, akAWS},
	{"ABIA", 0, cUpperDigit, false, akAWS}, {"ACCA", 0, cUpperDigit, false, akAWS},
	{"AIza", 0, cB64URL, false, akGCP},
	{"ghp_", 0, cAlnum, false, akGitHub}, {"gho_", 0, cAlnum, false, akGitHub}, {"ghu_", 0, cAlnum, false, akGitHub},
	{"ghs_", 0, cAlnum, false, akGitHub}, {"ghr_", 0, cAlnum, false, akGitHub},
	{"github_pat_", 3, 0, false, akGitHubPAT},
	{"glpat-", 1, 0, false, akGitLab}, {"gldt-", 0, 0, false, akGitLab}, {"glrt-", 0, 0, false, akGitLab},
	{"glptt-", 1, 0, false, akGitLab}, {"glsoat-", 2, 0, false, akGitLab}, {"glcbt-", 1, 0, false, akGitLab},
	{"xoxb-", 0, 0, false, akSlack}, {"xoxp-", 0, 0, false, akSlack}, {"xoxa-", 0, 0, false, akSlack},
	{"xoxr-", 0, 0, false, akSlack}, {"xoxs-", 0, 0, false, akSlack}, {"xoxe-", 0, 0, false, akSlack},
	{"sk_live_", 0, 0, false, akStripe}, {"rk_live_", 0, 0, false, akStripe},
	{"sk_test_", 0, 0, false, akStripe}, {"rk_test_", 0, 0, false, akStripe}, {"whsec_", 1, 0, false, akStripe},
	{"sk-ant-", 2, 0, false, akAnthropic},
	{"sk-proj-", 2, 0, false, akOpenAI}, {"sk-svcacct-", 3, 0, false, akOpenAI}, {"sk-admin-", 2, 0, false, akOpenAI},
	{"T3BlbkFJ", 0, 0, false, akOpenAILegacy},
	{"npm_", 0, cAlnum, false, akNPM},
	{"bearer ", 2, 0, true, akBearer},
	{"basic ", 1, 0, true, akBasic},
	{".eyJ", 0, cB64URL, false, akJWT},
	{"-----BEGIN ", 5, 0, false, akPEM},
	{"AGE-SECRET-KEY-1", 0, 0, false, akAge},
	{"/Users/", 0, 0, false, akHome}, {"/home/", 0, 0, false, akHome},
	{`\users\`, 2, 0, true, akWinHome},
	{"password", 2, 0, true, akAssign}, {"passwd", 1, 0, true, akAssign}, {"passphrase", 4, 0, true, akAssign},
	{"secret", 0, 0, true, akAssign}, {"token", 0, 0, true, akAssign},
	{"apikey", 0, 0, true, akAssign}, {"api_key", 1, 0, true, akAssign}, {"api-key", 1, 0, true, akAssign},
	{"access_key", 4, 0, true, akAssign}, {"accesskey", 4, 0, true, akAssign},
	{"private_key", 5, 0, true, akAssign}, {"credential", 0, 0, true, akAssign},
}

// anchorIndex tests the 4-byte window at every second position against a
// bitmap of the anchor keys (independent tests, nothing carried from byte
// to byte); the rare hits look the key up and compare the literal.
type anchorIndex struct {
	bitmap [1 << anchorBits / 64]uint64
	byKey  map[uint32][]anchorRef
}

type anchorRef struct {
	def *anchorDef
	off int // of the key in the literal
}

const anchorMul = 0x9E3779B1

// anchorBits sizes the anchor bitmap: 2^20 bits (128 KiB) keep false
// hits near 1 % for the ~1,100 keys of vibedom's anchors and the ~10,000
// of gitleaks' keywords.
const anchorBits = 20

func anchorHash(key uint32) uint32 { return (key * anchorMul) >> (32 - anchorBits) }

func fold(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// variants lists s in every combination of letter cases.
func variants(s string) []string {
	out := []string{""}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lo, up := fold(c), c
		if c >= 'a' && c <= 'z' {
			up = c - 'a' + 'A'
		}
		var next []string
		for _, p := range out {
			next = append(next, p+string(lo))
			if up != lo {
				next = append(next, p+string(up))
			}
		}
		out = next
	}
	return out
}

func newAnchorIndex() *anchorIndex {
	x := &anchorIndex{byKey: map[uint32][]anchorRef{}}
	for i := range anchorDefs {
		d := &anchorDefs[i]
		for _, off := range []int{d.off, d.off + 1} {
			var keys []string
			if off+4 <= len(d.lit) {
				keys = []string{d.lit[off : off+4]}
			} else if off+3 == len(d.lit) && d.next != 0 {
				for c := 0; c < 256; c++ {
					if class[c]&d.next != 0 {
						keys = append(keys, d.lit[off:]+string(rune(c)))
					}
				}
			} else {
				panic("dlp: anchor " + d.lit + " has no key at offset " + fmt.Sprint(off))
			}
			if d.ci {
				var all []string
				for _, k := range keys {
					all = append(all, variants(k)...)
				}
				keys = all
			}
			for _, k := range keys {
				x.register(k, anchorRef{d, off})
			}
		}
	}
	// gitleaks' keywords. Without its rules (they always load: they are
	// compiled in) vibedom's own recognizers still run.
	if g, err := gitleaksRules(); err == nil {
		kws := make([]string, 0, len(g.byKeyword))
		for kw := range g.byKeyword {
			kws = append(kws, kw)
		}
		slices.Sort(kws)
		for _, kw := range kws {
			d := &anchorDef{lit: kw, ci: true, kind: akGitleaks}
			for k, off := range glKeys(kw) {
				x.register(k, anchorRef{d, off})
			}
		}
	}
	return x
}

func (x *anchorIndex) register(k string, r anchorRef) {
	key := binary.LittleEndian.Uint32([]byte(k))
	h := anchorHash(key)
	x.bitmap[h>>6] |= 1 << (h & 63)
	x.byKey[key] = append(x.byKey[key], r)
}

// matchLit reports whether d's literal starts at buf[i].
func matchLit(buf []byte, i int, d *anchorDef) bool {
	if i < 0 || i+len(d.lit) > len(buf) {
		return false
	}
	if !d.ci {
		return string(buf[i:i+len(d.lit)]) == d.lit
	}
	for k := 0; k < len(d.lit); k++ {
		if fold(buf[i+k]) != fold(d.lit[k]) {
			return false
		}
	}
	return true
}
