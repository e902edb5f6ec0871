package dlp

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
)

// match is one finding in a segment's decoded text.
type match struct {
	start, end int32
	cat        Category
	form       form
	// cont: the match goes on with a redaction an earlier window began
	// (the rest of a private key), so it adds no placeholder of its own.
	cont   bool
	secret int32 // index of the known secret, for CatSecret
}

// Byte classes.
const (
	cLower = 1 << iota
	cUpper
	cDigit
	cB64URL // [A-Za-z0-9_-]
	cLocal  // e-mail local part: [A-Za-z0-9._%+-]
	cDomain // [A-Za-z0-9-]
	cBearer // [A-Za-z0-9._~+/=-]
	cIdent  // [A-Za-z0-9_.-]
)

var class [256]uint8

func init() {
	for c := 0; c < 256; c++ {
		b := byte(c)
		var v uint8
		switch {
		case b >= 'a' && b <= 'z':
			v = cLower
		case b >= 'A' && b <= 'Z':
			v = cUpper
		case b >= '0' && b <= '9':
			v = cDigit
		}
		alnum := v != 0
		if alnum || b == '_' || b == '-' {
			v |= cB64URL
		}
		if alnum || strings.IndexByte("._%+-", b) >= 0 {
			v |= cLocal
		}
		if alnum || b == '-' {
			v |= cDomain
		}
		if alnum || strings.IndexByte("._~+/=-", b) >= 0 {
			v |= cBearer
		}
		if alnum || b == '_' || b == '.' || b == '-' {
			v |= cIdent
		}
		class[c] = v
	}
}

func isAlnum(c byte) bool { return class[c]&(cLower|cUpper|cDigit) != 0 }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// Longest matches of the recognizers. A segment holds back hold bytes
// (see segment) so a match that starts before its cut is complete.
const (
	maxTokenLen = 1024
	maxJWTLen   = 8192
	maxPEMLen   = 16 << 10
)

// scanner finds matches in one window of a segment. buf[:from] is text
// already emitted (context only); matches start at or after from.
type scanner struct {
	e     *Engine
	pol   *Policy
	buf   []byte
	from  int
	n     int
	final bool
	// hold is the earliest position that may not be emitted yet (an
	// unfinished PEM block); n when nothing is held.
	hold int
	// pemOpen: a PEM block began in an earlier window and has not ended.
	pemOpen *bool
	// full: the window is full, so something must be emitted.
	full bool
	out  []match
	// glCover: how far each gitleaks keyword's rules have searched.
	glCover map[string]int
	// noAnchors: run leaves the anchor pass to another goroutine.
	noAnchors bool
}

func (s *scanner) add(start, end int, c Category) {
	if start < s.from || end <= start {
		return
	}
	s.out = append(s.out, match{start: int32(start), end: int32(end), cat: c, secret: -1})
}

// addCont adds the rest of a private key an earlier window began to
// redact.
func (s *scanner) addCont(start, end int) {
	if end > start {
		s.out = append(s.out, match{start: int32(start), end: int32(end), cat: CatPrivateKey, secret: -1, cont: true})
	}
}

// run scans for the recognizers of the policy's active categories.
func (s *scanner) run() {
	if *s.pemOpen {
		s.continuePEM()
	}
	if s.pol.anyOf(s.e.anchors.cats) && !s.noAnchors {
		s.anchorPass()
	}
	buf := s.buf[:s.n]
	if s.pol.active(CatEmail) || s.pol.active(CatCredentials) {
		for i := s.from; i < len(buf); {
			k := bytes.IndexByte(buf[i:], '@')
			if k < 0 {
				break
			}
			if s.pol.active(CatEmail) {
				s.email(i + k)
			}
			if s.pol.active(CatCredentials) {
				s.urlCredentials(i + k)
			}
			i += k + 1
		}
	}
	if s.pol.active(CatCreditCard) || s.pol.active(CatInternalIP) || s.pol.active(CatSSN) || s.pol.active(CatIBAN) || s.pol.active(CatPhone) {
		// Eight bytes at a time: the runs that start a number are the
		// digits whose byte before is neither a digit nor glued to a
		// word (a SHA, a UUID, v1.2, x86: no card, address, SSN or
		// phone number starts there, each wants a token edge), so a
		// word of code costs a few operations, not a call per run.
		i := s.from
		for i+8 <= len(buf) {
			x := binary.LittleEndian.Uint64(buf[i : i+8])
			d := digitMask(x)
			if d == 0 {
				i += 8
				continue
			}
			g := d | gluedMask(x)
			prevG := g << 8
			if i > 0 && gluedOrDigit[buf[i-1]] {
				prevG |= 0x80
			}
			starts := d &^ prevG
			consumed := i
			for starts != 0 {
				p := i + bits.TrailingZeros64(starts)/8
				starts &= starts - 1
				if p >= consumed {
					consumed = s.numberAt(p)
				}
			}
			i = max(i+8, consumed)
		}
		for ; i < len(buf); i++ {
			if isDigit(buf[i]) {
				i = s.digitRun(i) - 1
			}
		}
	}
}

// anchorPass finds the anchors of the recognizer table and runs their
// checks.
func (s *scanner) anchorPass() {
	buf := s.buf[:s.n]
	bm := &s.e.anchors.bitmap
	// Anchors are looked for in the emitted context too: an anchor may
	// come before its match (the name of an assignment, "Bearer ", a home
	// folder), and a match starting at from or later may follow an anchor
	// before it. Matches starting before from were settled earlier and
	// are dropped (see add). Sampling every second position covers a key
	// of every literal; hits are checked out of line.
	i := max(0, s.from-lookbehind-1)
	// Two samples from one 8-byte load.
	for ; i+8 <= len(buf); i += 4 {
		w := binary.LittleEndian.Uint64(buf[i:])
		h0, h1 := anchorHash(uint32(w)), anchorHash(uint32(w>>16))
		if bm[h0>>6]&(1<<(h0&63)) != 0 {
			s.anchorAt(i)
		}
		if bm[h1>>6]&(1<<(h1&63)) != 0 {
			s.anchorAt(i + 2)
		}
	}
	for ; i <= len(buf)-4; i += 2 {
		h := anchorHash(binary.LittleEndian.Uint32(buf[i:]))
		if bm[h>>6]&(1<<(h&63)) != 0 {
			s.anchorAt(i)
		}
	}
}

// numberAt looks at the run of digits starting at p (the byte before is
// no digit nor glued to a word) and returns where scanning resumes.
func (s *scanner) numberAt(p int) int {
	buf := s.buf[:s.n]
	j := p + 1
	for j < len(buf) && isDigit(buf[j]) {
		j++
	}
	var prev, next byte = ' ', ' '
	if p > 0 {
		prev = buf[p-1]
	}
	if j < len(buf) {
		next = buf[j]
	}
	if prev != '+' && prev != '(' && !(prev >= 'A' && prev <= 'Z') && !numberStart(j-p, next) {
		// A plain number (42, 1024, :8080) too short for a card and
		// followed by nothing an address, SSN or phone number goes
		// on with.
		return j
	}
	return s.digitRun(p)
}

// gluedOrDigit marks the bytes after which a run of digits starts no
// number recognizer: digits (the run goes on), lower-case letters, '_',
// '-' and '.'. (After an upper-case letter a run may be an IBAN's.)
var gluedOrDigit = func() (t [256]bool) {
	for c := range t {
		t[c] = c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
	}
	return t
}()

// gluedMask has the high bit of each byte of x that is a lower-case
// letter, '-', '.' or '_' set.
func gluedMask(x uint64) uint64 {
	const ones = 0x0101010101010101
	eq := x ^ (ones * '_')
	underscore := ^(((eq & (ones * 0x7f)) + ones*0x7f) | eq) & (ones * 0x80)
	return between(x, 'a'-1, 'z'+1) | between(x, ',', '/') | underscore
}

// between has the high bit of each byte b of x with m < b < n set (m, n
// at most 128; bytes with the high bit set never count).
func between(x uint64, m, n uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	return ((ones*(127+n) - (x & (ones * 127))) &^ x & ((x & (ones * 127)) + ones*(127-m))) & highs
}

// numberStart reports whether a run of l digits followed by next may
// start a card (13 or more digits, or 4 then a separator), an address (1
// to 3 digits then a dot), an SSN or a national phone number (3 digits
// then a separator, or 9 digits): what digitRun looks at.
func numberStart(l int, next byte) bool {
	switch {
	case l >= 13:
		return true
	case l <= 3 && next == '.':
		return true
	case l == 3:
		return next == '-' || next == ' '
	case l == 4:
		return next == '-' || next == ' ' || next == '.'
	case l == 9:
		return true // an SSN without dashes
	}
	return false
}

// digitMask has the high bit of each byte of x that is an ASCII digit set
// (the classic "has a byte between m and n" test, exact per byte for
// bytes below 0x80; bytes with the high bit set never count).
func digitMask(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	const m, n = '0' - 1, '9' + 1
	return ((ones*(127+n) - (x & (ones * 127))) &^ x & ((x & (ones * 127)) + ones*(127-m))) & highs
}

// The checks of the recognizer table (recognizers.go) get one hit each
// and add their matches in the hit's category (the row's).

// awsKeyID matches an AWS access key id: the prefix and 16 [A-Z0-9], not
// inside a longer run of upper-case letters and digits (a base32 blob, a
// longer identifier). Anything else may touch it: keys are glued to '-',
// '_' or lower case in file names, ids and concatenations (100-AKIA…,
// x_AKIA…, keyAKIA…).
func (s *scanner) awsKeyID(h hit) {
	buf, as, ae := s.buf, h.as, h.ae
	if !isUpperLit(buf[as:ae]) || !s.boundaryBefore(as, cUpperDigit) {
		return
	}
	if end := runOf(buf, ae, s.n, cUpperDigit, 16); end == ae+16 && !s.classAt(end, cUpperDigit) {
		s.add(as, end, h.cat)
	}
}

// gcpKey matches a GCP API key: AIza and 35 [A-Za-z0-9_-].
func (s *scanner) gcpKey(h hit) {
	buf, as, ae := s.buf, h.as, h.ae
	if string(buf[as:ae]) != "AIza" || !s.boundaryBefore(as, cB64URL) {
		return
	}
	if end := runOf(buf, ae, s.n, cB64URL, 36); end == ae+35 {
		s.add(as, end, h.cat)
	}
}

// ageKey matches an age secret key: AGE-SECRET-KEY-1 and 58 [A-Z0-9].
func (s *scanner) ageKey(h hit) {
	buf, as, ae := s.buf, h.as, h.ae
	if string(buf[as:ae]) == "AGE-SECRET-KEY-1" {
		if end := runOf(buf, ae, s.n, cUpper|cDigit, 59); end == ae+58 {
			s.add(as, end, h.cat)
		}
	}
}

func isUpperLit(b []byte) bool {
	for _, c := range b {
		if class[c]&(cUpper|cDigit) == 0 {
			return false
		}
	}
	return true
}

// runOf returns the end of the run of bytes of class cls starting at i,
// looking at most limit bytes.
func runOf(buf []byte, i, n int, cls uint8, limit int) int {
	end := min(n, i+limit)
	j := i
	for j < end && class[buf[j]]&cls != 0 {
		j++
	}
	return j
}

// boundaryBefore reports whether the byte before i is not of class cls
// (or there is none).
func (s *scanner) boundaryBefore(i int, cls uint8) bool {
	return i == 0 || class[s.buf[i-1]]&cls == 0
}

// classAt reports whether buf[i] exists and is of class cls.
func (s *scanner) classAt(i int, cls uint8) bool {
	return i < s.n && class[s.buf[i]]&cls != 0
}

// token matches a prefixed token: the literal (as issued, lower case)
// followed by at least minLen and at most maxTokenLen bytes of cls.
func (s *scanner) token(h hit, cls uint8, minLen int) {
	buf, as, ae := s.buf, h.as, h.ae
	for _, ch := range buf[as:ae] {
		if ch >= 'A' && ch <= 'Z' {
			return
		}
	}
	if !s.boundaryBefore(as, cB64URL) {
		return
	}
	end := runOf(buf, ae, s.n, cls, maxTokenLen+1)
	if end-ae < minLen || end-ae > maxTokenLen || s.classAt(end, cB64URL) {
		return
	}
	s.add(as, end, h.cat)
}

// bearer matches "Bearer <token>" and redacts the token.
func (s *scanner) bearer(h hit) {
	as, ae := h.as, h.ae
	if !s.boundaryBefore(as, cLower|cUpper|cDigit) {
		return
	}
	end := runOf(s.buf, ae, s.n, cBearer, maxTokenLen+1)
	if end-ae < 16 || end-ae > maxTokenLen {
		return
	}
	if classCount(s.buf[ae:end]) < 2 {
		return
	}
	s.add(ae, end, h.cat)
}

// basic matches "Basic <base64 of user:password>" and redacts the
// credential.
func (s *scanner) basic(h hit) {
	as, ae := h.as, h.ae
	if !s.boundaryBefore(as, cLower|cUpper|cDigit) {
		return
	}
	buf := s.buf
	end := ae
	for end < s.n && end-ae <= 1024 {
		c := buf[end]
		if isAlnum(c) || c == '+' || c == '/' || c == '=' {
			end++
			continue
		}
		break
	}
	tok := buf[ae:end]
	if len(tok) < 8 || len(tok)%4 != 0 || s.classAt(end, cB64URL) {
		return
	}
	dec, err := base64.StdEncoding.DecodeString(string(tok))
	if err != nil || bytes.IndexByte(dec, ':') < 1 {
		return
	}
	for _, c := range dec {
		if c < 0x20 || c == 0x7f {
			return
		}
	}
	s.add(ae, end, h.cat)
}

// jwt matches header.payload.signature around the payload that starts
// after the hit's dot (".eyJ" anchors it: payloads are JSON objects); the
// header before it must start with eyJ too.
func (s *scanner) jwt(h hit) {
	buf, n := s.buf, s.n
	p := h.as + 1
	as := p - 1
	for as > 0 && p-as <= maxJWTLen && class[buf[as-1]]&cB64URL != 0 {
		as--
	}
	if p-1-as < 10 || !bytes.HasPrefix(buf[as:], []byte("eyJ")) || !s.boundaryBefore(as, cB64URL) {
		return
	}
	i := p
	for part := 1; part < 3; part++ {
		end := runOf(buf, i, n, cB64URL, maxJWTLen)
		if end-i < 10 {
			return
		}
		i = end
		if part == 1 {
			if i >= n || buf[i] != '.' {
				return
			}
			i++
		}
	}
	if i-as > maxJWTLen || (i < n && buf[i] == '.') {
		return
	}
	s.add(as, i, h.cat)
}

// openAILegacy matches sk-<20>T3BlbkFJ<20> around its marker.
func (s *scanner) openAILegacy(h hit) {
	buf, n, m := s.buf, s.n, h.as
	as := m - 23
	if as < 0 || string(buf[as:as+3]) != "sk-" || runOf(buf, as+3, m, cAlnum, 20) != m || !s.boundaryBefore(as, cB64URL) {
		return
	}
	end := runOf(buf, m+8, n, cAlnum, 64)
	if end-(m+8) < 20 || s.classAt(end, cB64URL) {
		return
	}
	s.add(as, end, h.cat)
}

// pem matches a whole "-----BEGIN … PRIVATE KEY-----" … "-----END …-----"
// block. A block without its end within maxPEMLen is redacted up to there
// and stays open: what follows is redacted until its end marker.
func (s *scanner) pem(h hit) {
	buf, n, as := s.buf, s.n, h.as
	const begin = "-----BEGIN "
	if as+len(begin) > n || string(buf[as:as+len(begin)]) != begin {
		return
	}
	hdrEnd := bytes.Index(buf[as+len(begin):min(n, as+len(begin)+64)], []byte("-----"))
	if hdrEnd < 0 {
		return
	}
	label := buf[as+len(begin) : as+len(begin)+hdrEnd]
	if !bytes.Contains(label, []byte("PRIVATE KEY")) {
		return
	}
	bodyStart := as + len(begin) + hdrEnd + 5
	if end := pemEnd(buf, bodyStart, min(n, as+maxPEMLen)); end > 0 {
		s.add(as, end, h.cat)
		return
	}
	switch {
	case s.final:
		s.add(as, n, h.cat)
	case n-as < maxPEMLen && !(s.full && as <= s.from):
		// Wait for more text (unless the window is full and holding
		// would stop all progress).
		s.hold = min(s.hold, as)
	default:
		s.add(as, n, h.cat)
		*s.pemOpen = true
	}
}

// pemEnd finds "-----END …-----" in buf[from:limit] and returns the index
// after it, or -1.
func pemEnd(buf []byte, from, limit int) int {
	if from >= limit {
		return -1
	}
	i := bytes.Index(buf[from:limit], []byte("-----END "))
	if i < 0 {
		return -1
	}
	i += from + len("-----END ")
	j := bytes.Index(buf[i:min(limit, i+64)], []byte("-----"))
	if j < 0 {
		return -1
	}
	return i + j + 5
}

// continuePEM redacts the rest of a PEM block that began in an earlier
// window.
func (s *scanner) continuePEM() {
	if end := pemEnd(s.buf, s.from, s.n); end > 0 {
		s.addCont(s.from, end)
		*s.pemOpen = false
		return
	}
	if s.final {
		s.addCont(s.from, s.n)
		*s.pemOpen = false
		return
	}
	// Keep the tail back: an end marker may be split across windows.
	keep := min(80, (s.n-s.from)/2)
	s.addCont(s.from, s.n-keep)
	s.hold = min(s.hold, s.n-keep)
}

// urlCredentials matches the password of scheme://user:password@host,
// given an '@' at at: the last '@' of the URL's authority, with "://" and
// user:password before it.
func (s *scanner) urlCredentials(at int) {
	buf, n := s.buf, s.n
	stop := func(c byte) bool {
		return c == '/' || c == '?' || c == '#' || c <= ' ' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' || c == '\\'
	}
	// Another '@' further in the authority decides instead.
	end := at + 1
	for end < n && end-at < 256 && !stop(buf[end]) {
		if buf[end] == '@' {
			return
		}
		end++
	}
	if end == at+1 {
		return // no host
	}
	// Back to "://" over the user info, where a careless password may
	// hold '?' or '#' unescaped.
	j := at
	for j > 0 && at-j < 512 {
		if j >= 3 && buf[j-1] == '/' && buf[j-2] == '/' && buf[j-3] == ':' {
			break
		}
		if c := buf[j-1]; c != '?' && c != '#' && stop(c) {
			return
		}
		j--
	}
	if j < 4 || buf[j-1] != '/' || buf[j-2] != '/' || buf[j-3] != ':' || !isAlnum(buf[j-4]) {
		return
	}
	colon := bytes.IndexByte(buf[j:at], ':')
	if colon < 0 {
		return
	}
	pw := buf[j+colon+1 : at]
	if len(pw) == 0 || placeholder(pw) || defaultPassword(buf[j:j+colon], pw) {
		return
	}
	s.add(j+colon+1, at, CatCredentials)
}

// defaultPassword reports a URL password that is the user name again or
// a well-known default (postgres:postgres@localhost, root:root,
// guest:guest): it protects nothing.
func defaultPassword(user, pw []byte) bool {
	if bytes.EqualFold(user, pw) {
		return true
	}
	switch strings.ToLower(string(pw)) {
	case "postgres", "root", "admin", "guest", "mysql", "test", "dev", "user", "default", "pass", "123456", "toor", "minioadmin", "rabbitmq", "sa":
		return true
	}
	return false
}

// placeholder reports values that stand for a secret rather than being
// one.
func placeholder(v []byte) bool {
	if len(v) == 0 {
		return true
	}
	switch v[0] {
	case '$', '{', '<', '%', '[':
		return true
	}
	if allSame(v) {
		return true
	}
	l := strings.ToLower(string(v))
	for _, w := range placeholderWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	switch l {
	case "password", "pass", "passwd", "secret", "pw", "pwd", "token", "none", "null", "undefined", "redacted":
		return true
	}
	return false
}

// placeholderValue reports a recognizer's match that stands for a secret
// rather than being one: what gitleaks' allowlists let go (its global
// list, AKIA…EXAMPLE), and tokens spelled out with placeholder words or
// runs (sk-ant-xxxx…, <your-token>).
func placeholderValue(c Category, v string) bool {
	if docExample(c, v) || publicKey(v) {
		return true
	}
	switch c {
	case CatCloudKey:
		if glPlaceholder("aws-access-token", v) || glPlaceholder("gcp-api-key", v) {
			return true
		}
	case CatToken, CatJWT, CatPrivateKey, CatPassword, CatCredentials:
	default:
		return false
	}
	if glPlaceholder("", v) {
		return true
	}
	l := strings.ToLower(v)
	for _, w := range tokenPlaceholderWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

var tokenPlaceholderWords = []string{"xxxxx", "*****", "example", "placeholder", "your_", "your-", "<your", "redacted", "changeme", "dummy", "0000000000", "1234567890", "abcdefgh"}

var placeholderWords = []string{"${", "{{", "xxxx", "****", "....", "your_", "your-", "<your", "example", "placeholder", "changeme", "change_me", "redacted"}

func allSame(v []byte) bool {
	for _, c := range v[1:] {
		if c != v[0] {
			return false
		}
	}
	return true
}

// exemptDomain reports the RFC 2606 and RFC 6761 names.
func exemptDomain(d string) bool {
	d = strings.ToLower(d)
	for _, e := range []string{"example.com", "example.net", "example.org"} {
		if d == e || strings.HasSuffix(d, "."+e) {
			return true
		}
	}
	tld := d[strings.LastIndexByte(d, '.')+1:]
	switch tld {
	case "example", "test", "invalid", "localhost", "local":
		return true
	}
	return false
}

// fileExtTLDs are "top-level domains" that are really file extensions
// (logo@2x.png).
var fileExtTLDs = map[string]bool{
	"png": true, "jpg": true, "jpeg": true, "gif": true, "svg": true, "webp": true, "ico": true, "bmp": true,
	"js": true, "mjs": true, "cjs": true, "ts": true, "tsx": true, "jsx": true, "css": true, "scss": true,
	"json": true, "html": true, "htm": true, "txt": true, "pdf": true, "map": true, "woff": true, "woff2": true,
	"ttf": true, "otf": true, "avif": true, "mp4": true, "webm": true, "wasm": true, "lock": true, "yaml": true, "yml": true,
}

// email matches local@domain.tld around the '@' at at.
func (s *scanner) email(at int) {
	buf, n := s.buf, s.n
	ls := at
	for ls > 0 && at-ls < 64 && class[buf[ls-1]]&cLocal != 0 {
		ls--
	}
	if ls > 0 && class[buf[ls-1]]&cLocal != 0 {
		return // a local part longer than 64
	}
	for ls < at && buf[ls] == '.' {
		ls++
	}
	if ls == at || buf[at-1] == '.' {
		return
	}
	if inURLUserInfo(buf, ls) {
		return // URL user info (user:pass@host), not an address
	}
	// Domain: labels of [A-Za-z0-9-], dot-separated.
	i, labels, lastLabel := at+1, 0, at+1
	for i < n && i-at < 254 {
		ls2 := i
		i = runOf(buf, i, n, cDomain, 64)
		if i == ls2 || buf[ls2] == '-' || buf[i-1] == '-' {
			i = ls2
			break
		}
		labels++
		lastLabel = ls2
		if i+1 < n && buf[i] == '.' && class[buf[i+1]]&cDomain != 0 {
			i++
			continue
		}
		break
	}
	if labels < 2 {
		return
	}
	end := i
	tld := buf[lastLabel:end]
	if len(tld) < 2 || len(tld) > 63 || classCount(tld) != 1 || class[tld[0]]&(cLower|cUpper) == 0 || !allLetters(tld) {
		return
	}
	if fileExtTLDs[strings.ToLower(string(tld))] || exemptDomain(string(buf[at+1:end])) {
		return
	}
	if end < n && (buf[end] == ':' || buf[end] == '_') {
		return // scp-style git remote (git@host:repo) or part of an identifier
	}
	s.add(ls, end, CatEmail)
}

// inURLUserInfo reports whether position i is inside the user info of a
// URL: "://" comes before it with nothing that ends an authority between.
func inURLUserInfo(buf []byte, i int) bool {
	for j := i; j > 0 && i-j < 512; j-- {
		c := buf[j-1]
		if c == '/' && j >= 3 && buf[j-2] == '/' && buf[j-3] == ':' {
			return true
		}
		if c == '/' || c == '?' || c == '#' || c <= ' ' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' || c == '\\' {
			return false
		}
	}
	return false
}

func allLetters(b []byte) bool {
	for _, c := range b {
		if class[c]&(cLower|cUpper) == 0 {
			return false
		}
	}
	return true
}

// classCount counts the classes (lower, upper, digit) present in b.
func classCount(b []byte) int {
	var seen uint8
	for _, c := range b {
		seen |= class[c] & (cLower | cUpper | cDigit)
	}
	n := 0
	for ; seen != 0; seen &= seen - 1 {
		n++
	}
	return n
}

// digitRun skips the run of digits at i, and calls numeric when it could
// start an address (1 to 3 digits then a dot) or a card (13 or more
// digits, or 4 then a space or dash). It returns where scanning resumes.
func (s *scanner) digitRun(i int) int {
	buf := s.buf[:s.n]
	j := i
	for j < len(buf) && isDigit(buf[j]) {
		j++
	}
	if i > 0 && isDigit(buf[i-1]) {
		return j // the rest of a run that began before from
	}
	l := j - i
	if s.pol.active(CatIBAN) && l >= 2 && i >= 2 && class[buf[i-1]]&cUpper != 0 && class[buf[i-2]]&cUpper != 0 {
		if end := s.iban(i - 2); end > 0 {
			return end
		}
	}
	if s.pol.active(CatPhone) && (i > 0 && (buf[i-1] == '+' || buf[i-1] == '(') || l == 3 && j < len(buf) && (buf[j] == '-' || buf[j] == '.' || buf[j] == ' ')) {
		if end := s.phone(i); end > 0 {
			return end
		}
	}
	if s.pol.active(CatSSN) && (l == 3 && j < len(buf) && (buf[j] == '-' || buf[j] == ' ') || l == 9) {
		if end := s.ssn(i); end > 0 {
			return end
		}
	}
	if l >= 13 || (j < len(buf) && ((l <= 3 && buf[j] == '.') || (l == 4 && (buf[j] == ' ' || buf[j] == '-' || buf[j] == '.')))) {
		return s.numeric(i)
	}
	return j
}

// numeric reads the numeric token starting at as and matches private IPv4
// addresses and card numbers. It returns the token's end, where scanning
// resumes.
func (s *scanner) numeric(as int) int {
	buf, n := s.buf, s.n
	if as > 0 && isDigit(buf[as-1]) {
		// The rest of a number that began before this window.
		j := as
		for j < n && isDigit(buf[j]) {
			j++
		}
		return j
	}
	// Fast path: most digit runs are neither an address (a run followed by
	// a dot) nor a card (13 or more digits, or 4 then a separator).
	r := as
	for r < n && r-as < 20 && isDigit(buf[r]) {
		r++
	}
	if r < n && !(buf[r] == '.' || ((buf[r] == ' ' || buf[r] == '-') && (r-as == 4))) && r-as < 13 {
		for r < n && isDigit(buf[r]) {
			r++
		}
		return r
	}
	if r == n && r-as < 13 {
		return r
	}
	var groups [20]int
	ng, sep := 0, byte(0)
	j := as
	for j < n && j-as < 48 && ng < len(groups) {
		g := j
		for j < n && isDigit(buf[j]) && j-g < 20 {
			j++
		}
		groups[ng] = j - g
		ng++
		if j+1 < n && isDigit(buf[j+1]) && (buf[j] == '.' || buf[j] == ' ' || buf[j] == '-') && (sep == 0 || sep == buf[j]) {
			sep = buf[j]
			j++
			continue
		}
		break
	}
	end := j
	for end < n && isDigit(buf[end]) {
		end++ // an over-long run: not a match, skip it whole
	}
	if end != j {
		return end
	}
	prev := byte(' ')
	if as > 0 {
		prev = buf[as-1]
	}
	next := byte(' ')
	if end < n {
		next = buf[end]
	}
	switch {
	case sep == '.' && ng == 4 && max(groups[0], groups[1], groups[2], groups[3]) <= 3 && s.pol.active(CatInternalIP):
		if isAlnum(prev) || prev == '.' || prev == '-' || prev == '_' {
			return end
		}
		if isAlnum(next) || next == '-' || next == '_' || (next == '.' && end+1 < n && isAlnum(buf[end+1])) {
			return end
		}
		var oct [4]int
		pos := as
		for k := 0; k < 4; k++ {
			if groups[k] > 3 {
				return end
			}
			v := 0
			for _, c := range buf[pos : pos+groups[k]] {
				v = v*10 + int(c-'0')
			}
			if v > 255 {
				return end
			}
			oct[k] = v
			pos += groups[k] + 1
		}
		if oct[0] == 10 || (oct[0] == 172 && oct[1] >= 16 && oct[1] <= 31) || (oct[0] == 192 && oct[1] == 168) {
			s.add(as, end, CatInternalIP)
		}
	case (sep != '.' || ng == 4 && groups[0] == 4 && groups[1] == 4 && groups[2] == 4 && groups[3] == 4) && s.pol.active(CatCreditCard) && end-as >= 13:
		// (Dots only as 4111.1111.1111.1111: an address's groups are
		// never four digits long.)
		if isAlnum(prev) || prev == '.' || prev == '_' || prev == '-' || prev == '+' {
			return end
		}
		if isAlnum(next) || next == '_' || (next == '.' && end+1 < n && isDigit(buf[end+1])) || (next == '-' && end+1 < n && isAlnum(buf[end+1])) {
			return end
		}
		if cardNumber(buf[as:end], groups[:ng]) {
			s.add(as, end, CatCreditCard)
		}
	}
	return end
}

// cardNumber reports a Luhn-valid number of 13 to 19 digits with a known
// issuer prefix and a usual grouping (none, fours, or Amex/Diners 4-6-x).
func cardNumber(tok []byte, groups []int) bool {
	digits := make([]byte, 0, 19)
	for _, c := range tok {
		if isDigit(c) {
			digits = append(digits, c)
		}
	}
	l := len(digits)
	if l < 13 || l > 19 {
		return false
	}
	if len(groups) > 1 {
		fours := true
		for _, g := range groups[:len(groups)-1] {
			if g != 4 {
				fours = false
			}
		}
		amex := len(groups) == 3 && groups[0] == 4 && groups[1] == 6 && (groups[2] == 5 || groups[2] == 4)
		if !(fours && groups[len(groups)-1] <= 4) && !amex {
			return false
		}
	}
	if !issuer(string(digits), l) {
		return false
	}
	sum := 0
	for i := 0; i < l; i++ {
		d := int(digits[l-1-i] - '0')
		if i%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

func issuer(d string, l int) bool {
	p2 := int(d[0]-'0')*10 + int(d[1]-'0')
	p4 := p2*100 + int(d[2]-'0')*10 + int(d[3]-'0')
	switch {
	case d[0] == '4':
		return l == 13 || l == 16 || l == 19
	case p2 >= 51 && p2 <= 55, p4 >= 2221 && p4 <= 2720:
		return l == 16
	case p2 == 34 || p2 == 37:
		return l == 15
	case p4 == 6011, p2 == 65, p4 >= 6440 && p4 <= 6499, p2 == 62:
		return l >= 16
	case p2 == 36 || p2 == 38 || p2 == 39, p4 >= 3000 && p4 <= 3059:
		return l >= 14
	case p4 >= 3528 && p4 <= 3589:
		return l >= 16
	}
	return false
}

// homePath matches the user name in /Users/<name> and /home/<name>.
func (s *scanner) homePath(h hit) {
	buf, as, ae := s.buf, h.as, h.ae
	lit := string(buf[as:ae])
	if lit != "/Users/" && lit != "/home/" {
		return
	}
	if as > 0 {
		p := buf[as-1]
		url := p == '/' && as >= 3 && buf[as-2] == '/' && buf[as-3] == ':'
		if !url && (isAlnum(p) || strings.IndexByte("./-_%~", p) >= 0) {
			return
		}
	}
	s.homeName(ae, h.cat)
}

// winHomePath matches the user name in C:\Users\<name>.
func (s *scanner) winHomePath(h hit) {
	as := h.as
	if as == 0 || (s.buf[as-1] != ':' && s.buf[as-1] != '\\') {
		return
	}
	s.homeName(h.ae, h.cat)
}

// homeName matches the user name at i as a finding of category c.
func (s *scanner) homeName(i int, c Category) {
	buf, n := s.buf, s.n
	end := runOf(buf, i, n, cIdent, 65)
	if end == i || end-i > 64 {
		return
	}
	if end < n && (isAlnum(buf[end]) || buf[end] == '@' || buf[end] == '$') {
		return
	}
	switch string(buf[i:end]) {
	case "Shared", ".", "..":
		return
	}
	s.add(i, end, c)
}

// secretKeySuffixes may follow a secret keyword and still name a secret
// (secret_key, password_value).
var secretKeySuffixes = []string{"", "_key", "key", "-key", ".key", "_value", "-value"}

// assignment matches `name = value`, `name: value`, `"name": "value"`,
// `name := value` and `name => value` where name ends with a secret
// keyword, and redacts a high-entropy value.
func (s *scanner) assignment(h hit) {
	buf, n, as, ae := s.buf, s.n, h.as, h.ae
	k := runOf(buf, ae, n, cIdent, 17)
	if !slices.Contains(secretKeySuffixes, strings.ToLower(string(buf[ae:k]))) {
		return
	}
	ns := as
	for ns > 0 && as-ns < 64 && class[buf[ns-1]]&cIdent != 0 {
		ns--
	}
	if notSecretName(buf[ns:k]) {
		return
	}
	if k < n && (buf[k] == '"' || buf[k] == '\'') {
		k++
	}
	k = skipBlanks(buf, k, n)
	if k >= n {
		return
	}
	switch buf[k] {
	case '=':
		if k+1 < n && (buf[k+1] == '=' || buf[k+1] == '~') {
			return
		}
		if k+1 < n && buf[k+1] == '>' {
			k++
		}
	case ':':
		if k+1 < n && buf[k+1] == ':' {
			return
		}
		if k+1 < n && buf[k+1] == '=' {
			k++
		}
	default:
		return
	}
	k = skipBlanks(buf, k+1, n)
	if k >= n {
		return
	}
	vs, ve := k, k
	if q := buf[k]; q == '"' || q == '\'' || q == '`' {
		vs = k + 1
		ve = vs
		for ve < n && buf[ve] != q && buf[ve] != '\n' && ve-vs <= 256 {
			ve++
		}
		if ve >= n || buf[ve] != q {
			return
		}
	} else {
		for ve < n && ve-vs <= 256 {
			c := buf[ve]
			if c <= ' ' || strings.IndexByte(",;)}&'\"<>`", c) >= 0 {
				break
			}
			ve++
		}
	}
	if secretValue(buf[vs:ve]) {
		s.add(vs, ve, h.cat)
	}
}

func skipBlanks(buf []byte, i, n int) int {
	for j := 0; i < n && (buf[i] == ' ' || buf[i] == '\t') && j < 8; j++ {
		i++
	}
	return i
}

// secretValue decides whether a value assigned to a secret-sounding name
// is itself a secret: 8 to 256 bytes without blanks, not a placeholder or
// a reference (${VAR}, process.env.X, getToken()), with at least two of
// lower case, upper case and digits (letters alone must be 20 or more),
// and close to the highest entropy its length allows.
func secretValue(v []byte) bool {
	if len(v) < 8 || len(v) > 256 || placeholder(v) {
		return false
	}
	letters := true
	for _, c := range v {
		if c <= ' ' || c == 0x7f || c == '(' || c == ')' {
			return false
		}
		if class[c]&(cLower|cUpper) == 0 {
			letters = false
		}
	}
	if dottedIdent(v) {
		return false
	}
	cc := classCount(v)
	if cc < 2 || (letters && len(v) < 20) {
		return false
	}
	// Near the highest entropy its length allows: random values have
	// few repeated characters; test-token-123 or Password2024 have many.
	want := 0.85 * math.Log2(float64(min(len(v), 64)))
	want = min(max(want, 2.9), 4.5)
	if len(v) >= 16 && allHex(v) {
		// Hex carries 4 bits a character at most: a random hex token
		// of 32 or 40 digits has about 3.8.
		want = 0.85 * 4
	}
	return entropy(v) >= want
}

// allHex reports a value made of hex digits only.
func allHex(v []byte) bool {
	for _, c := range v {
		if !isHex(c) {
			return false
		}
	}
	return true
}

// dottedIdent reports a.b.c identifiers (process.env.API_KEY).
func dottedIdent(v []byte) bool {
	if bytes.IndexByte(v, '.') < 0 {
		return false
	}
	for _, part := range bytes.Split(v, []byte(".")) {
		if len(part) == 0 || isDigit(part[0]) {
			return false
		}
		for _, c := range part {
			if !isAlnum(c) && c != '_' {
				return false
			}
		}
	}
	return true
}

// notSecretNames end names that hold a token that is no secret: a
// pagination cursor (pageToken, next_page_token), a continuation or sync
// marker, a count (max_tokens), a CSRF form token's field name aside.
var notSecretNames = []string{"pagetoken", "nexttoken", "continuationtoken", "synctoken", "resumetoken", "cursortoken", "prevtoken", "previoustoken", "maxtokens", "tokencount", "tokenlimit", "tokentype", "tokenurl", "tokenendpoint", "secretname", "secretref", "secretkeyref", "secretid"}

// notSecretName reports a secret-sounding name that names no secret.
func notSecretName(k []byte) bool {
	l := strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' {
			return -1
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, string(k))
	for _, w := range notSecretNames {
		if strings.HasSuffix(l, w) {
			return true
		}
	}
	return false
}

// secretKeyName reports whether a JSON key or form field names a secret:
// it ends with a secret keyword, optionally followed by one of
// secretKeySuffixes (db_password, apiKey, client_secret, secret_key).
func secretKeyName(k []byte) bool {
	if len(k) == 0 || len(k) > 64 || notSecretName(k) {
		return false
	}
	l := strings.ToLower(string(k))
	for _, kw := range assignKeywords {
		i := strings.LastIndex(l, kw.lit)
		if i < 0 {
			continue
		}
		if slices.Contains(secretKeySuffixes, l[i+len(kw.lit):]) {
			return true
		}
	}
	return false
}

// anchorAt checks the anchors whose key is the 4 bytes at i.
//
//go:noinline
func (s *scanner) anchorAt(i int) {
	buf := s.buf[:s.n]
	for _, r := range s.e.anchors.table.lookup(binary.LittleEndian.Uint32(buf[i:])) {
		as := i - r.off
		if as >= 0 && s.pol.active(r.def.rec.cat) && !(s.pol.shapes && r.def.rec.context) && matchLit(buf, as, r.def) {
			r.def.rec.check(s, hit{lit: r.def.lit, as: as, ae: as + len(r.def.lit), cat: r.def.rec.cat})
		}
	}
}

// tokenEdge reports whether the bytes around [as, end) end a token there
// (no letter, digit, or joining punctuation on either side).
func (s *scanner) tokenEdge(as, end int) bool {
	if as > 0 {
		p := s.buf[as-1]
		if isAlnum(p) || p == '_' || p == '-' || p == '.' || p == '/' || p == '+' {
			return false
		}
	}
	if end < s.n {
		c := s.buf[end]
		if isAlnum(c) || c == '_' || c == '-' || (c == '.' && end+1 < s.n && isDigit(s.buf[end+1])) || c == '/' {
			return false
		}
	}
	return true
}

// ssn matches AAA-GG-SSSS at as with the ranges the SSA issues (area not
// 000, 666 or 9xx; group not 00; serial not 0000), except numbers
// published as examples (078-05-1120, 123-45-6789).
func (s *scanner) ssn(as int) int {
	b := s.buf
	var v [9]byte
	end, sep := as, byte(0)
	for k := 0; k < 9; k++ {
		if k == 3 || k == 5 {
			c := byte(0)
			if end < s.n {
				c = b[end]
			}
			if k == 3 && (c == '-' || c == ' ') {
				sep = c
			}
			if sep != 0 {
				if c != sep {
					return -1
				}
				end++
			}
		}
		if end >= s.n || !isDigit(b[end]) {
			return -1
		}
		v[k] = b[end]
		end++
	}
	if !s.tokenEdge(as, end) {
		return -1
	}
	d := string(v[:])
	if d[:3] == "000" || d[:3] == "666" || d[0] == '9' || d[3:5] == "00" || d[5:] == "0000" || d == "078051120" || d == "123456789" {
		return -1
	}
	// Written without dashes, nine digits are an SSN only next to a
	// word that says so.
	if sep != '-' && !s.ssnContext(as) {
		return -1
	}
	s.add(as, end, CatSSN)
	return end
}

// ssnWords are the words that, just before nine digits, say they are an
// SSN.
var ssnWords = []string{"ssn", "social security", "soc sec", "ss#", "ss #"}

// ssnContext reports an SSN word within 32 bytes before as.
func (s *scanner) ssnContext(as int) bool {
	l := strings.Map(func(r rune) rune {
		if r == '_' || r == '-' {
			return ' '
		}
		return r
	}, strings.ToLower(string(s.buf[max(0, as-32):as])))
	for _, w := range ssnWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	return false
}

// ibanLengths are the IBAN lengths of the countries that use one.
var ibanLengths = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
	"CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24,
	"FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21,
	"HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LI": 21,
	"LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30,
	"NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
	"SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}

// iban matches an IBAN at as: a country code, two check digits and the
// country's number of letters and digits, written together or in groups
// of four separated by single spaces, whose mod-97 check holds.
func (s *scanner) iban(as int) int {
	b := s.buf
	want, ok := ibanLengths[string(b[as:as+2])]
	if !ok {
		return -1
	}
	var chars [34]byte
	n, i := 0, as
	for i < s.n && n < want {
		c := b[i]
		switch {
		case isDigit(c) || class[c]&cUpper != 0:
			chars[n] = c
			n++
			i++
		case c == ' ' && n%4 == 0 && n > 0 && i+1 < s.n && isAlnum(b[i+1]):
			i++
		default:
			return -1
		}
	}
	if n != want || !s.tokenEdge(as, i) {
		return -1
	}
	// Move the first four characters to the end; letters count as 10–35.
	rem := 0
	for k := 0; k < n; k++ {
		c := chars[(k+4)%n]
		if isDigit(c) {
			rem = (rem*10 + int(c-'0')) % 97
		} else {
			rem = (rem*100 + int(c-'A'+10)) % 97
		}
	}
	if rem != 1 {
		return -1
	}
	s.add(as, i, CatIBAN)
	return i
}

// phoneWords are the words that, just before a number, say it is a phone
// number.
var phoneWords = []string{"phone", "tel", "mobile", "cell", "call", "fax", "whatsapp", "sms", "contact"}

// phone matches a phone number whose first digit is at i: E.164 (+ then
// 8 to 15 digits, in groups separated by single spaces, dots or dashes,
// parentheses around one group) anywhere; a NANP number ((AAA) EEE-NNNN,
// AAA-EEE-NNNN, AAA.EEE.NNNN) as a standalone token of exactly that
// shape, so dates, versions, ISBNs and UUIDs are not taken for one, and
// a dashed one not after an id's word (notPhoneWords) or a '#'.
func (s *scanner) phone(i int) int {
	b := s.buf
	as := i
	plus := i > 0 && b[i-1] == '+'
	if plus {
		as = i - 1
	} else if i > 0 && b[i-1] == '(' {
		as = i - 1
		if as > 0 && b[as-1] == '+' {
			as--
			plus = true
		}
	}
	digits, groups, j := 0, 0, i
	var first, starts [3]int
	for j < s.n && digits < 16 {
		g := j
		if groups < 3 {
			starts[groups] = g
		}
		for j < s.n && isDigit(b[j]) {
			j++
		}
		if j == g {
			break
		}
		if groups < 3 {
			first[groups] = j - g
		}
		groups++
		digits += j - g
		if j < s.n && b[j] == ')' {
			j++
			if j < s.n && b[j] == ' ' {
				j++
			}
			continue
		}
		if j+1 < s.n && (b[j] == ' ' || b[j] == '-' || b[j] == '.') && (isDigit(b[j+1]) || b[j+1] == '(') {
			j++
			if b[j] == '(' {
				j++
			}
			continue
		}
		break
	}
	end := j
	for end > i && !isDigit(b[end-1]) {
		end--
	}
	if !s.tokenEdge(as, end) {
		return -1
	}
	if plus {
		if digits < 8 || digits > 15 || b[i] == '0' {
			return -1
		}
		s.add(as, end, CatPhone)
		return end
	}
	// NANP: 3-3-4, area and exchange not starting with 0 or 1, and not
	// the 555-01xx numbers reserved for fiction.
	if digits != 10 || groups != 3 || first != [3]int{3, 3, 4} || b[i] < '2' || b[starts[1]] < '2' {
		return -1
	}
	// "(415) 555-2671" and "415.839.2271" say they are phone numbers by
	// themselves; 415-839-2271 too, unless a word before it says it is
	// an id (order, ticket, part …), it follows a '#', or its area code
	// or exchange is an N11 service code (no number has one).
	paren := b[as] == '(' && b[i+3] == ')'
	dotted := b[i+3] == '.' && b[starts[1]+3] == '.'
	if !paren && !dotted {
		// The nearer word decides: call Dana 415-…, order 415-….
		ph, id := s.phoneContext(as), s.notPhoneContext(as)
		if id > ph || ph < 0 && (as > 0 && b[as-1] == '#' || b[i+1] == '1' && b[i+2] == '1' || b[starts[1]+1] == '1' && b[starts[1]+2] == '1') {
			return -1
		}
	}
	num := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, string(b[as:end]))
	if num[3:6] == "555" && num[6:8] == "01" {
		return -1
	}
	s.add(as, end, CatPhone)
	return end
}

// notPhoneContext returns where the last word that says the number after
// it is an id (notPhoneWords) starts in the 32 bytes before as, as a whole
// word (or its plural: "department" is no "part"), or -1.
func (s *scanner) notPhoneContext(as int) int {
	l := strings.ToLower(string(s.buf[max(0, as-32):as]))
	last := -1
	for _, w := range notPhoneWords {
		for k := 0; ; {
			i := strings.Index(l[k:], w)
			if i < 0 {
				break
			}
			i += k
			e := i + len(w)
			if e < len(l) && l[e] == 's' {
				e++
			}
			if (i == 0 || class[l[i-1]]&(cLower|cUpper) == 0) && (e == len(l) || class[l[e]]&(cLower|cUpper) == 0) {
				last = max(last, i)
			}
			k = i + 1
		}
	}
	return last
}

// phoneContext returns where the last phone word starts in the 32 bytes
// before as, or -1.
func (s *scanner) phoneContext(as int) int {
	l := strings.ToLower(string(s.buf[max(0, as-32):as]))
	last := -1
	for _, w := range phoneWords {
		last = max(last, strings.LastIndex(l, w))
	}
	return last
}

// atForms are the spellings of '@' in an address written to dodge a
// scanner; dotForms those of '.'. A plain " at " counts only with a
// spelled-out dot after it (look at github.com is English).
var (
	atForms  = []string{"[at]", "(at)", "{at}", "<at>", " at "}
	dotForms = []string{"[dot]", "(dot)", "{dot}", "<dot>", " dot ", "[.]", "(.)", "{.}", "."}
)

// hasFoldAt reports whether buf[i:] starts with w, ignoring case.
func hasFoldAt(buf []byte, i int, w string) bool {
	return i >= 0 && i+len(w) <= len(buf) && bytes.EqualFold(buf[i:i+len(w)], []byte(w))
}

// dodgedEmail matches name at domain dot com, name[at]domain[.]com and
// the like, from a hit on a bracketed at or on " dot ".
func (s *scanner) dodgedEmail(h hit) {
	buf := s.buf[:s.n]
	// Find the at: the hit itself, or the last one up to 96 bytes before
	// a " dot ".
	atS, atE := -1, -1
	if h.lit != " dot " {
		atS, atE = h.as, h.ae
	} else {
		for k := h.as - 1; k >= max(0, h.as-96) && atS < 0; k-- {
			for _, w := range atForms {
				if hasFoldAt(buf, k, w) {
					atS, atE = k, k+len(w)
					break
				}
			}
		}
		if atS < 0 {
			return
		}
	}
	// The local part before it.
	ls := atS
	for ls > 0 && buf[ls-1] == ' ' && atS-ls < 2 {
		ls--
	}
	le := ls
	for ls > 0 && le-ls < 64 && class[buf[ls-1]]&cLocal != 0 {
		ls--
	}
	if ls == le || (ls > 0 && class[buf[ls-1]]&cLocal != 0) || buf[ls] == '.' {
		return
	}
	// The domain: labels joined by dots, plain or spelled out.
	i := atE
	for i < len(buf) && buf[i] == ' ' && i-atE < 2 {
		i++
	}
	dodged := !bytes.EqualFold(bytes.TrimSpace(buf[atS:atE]), []byte("at"))
	var dom []byte
	labels, lastLabel, end := 0, 0, -1
	for labels < 10 {
		st := i
		i = runOf(buf, i, len(buf), cDomain, 64)
		if i == st {
			break
		}
		labels++
		lastLabel = len(dom)
		dom = append(dom, buf[st:i]...)
		end = i
		matched := false
		for _, w := range dotForms {
			// A bracketed dot may have a blank either side.
			j := i
			if w[0] != ' ' && w != "." && j < len(buf) && buf[j] == ' ' {
				j++
			}
			if !hasFoldAt(buf, j, w) {
				continue
			}
			k := j + len(w)
			if w[0] != ' ' && w != "." && k < len(buf) && buf[k] == ' ' {
				k++
			}
			if k < len(buf) && class[buf[k]]&cDomain != 0 {
				dodged = dodged || w != "."
				i = k
				dom = append(dom, '.')
				matched = true
				break
			}
		}
		if !matched {
			break
		}
	}
	if labels < 2 || !dodged || end < 0 {
		return
	}
	tld := dom[lastLabel:]
	if len(tld) < 2 || len(tld) > 24 || !allLetters(tld) || (end < len(buf) && class[buf[end]]&cDomain != 0) {
		return
	}
	if fileExtTLDs[strings.ToLower(string(tld))] || exemptDomain(string(dom)) {
		return
	}
	s.add(ls, end, h.cat)
}

// internalHost matches a host name under an internal suffix
// (db1.prod.internal, build.corp, printer.local), from a hit on the
// suffix: one or more labels before it, nothing of a name after it.
func (s *scanner) internalHost(h hit) {
	buf, as, ae := s.buf[:s.n], h.as, h.ae
	if !hasFoldAt(buf, as, h.lit) {
		return
	}
	if l := h.lit[len(h.lit)-1]; class[l]&cAlnum == 0 {
		ae-- // ".lan" and the byte that ends the name
	}
	if ae < len(buf) && (class[buf[ae]]&cDomain != 0 || buf[ae] == '_' || buf[ae] == '.' && ae+1 < len(buf) && class[buf[ae+1]]&cDomain != 0) {
		return // localhost, .corporate, .internal.example.com
	}
	st := as
	for st > 0 && as-st < 253 && (class[buf[st-1]]&cDomain != 0 || buf[st-1] == '.') {
		st--
	}
	for st < as && (buf[st] == '.' || buf[st] == '-') {
		st++
	}
	if st == as || buf[as-1] == '.' || buf[as-1] == '-' {
		return
	}
	if st > 0 && (buf[st-1] == '_' || buf[st-1] == '@' || buf[st-1] == '$') {
		return // an identifier (x_y.local), an address's domain, a variable
	}
	s.add(st, ae, h.cat)
}

// ulaAddress matches an IPv6 unique local address (fc00::/7, written
// fdXX:…) from a hit on its first group.
func (s *scanner) ulaAddress(h hit) {
	buf, as := s.buf[:s.n], h.as
	if as > 0 && (isHex(buf[as-1]) || buf[as-1] == ':' || class[buf[as-1]]&cAlnum != 0) {
		return
	}
	e := as
	for e < len(buf) && e-as < 45 && (isHex(buf[e]) || buf[e] == ':') {
		e++
	}
	if e < len(buf) && (class[buf[e]]&cAlnum != 0 || buf[e] == '.') {
		return
	}
	for e > as && buf[e-1] == ':' && !(e-as >= 2 && buf[e-2] == ':') {
		e-- // a trailing colon (fd12::1: in prose)
	}
	a, err := netip.ParseAddr(string(buf[as:e]))
	if err != nil || !a.Is6() || a.As16()[0]&0xFE != 0xFC {
		return
	}
	s.add(as, e, h.cat)
}
