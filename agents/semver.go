package agents

import (
	"cmp"
	"regexp"
	"strconv"
	"strings"
)

// A small semver (semver.org 2.0) with npm's range grammar, enough to
// resolve a dependency tree from packuments: exact versions, comparators
// (<, <=, >, >=, =), x-ranges (1.x, 1.2.*, *), tilde and caret ranges,
// hyphen ranges and ||. Prereleases match only a comparator on the same
// major.minor.patch that has a prerelease itself, as npm does.

type semver struct {
	major, minor, patch int
	pre                 []string
}

var semverRE = regexp.MustCompile(`^v?(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})\.(0|[1-9]\d{0,8})(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$`)

func parseSemver(s string) (semver, bool) {
	m := semverRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return semver{}, false
	}
	var v semver
	v.major, _ = strconv.Atoi(m[1])
	v.minor, _ = strconv.Atoi(m[2])
	v.patch, _ = strconv.Atoi(m[3])
	if m[4] != "" {
		v.pre = strings.Split(m[4], ".")
	}
	return v, true
}

func (a semver) compare(b semver) int {
	if c := cmp.Compare(a.major, b.major); c != 0 {
		return c
	}
	if c := cmp.Compare(a.minor, b.minor); c != 0 {
		return c
	}
	if c := cmp.Compare(a.patch, b.patch); c != 0 {
		return c
	}
	switch {
	case len(a.pre) == 0 && len(b.pre) == 0:
		return 0
	case len(a.pre) == 0:
		return 1
	case len(b.pre) == 0:
		return -1
	}
	for i := 0; i < len(a.pre) && i < len(b.pre); i++ {
		x, xerr := strconv.Atoi(a.pre[i])
		y, yerr := strconv.Atoi(b.pre[i])
		var c int
		switch {
		case xerr == nil && yerr == nil:
			c = cmp.Compare(x, y)
		case xerr == nil:
			c = -1
		case yerr == nil:
			c = 1
		default:
			c = strings.Compare(a.pre[i], b.pre[i])
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a.pre), len(b.pre))
}

type comparator struct {
	op string // "<", "<=", ">", ">=", "="
	v  semver
}

func (c comparator) match(v semver) bool {
	d := v.compare(c.v)
	switch c.op {
	case "<":
		return d < 0
	case "<=":
		return d <= 0
	case ">":
		return d > 0
	case ">=":
		return d >= 0
	}
	return d == 0
}

// semverRange is a union of intersections of comparators.
type semverRange [][]comparator

// partial is a version with x-range holes: n is how many of major,
// minor, patch were given.
type partial struct {
	v semver
	n int
}

var partialRE = regexp.MustCompile(`^v?(?:(\d{1,9}|[xX*])(?:\.(\d{1,9}|[xX*])(?:\.(\d{1,9}|[xX*])(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?)?)?)?$`)

func parsePartial(s string) (partial, bool) {
	m := partialRE.FindStringSubmatch(s)
	if m == nil {
		return partial{}, false
	}
	var p partial
	nums := []*int{&p.v.major, &p.v.minor, &p.v.patch}
	for i := 0; i < 3; i++ {
		f := m[i+1]
		if f == "" || f == "x" || f == "X" || f == "*" {
			break
		}
		*nums[i], _ = strconv.Atoi(f)
		p.n++
	}
	if m[4] != "" {
		if p.n < 3 {
			return partial{}, false
		}
		p.v.pre = strings.Split(m[4], ".")
	}
	return p, true
}

// next is the smallest version above every version the partial covers.
func (p partial) next() semver {
	switch p.n {
	case 1:
		return semver{major: p.v.major + 1, pre: []string{"0"}}
	case 2:
		return semver{major: p.v.major, minor: p.v.minor + 1, pre: []string{"0"}}
	}
	return semver{major: p.v.major, minor: p.v.minor, patch: p.v.patch + 1, pre: []string{"0"}}
}

func floor(v semver) semver {
	return semver{major: v.major, minor: v.minor, patch: v.patch, pre: v.pre}
}

// parseRange parses an npm version range; ok is false for anything it
// does not understand (a tag, a URL, an alias), which the caller refuses.
func parseRange(s string) (semverRange, bool) {
	s = strings.TrimSpace(s)
	if len(s) > 256 {
		return nil, false
	}
	var r semverRange
	for _, alt := range strings.Split(s, "||") {
		set, ok := parseSet(strings.TrimSpace(alt))
		if !ok {
			return nil, false
		}
		r = append(r, set)
	}
	return r, true
}

var opSpace = regexp.MustCompile(`(<=|>=|<|>|=|~>|~|\^)\s+`)

func parseSet(s string) ([]comparator, bool) {
	if s == "" || s == "*" || s == "x" || s == "X" {
		return []comparator{{">=", semver{}}}, true
	}
	s = opSpace.ReplaceAllString(s, "$1")
	f := strings.Fields(s)
	if len(f) == 3 && f[1] == "-" { // hyphen range
		lo, ok1 := parsePartial(f[0])
		hi, ok2 := parsePartial(f[2])
		if !ok1 || !ok2 {
			return nil, false
		}
		out := []comparator{{">=", floor(lo.v)}}
		if hi.n == 3 {
			out = append(out, comparator{"<=", hi.v})
		} else if hi.n > 0 {
			out = append(out, comparator{"<", hi.next()})
		}
		return out, true
	}
	var out []comparator
	for _, t := range f {
		cs, ok := parseComparator(t)
		if !ok {
			return nil, false
		}
		out = append(out, cs...)
	}
	return out, true
}

func parseComparator(t string) ([]comparator, bool) {
	op := ""
	for _, o := range []string{"<=", ">=", "~>", "<", ">", "=", "~", "^"} {
		if strings.HasPrefix(t, o) {
			op, t = o, t[len(o):]
			break
		}
	}
	p, ok := parsePartial(t)
	if !ok {
		return nil, false
	}
	lo := floor(p.v)
	any := []comparator{{">=", semver{}}}
	switch op {
	case "", "=":
		if p.n == 0 {
			return any, true
		}
		if p.n == 3 {
			return []comparator{{"=", p.v}}, true
		}
		return []comparator{{">=", lo}, {"<", p.next()}}, true
	case "~", "~>":
		if p.n == 0 {
			return any, true
		}
		hi := partial{v: p.v, n: min(p.n, 2)}
		return []comparator{{">=", lo}, {"<", hi.next()}}, true
	case "^":
		if p.n == 0 {
			return any, true
		}
		var hi partial
		switch {
		case p.v.major != 0 || p.n == 1:
			hi = partial{v: p.v, n: 1}
		case p.v.minor != 0 || p.n == 2:
			hi = partial{v: p.v, n: 2}
		default:
			hi = partial{v: p.v, n: 3}
		}
		return []comparator{{">=", lo}, {"<", hi.next()}}, true
	case ">":
		if p.n == 0 {
			return []comparator{{"<", semver{}}}, true // nothing
		}
		if p.n == 3 {
			return []comparator{{">", p.v}}, true
		}
		return []comparator{{">=", p.next()}}, true
	case ">=":
		return []comparator{{">=", lo}}, true
	case "<":
		return []comparator{{"<", semver{major: lo.major, minor: lo.minor, patch: lo.patch, pre: append([]string{}, orZero(p)...)}}}, true
	case "<=":
		if p.n == 3 {
			return []comparator{{"<=", p.v}}, true
		}
		if p.n == 0 {
			return any, true
		}
		return []comparator{{"<", p.next()}}, true
	}
	return nil, false
}

// orZero: "<1.2.3" excludes 1.2.3's prereleases too (npm: <1.2.3-0).
func orZero(p partial) []string {
	if len(p.v.pre) > 0 {
		return p.v.pre
	}
	return []string{"0"}
}

// match reports whether v satisfies the range. A prerelease satisfies it
// only when a comparator of the same set names a prerelease of the same
// major.minor.patch.
func (r semverRange) match(v semver) bool {
	for _, set := range r {
		ok := true
		for _, c := range set {
			if !c.match(v) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		if len(v.pre) == 0 {
			return true
		}
		for _, c := range set {
			if len(c.v.pre) > 0 && c.v.pre[0] != "0" && c.v.major == v.major && c.v.minor == v.minor && c.v.patch == v.patch {
				return true
			}
		}
	}
	return false
}
