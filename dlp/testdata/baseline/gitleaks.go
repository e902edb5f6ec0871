package baseline

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/viper"
	"github.com/zricethezav/gitleaks/v8/config"
)

// Traffic is also scanned with gitleaks' default rules (the ones the
// preflight runs on the workspace): each rule whose keywords are
// distinctive enough to anchor it (SendGrid's "SG.", "xkeysib-",
// "shpat_", provider names …) is run, on a keyword hit, over the text
// around the keyword, with the rule's secret group, entropy threshold and
// allowlists and gitleaks' global allowlist. Rules vibedom's own
// recognizers cover better, and generic ones, are left out (glSkip).
type glRules struct {
	// byKeyword lists the rules each keyword (lower case) starts.
	byKeyword map[string][]*config.Rule
	byID      map[string]*config.Rule
	global    []*config.Allowlist
	skipped   []string
}

// glSkip are the gitleaks rules not run on traffic: vibedom's recognizers
// do their work (whole PEM blocks, JWTs, assignments to secret-sounding
// names, curl credentials), or they need a file path or other rules.
var glSkip = []string{
	"generic-api-key", "private-key", "jwt", "jwt-base64", "kubernetes-secret-yaml", "pkcs12-file",
	"curl-auth-header", "curl-auth-user", "nuget-config-password",
}

// glCommonKeywords are keywords too common in ordinary text to anchor a
// rule.
var glCommonKeywords = []string{"access", "api", "api-", "auth", "key", "credential", "creds", "passwd", "password", "secret", "token", "curl", "intra", "linear"}

// gitleaksRules loads gitleaks' default configuration once.
var gitleaksRules = sync.OnceValues(func() (*glRules, error) {
	// gitleaks' global logger is left alone (the preflight silences it):
	// loading its default rules logs nothing and handles no value.
	v := viper.New()
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(config.DefaultConfig)); err != nil {
		return nil, fmt.Errorf("dlp: read gitleaks rules: %w", err)
	}
	var vc config.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		return nil, fmt.Errorf("dlp: read gitleaks rules: %w", err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		return nil, fmt.Errorf("dlp: load gitleaks rules: %w", err)
	}
	g := &glRules{byKeyword: map[string][]*config.Rule{}, byID: map[string]*config.Rule{}, global: cfg.Allowlists}
	for id, r := range cfg.Rules {
		r := r
		g.byID[id] = &r
	}
	ids := make([]string, 0, len(cfg.Rules))
	for id := range cfg.Rules {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := g.byID[id]
		if slices.Contains(glSkip, id) || r.Regex == nil || len(r.RequiredRules) > 0 || r.Path != nil {
			g.skipped = append(g.skipped, id)
			continue
		}
		n := 0
		for _, kw := range r.Keywords {
			kw = strings.ToLower(kw)
			if len(kw) < 3 || slices.Contains(glCommonKeywords, kw) {
				continue
			}
			g.byKeyword[kw] = append(g.byKeyword[kw], r)
			n++
		}
		if n == 0 {
			g.skipped = append(g.skipped, id)
		}
	}
	return g, nil
})

// gitleaksKeywords lists the keywords that anchor gitleaks' rules, sorted.
// Without its rules (they always load: they are compiled in) vibedom's
// own recognizers still run.
func gitleaksKeywords() []string {
	g, err := gitleaksRules()
	if err != nil {
		return nil
	}
	kws := make([]string, 0, len(g.byKeyword))
	for kw := range g.byKeyword {
		kws = append(kws, kw)
	}
	slices.Sort(kws)
	return kws
}

// glBoundary are the bytes that may come before a short keyword (its
// 4-byte key then starts one byte early).
const glBoundary = " \t\r\n\"'`=:([{,;/.->|*_+@#!?&%$~<\\"

// glKeys returns the 4-byte keys of a keyword, each with its offset in
// the keyword (-1: the key starts one byte before it), for the keyword in
// lower case, upper case and title case. Keys are taken where the keyword
// is least like ordinary words (around its punctuation and digits, else
// its end: "b_pa" of github_pat_, "tful" of contentful), so common words
// ("content", "path", "pull") seldom hit them.
func glKeys(kw string) map[string]int {
	out := map[string]int{}
	vs := []string{kw, strings.ToUpper(kw), strings.ToUpper(kw[:1]) + kw[1:]}
	// A domain's ".com" is as common as the word "content".
	limit := len(kw)
	for _, tld := range []string{".com", ".org", ".net", ".io"} {
		if strings.HasSuffix(kw, tld) && len(kw)-len(tld) >= 5 {
			limit = len(kw) - len(tld)
		}
	}
	rare := func(k string) int {
		n := 0
		for _, c := range []byte(k) {
			switch {
			case c == '.':
				n++
			case c < 'a' || c > 'z':
				n += 2
			}
		}
		return n
	}
	off, best := 0, -1
	for o := 0; o+5 <= limit; o++ {
		// Both keys should be rare: the weaker one counts most.
		a, b := rare(kw[o:o+4]), rare(kw[o+1:o+5])
		score := 10*min(a, b) + a + b
		if score >= best {
			off, best = o, score
		}
	}
	for _, v := range vs {
		switch {
		case len(v) >= 5:
			out[v[off:off+4]], out[v[off+1:off+5]] = off, off+1
		case len(v) == 4 && (kw[3] < 'a' || kw[3] > 'z'):
			// Punctuation at the end: the key holds it, then a token
			// byte.
			out[v] = 0
			for c := 0; c < 256; c++ {
				if class[c]&cB64URL != 0 || c == '.' {
					out[v[1:]+string(rune(c))] = 1
				}
			}
		case len(v) == 4:
			out[v] = 0
			for i := 0; i < len(glBoundary); i++ {
				out[string(glBoundary[i])+v[:3]] = -1
			}
		case len(v) == 3:
			for i := 0; i < len(glBoundary); i++ {
				out[string(glBoundary[i])+v] = -1
			}
			for c := 0; c < 256; c++ {
				if class[c]&cB64URL != 0 || c == '.' {
					out[v+string(rune(c))] = 0
				}
			}
		}
	}
	return out
}

// glReach is how far around a keyword a rule's pattern is searched.
const (
	glBefore = 128
	glAfter  = 1024
)

// gitleaksAt runs the rules of the keyword hit. The text around
// a keyword is searched once for all the keyword's occurrences in it: a
// text made of keywords ("SG.SG.SG.…") costs a search every glAfter/2
// bytes, not one per occurrence.
//
//go:noinline
func (s *scanner) gitleaksAt(h hit) {
	kw, as := h.lit, h.as
	g, _ := gitleaksRules()
	if g == nil {
		return
	}
	if s.glCover == nil {
		s.glCover = map[string]int{}
	}
	if end, ok := s.glCover[kw]; ok && as < end {
		return
	}
	lo, hi := max(0, as-glBefore), min(s.n, as+len(kw)+glAfter)
	s.glCover[kw] = max(as+1, hi-glAfter/2)
	if testGitleaksRun != nil {
		testGitleaksRun()
	}
	region := s.buf[lo:hi]
	for _, r := range g.byKeyword[kw] {
		for _, loc := range r.Regex.FindAllSubmatchIndex(region, -1) {
			// A match near the region's end may be cut short: it is
			// searched again from a later occurrence of the keyword,
			// unless it holds this one.
			if hi < s.n && lo+loc[1] > hi-64 && !(lo+loc[0] <= as && as < lo+loc[1]) {
				continue
			}
			ss, se := glSecret(r, loc)
			if ss < 0 {
				continue
			}
			secret := region[ss:se]
			if r.Entropy > 0 && entropy(secret) < r.Entropy {
				continue
			}
			line := glLine(region, loc[0], loc[1])
			if g.allowed(r, string(secret), string(region[loc[0]:loc[1]]), string(line)) {
				continue
			}
			s.add(lo+ss, lo+se, h.cat)
		}
	}
}

// testGitleaksRun counts the searches (tests only).
var testGitleaksRun func()

// glSecret picks the secret of a match as gitleaks does: the rule's
// secret group, else the first non-empty group, else the whole match.
func glSecret(r *config.Rule, loc []int) (int, int) {
	if g := r.SecretGroup; g > 0 {
		if 2*g+1 < len(loc) && loc[2*g] >= 0 {
			return loc[2*g], loc[2*g+1]
		}
		return -1, -1
	}
	for g := 1; 2*g+1 < len(loc); g++ {
		if loc[2*g] >= 0 && loc[2*g+1] > loc[2*g] {
			return loc[2*g], loc[2*g+1]
		}
	}
	return loc[0], loc[1]
}

func glLine(b []byte, s, e int) []byte {
	ls := bytes.LastIndexByte(b[:s], '\n') + 1
	le := bytes.IndexByte(b[e:], '\n')
	if le < 0 {
		return b[ls:]
	}
	return b[ls : e+le]
}

// allowed applies the rule's allowlists and the global ones.
func (g *glRules) allowed(r *config.Rule, secret, match, line string) bool {
	for _, a := range r.Allowlists {
		if glAllowlisted(a, secret, match, line) {
			return true
		}
	}
	for _, a := range g.global {
		if glAllowlisted(a, secret, match, line) {
			return true
		}
	}
	return false
}

func glAllowlisted(a *config.Allowlist, secret, match, line string) bool {
	if len(a.Paths) > 0 || len(a.Commits) > 0 {
		return false // about files, not traffic
	}
	target := secret
	switch a.RegexTarget {
	case "match":
		target = match
	case "line":
		target = line
	}
	re := len(a.Regexes) > 0 && a.RegexAllowed(target)
	sw := false
	if len(a.StopWords) > 0 {
		sw, _ = a.ContainsStopWord(secret)
	}
	if a.MatchCondition == config.AllowlistMatchAnd {
		return (len(a.Regexes) == 0 || re) && (len(a.StopWords) == 0 || sw) && (len(a.Regexes)+len(a.StopWords) > 0)
	}
	return re || sw
}

// glPlaceholder reports a value gitleaks' allowlists would let go: the
// global allowlist, and the allowlist of the gitleaks rule a vibedom
// recognizer stands in for (AKIA…EXAMPLE).
func glPlaceholder(ruleID, value string) bool {
	g, _ := gitleaksRules()
	if g == nil {
		return false
	}
	if r := g.byID[ruleID]; r != nil {
		for _, a := range r.Allowlists {
			if glAllowlisted(a, value, value, value) {
				return true
			}
		}
	}
	for _, a := range g.global {
		if glAllowlisted(a, value, value, value) {
			return true
		}
	}
	return false
}

// GitleaksRulesUsed lists the gitleaks rules run on traffic, and those
// left out.
func GitleaksRulesUsed() (used, skipped []string, err error) {
	g, err := gitleaksRules()
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for _, rs := range g.byKeyword {
		for _, r := range rs {
			if !seen[r.RuleID] {
				seen[r.RuleID] = true
				used = append(used, r.RuleID)
			}
		}
	}
	slices.Sort(used)
	return used, slices.Clone(g.skipped), nil
}
