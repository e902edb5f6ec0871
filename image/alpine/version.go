package alpine

import (
	"fmt"
	"strconv"
	"strings"
)

// version is a parsed Alpine version:
// digits{.digits}[letter]{_suffix[digits]}[-r<digits>].
type version struct {
	nums     []uint64
	letter   byte
	letterN  uint64 // digits after the letter, as in "0.99f7"
	suffixes []suffix
	rel      uint64
}

type suffix struct {
	rank int
	n    uint64
}

// suffixRank orders suffixes as apk does: pre-releases before the plain
// version, post-releases after it.
var suffixRank = map[string]int{
	"alpha": -4, "beta": -3, "pre": -2, "rc": -1,
	"cvs": 1, "svn": 2, "git": 3, "hg": 4, "p": 5,
}

func parseVersion(s string) (version, error) {
	var v version
	orig := s
	bad := func() (version, error) { return version{}, fmt.Errorf("version %q is not an Alpine version", orig) }
	if i := strings.LastIndex(s, "-r"); i >= 0 {
		n, err := strconv.ParseUint(s[i+2:], 10, 64)
		if err != nil {
			return bad()
		}
		v.rel, s = n, s[:i]
	}
	main, rest, _ := strings.Cut(s, "_")
	if main == "" {
		return bad()
	}
	if i := strings.LastIndexAny(main, "abcdefghijklmnopqrstuvwxyz"); i >= 0 {
		tail := main[i+1:]
		if tail != "" {
			n, err := strconv.ParseUint(tail, 10, 64)
			if err != nil {
				return bad()
			}
			v.letterN = n
		}
		v.letter, main = main[i], main[:i]
	}
	for _, part := range strings.Split(main, ".") {
		n, err := strconv.ParseUint(part, 10, 64)
		if err != nil {
			return bad()
		}
		v.nums = append(v.nums, n)
	}
	if rest != "" {
		for _, sfx := range strings.Split(rest, "_") {
			name := strings.TrimRight(sfx, "0123456789")
			rank, ok := suffixRank[name]
			if !ok {
				return bad()
			}
			var n uint64
			if d := sfx[len(name):]; d != "" {
				var err error
				if n, err = strconv.ParseUint(d, 10, 64); err != nil {
					return bad()
				}
			}
			v.suffixes = append(v.suffixes, suffix{rank, n})
		}
	}
	return v, nil
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// compareVersions orders two Alpine versions; an unparsable version
// sorts before every valid one (the index parser refuses them anyway).
func compareVersions(a, b string) int {
	va, ea := parseVersion(a)
	vb, eb := parseVersion(b)
	if ea != nil || eb != nil {
		switch {
		case ea != nil && eb != nil:
			return strings.Compare(a, b)
		case ea != nil:
			return -1
		}
		return 1
	}
	for i := 0; i < len(va.nums) || i < len(vb.nums); i++ {
		if i >= len(va.nums) {
			return -1
		}
		if i >= len(vb.nums) {
			return 1
		}
		if c := cmpU(va.nums[i], vb.nums[i]); c != 0 {
			return c
		}
	}
	if c := cmpU(uint64(va.letter), uint64(vb.letter)); c != 0 {
		return c
	}
	if c := cmpU(va.letterN, vb.letterN); c != 0 {
		return c
	}
	for i := 0; i < len(va.suffixes) || i < len(vb.suffixes); i++ {
		var sa, sb suffix
		if i < len(va.suffixes) {
			sa = va.suffixes[i]
		}
		if i < len(vb.suffixes) {
			sb = vb.suffixes[i]
		}
		if c := cmpU(uint64(sa.rank+8), uint64(sb.rank+8)); c != 0 {
			return c
		}
		if c := cmpU(sa.n, sb.n); c != 0 {
			return c
		}
	}
	return cmpU(va.rel, vb.rel)
}

// constraint is one dependency: a name (package, so:, cmd:, pc:, or a
// path) with an optional version operator.
type constraint struct {
	name     string
	op       string // "", "=", "<", "<=", ">", ">=", "~"
	version  string
	conflict bool
}

func parseConstraint(s string) constraint {
	c := constraint{}
	if strings.HasPrefix(s, "!") {
		c.conflict, s = true, s[1:]
	}
	for _, op := range []string{">=", "<=", "~", "=", "<", ">"} {
		if i := strings.Index(s, op); i > 0 {
			c.name, c.op, c.version = s[:i], op, s[i+len(op):]
			return c
		}
	}
	c.name = s
	return c
}

func (c constraint) String() string { return c.name + c.op + c.version }

// matches reports whether version v satisfies the operator.
func (c constraint) matches(v string) bool {
	if c.op == "" {
		return true
	}
	if v == "" {
		return false
	}
	d := compareVersions(v, c.version)
	switch c.op {
	case "=":
		return d == 0
	case "<":
		return d < 0
	case "<=":
		return d <= 0
	case ">":
		return d > 0
	case ">=":
		return d >= 0
	case "~":
		return v == c.version || strings.HasPrefix(v, c.version+".") || strings.HasPrefix(v, c.version+"-") || strings.HasPrefix(v, c.version+"_")
	}
	return false
}
