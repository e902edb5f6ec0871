package dlp

import (
	"strconv"
	"strings"
)

// Single-label host names (buildbox, ldap01) are internal by nature: no
// public name has one label. A lone word is everywhere in text, so these
// rows look only where a word is a host: a URL's authority, a name
// followed by a well-known service port, an HTTP Host header line, and
// the host of an ssh or scp-style git remote. Labels that name no one's
// network (localhost, documentation placeholders, the default service
// names of common software: notsecret.go) pass.

// urlSchemes are the schemes whose URLs name a network host; others
// (file:, s3://bucket, chrome://settings, vscode://ext) name something
// else.
var urlSchemes = []string{"http", "https", "ws", "wss", "ftp", "ftps", "sftp", "ssh", "git", "git+ssh", "ssh+git",
	"svn", "svn+ssh", "ldap", "ldaps", "smb", "nfs", "rsync", "redis", "rediss", "postgres", "postgresql", "mysql",
	"mariadb", "mongodb", "amqp", "amqps", "mqtt", "mqtts", "nats", "kafka", "tcp", "udp", "grpc", "grpcs", "telnet",
	"rdp", "vnc", "smtp", "smtps", "imap", "imaps", "pop3", "pop3s"}

// urlSchemeAnchors are "<scheme>://" for each scheme, in lower and in
// upper case (HTTP://; compared byte for byte, cheaper than folding),
// keyed on the scheme's first bytes: a key is shared by two schemes at
// most (http, https), so a URL costs one or two literal compares.
func urlSchemeAnchors() []anchor {
	var out []anchor
	for _, s := range urlSchemes {
		out = append(out, anchor{lit: s + "://"}, anchor{lit: strings.ToUpper(s) + "://"})
	}
	return out
}

// servicePorts are the ports after which a bare name:port is taken for a
// host (ldap01:389, buildbox:8443): distinctive service ports only, not
// the round numbers that are durations and sizes as often (3000, 5000),
// nor those that are image tags and line numbers (node:22, :80).
var servicePorts = []int{389, 443, 636, 1433, 1521, 2049, 2181, 2375, 2376, 2379, 3128, 3306, 3389, 4443, 5432,
	5601, 5672, 5900, 5984, 6379, 6443, 7001, 8008, 8080, 8081, 8088, 8200, 8443, 8500, 8888, 9042, 9090, 9092,
	9200, 9300, 9418, 10250, 11211, 15672, 27017}

// hostEnds are the bytes that may end a host (or a port) in text.
const hostEnds = " \t\r\n/\"'`,;)]}>?#"

// servicePortAnchors are ":<port>"; a three-digit port, too short for two
// keys of its own, is registered with each byte that may end it (a
// sentence's full stop too).
func servicePortAnchors() []anchor {
	var out []anchor
	for _, p := range servicePorts {
		lit := ":" + strconv.Itoa(p)
		if len(lit) >= 5 {
			out = append(out, anchor{lit: lit})
			continue
		}
		for _, c := range hostEnds + "." {
			out = append(out, anchor{lit: lit + string(c)})
		}
	}
	return out
}

// sshAnchors start the commands and remotes whose user@host names a host.
var sshAnchors = append(lits(0, cDomain, "git@", "ssh ", "scp "), lits(0, 0, "sftp ", "rsync ")...)

// hostLabelAt reads a single-label host name at buf[i:]: 1 to 63 of
// [A-Za-z0-9-], starting and ending with a letter or digit, holding a
// letter, not followed by a byte that would make it longer or dotted
// (db1.corp is the internal-host row's). It returns the end, or -1.
func hostLabelAt(buf []byte, i int) int {
	e := i
	for e < len(buf) && e-i <= 63 && class[buf[e]]&cDomain != 0 {
		e++
	}
	if e == i || e-i > 63 || buf[i] == '-' || buf[e-1] == '-' || !hasLetter(buf[i:e]) {
		return -1
	}
	if e < len(buf) && (buf[e] == '_' || buf[e] == '.' && e+1 < len(buf) && class[buf[e+1]]&cDomain != 0) {
		return -1
	}
	if genericHostLabel(buf[i:e]) {
		return -1
	}
	return e
}

func hasLetter(b []byte) bool {
	for _, c := range b {
		if class[c]&(cLower|cUpper) != 0 {
			return true
		}
	}
	return false
}

// hostEndByte marks the bytes of hostEnds.
var hostEndByte = func() (t [256]bool) {
	for i := 0; i < len(hostEnds); i++ {
		t[hostEnds[i]] = true
	}
	return t
}()

// hostEnd reports whether buf[i] may end a host name (or the text ends).
func hostEnd(buf []byte, i int) bool {
	return i >= len(buf) || hostEndByte[buf[i]]
}

// portEnd returns the end of ":digits" at buf[i:] (a port of 1 to 5
// digits), or i when there is none.
func portEnd(buf []byte, i int) int {
	if i >= len(buf) || buf[i] != ':' {
		return i
	}
	e := i + 1
	for e < len(buf) && e-i <= 5 && isDigit(buf[e]) {
		e++
	}
	if e == i+1 || e-i > 6 {
		return i
	}
	return e
}

// urlHostLabel matches the host of scheme://[userinfo@]label[:port]
// when it is a single label.
func (s *scanner) urlHostLabel(h hit) {
	buf := s.buf[:s.n]
	// Most URLs name a dotted host: done at its first dot.
	st := h.ae
	i := st
	for i < len(buf) && i-st <= 63 && class[buf[i]]&cDomain != 0 {
		i++
	}
	if i < len(buf) && buf[i] == '.' {
		return
	}
	if h.as > 0 {
		if p := buf[h.as-1]; class[p]&cIdent != 0 || p == '+' {
			return // a longer scheme (xhttp://)
		}
	}
	if i < len(buf) && buf[i] == ':' {
		i = portEnd(buf, i)
	}
	if i < len(buf) && !hostEnd(buf, i) {
		// user:password@host: the host follows the authority's last
		// '@'; the authority ends at the first / ? # or a byte no URL
		// holds.
		for i := h.ae; i < len(buf) && i-h.ae < 256; i++ {
			c := buf[i]
			if c == '@' {
				st = i + 1
				continue
			}
			if c <= ' ' || c == '/' || c == '?' || c == '#' || c == '"' || c == '\'' || c == '`' || c == '<' || c == '>' {
				break
			}
		}
	}
	e := hostLabelAt(buf, st)
	if e < 0 || !hostEnd(buf, portEnd(buf, e)) {
		return
	}
	s.add(st, e, h.cat)
}

// portHostLabel matches label:port for a well-known service port, the
// label lower case and standing alone (after a blank, '=', a quote, '('
// or ','): ldap01:389, buildbox:8443.
func (s *scanner) portHostLabel(h hit) {
	buf := s.buf[:s.n]
	pe := h.as + 1
	for pe < len(buf) && isDigit(buf[pe]) {
		pe++
	}
	if pe-h.as > 6 || !hostEnd(buf, pe) && !(buf[pe] == '.' && (pe+1 == len(buf) || !isAlnum(buf[pe+1]))) {
		return // a longer number, a version (x:8080.1), a time (a:8080:12)
	}
	st := h.as
	for st > 0 && h.as-st <= 63 && (class[buf[st-1]]&(cLower|cDigit) != 0 || buf[st-1] == '-') {
		st--
	}
	if st == h.as {
		return
	}
	if st > 0 {
		switch buf[st-1] {
		case ' ', '\t', '\n', '\r', '=', '"', '\'', '`', '(', ',', '>':
		default:
			return // a path, an identifier, a slice (x[lo:443]), a URL (its own row), user@host
		}
	}
	if e := hostLabelAt(buf, st); e == h.as {
		s.add(st, e, h.cat)
	}
}

// headerHostLabel matches the value of a Host header line (Host: buildbox,
// as curl -v prints it too: "> Host: buildbox:8080").
func (s *scanner) headerHostLabel(h hit) {
	buf := s.buf[:s.n]
	if h.as > 0 && buf[h.as-1] != '\n' && !(h.as >= 2 && string(buf[h.as-2:h.as]) == "> " && (h.as == 2 || buf[h.as-3] == '\n')) {
		return
	}
	e := hostLabelAt(buf, h.ae)
	if e < 0 {
		return
	}
	if pe := portEnd(buf, e); pe == len(buf) || buf[pe] == '\r' || buf[pe] == '\n' {
		s.add(h.ae, e, h.cat)
	}
}

// sshHostLabel matches the host of user@host in an ssh, scp, sftp or
// rsync command line (ssh deploy@buildbox, scp f ops@gitbox:/srv) and of
// an scp-style git remote (git@gitbox:team/app.git).
func (s *scanner) sshHostLabel(h hit) {
	buf := s.buf[:s.n]
	if h.as > 0 {
		if p := buf[h.as-1]; class[p]&cIdent != 0 || p == '/' || p == '@' {
			return // a longer word (legit@, bssh ), a path
		}
	}
	if h.lit == "git@" {
		if e := hostLabelAt(buf, h.ae); e > 0 && e < len(buf) && buf[e] == ':' {
			s.add(h.ae, e, h.cat)
		}
		return
	}
	// The rest of the command: user@host words up to the line's (or the
	// command's) end.
	for i := h.ae; i < len(buf) && i-h.ae < 256; i++ {
		c := buf[i]
		if c == '\n' || c == ';' || c == '|' || c == '&' {
			return
		}
		if c != '@' || i == h.ae || class[buf[i-1]]&cIdent == 0 {
			continue
		}
		if e := hostLabelAt(buf, i+1); e > 0 && (hostEnd(buf, e) || buf[e] == ':') {
			s.add(i+1, e, h.cat)
		}
	}
}
