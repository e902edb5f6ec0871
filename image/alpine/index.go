package alpine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// IndexFile is an index's file name in a repository directory.
const IndexFile = "APKINDEX.tar.gz"

// maxIndexDownload bounds a downloaded, compressed index.
const maxIndexDownload = 64 << 20

// Package is one index record.
type Package struct {
	Name      string   // P
	Version   string   // V
	Arch      string   // A
	Size      int64    // S: the .apk's size in bytes
	Installed int64    // I
	Checksum  string   // C: "Q1" + base64(SHA-1 of the control member)
	Depends   []string // D, space-separated; "!name" is a conflict
	Provides  []string // p: "name" or "name=version"
	Origin    string   // o
	BuildTime int64    // t
	Priority  int      // k: provider_priority
	// Description is T, shown to people only; nothing trusts it.
	Description string
	Repo        string // the repository the record came from
}

// File is the package's file name in its repository.
func (p *Package) File() string { return p.Name + "-" + p.Version + ".apk" }

func (p *Package) String() string { return p.Name + "-" + p.Version }

// controlSHA1 decodes Checksum.
func (p *Package) controlSHA1() ([]byte, error) {
	b64, ok := strings.CutPrefix(p.Checksum, "Q1")
	if !ok {
		return nil, fmt.Errorf("%w: %s: checksum %q is not Q1<base64 sha1>", ErrFormat, p, p.Checksum)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != 20 {
		return nil, fmt.Errorf("%w: %s: checksum %q is not Q1<base64 sha1>", ErrFormat, p, p.Checksum)
	}
	return b, nil
}

// Index is one verified repository index.
type Index struct {
	Repo        string
	Arch        string
	Description string // DESCRIPTION, e.g. "v3.24.0-12-gabc"
	Packages    []*Package
}

// ReadIndex verifies an APKINDEX.tar.gz stream against keys for arch and
// parses it. Nothing of the index is parsed before its signature holds.
func ReadIndex(file, repo, arch string, r io.Reader, keys *Keyring) (*Index, error) {
	s := newAPKStream(file, r)
	sigs, err := s.signature()
	if err != nil {
		return nil, err
	}
	got, sum1, sum256, err := s.files("index", maxIndex, maxIndex, "APKINDEX", "DESCRIPTION")
	if err != nil {
		return nil, err
	}
	if err := keys.verify(file, arch, sigs, sum1, sum256); err != nil {
		return nil, err
	}
	if !s.mr.atEOF() {
		return nil, fmt.Errorf("%s: %w: data after the index member", file, ErrFormat)
	}
	raw, ok := got["APKINDEX"]
	if !ok {
		return nil, fmt.Errorf("%s: %w: no APKINDEX entry", file, ErrFormat)
	}
	pkgs, err := parseIndex(file, raw)
	if err != nil {
		return nil, err
	}
	for _, p := range pkgs {
		p.Repo = repo
		if p.Arch != arch && p.Arch != "noarch" {
			return nil, fmt.Errorf("%s: %w: %s is for %s, index is for %s", file, ErrFormat, p, p.Arch, arch)
		}
	}
	return &Index{Repo: repo, Arch: arch, Description: strings.TrimSpace(string(got["DESCRIPTION"])), Packages: pkgs}, nil
}

// parseIndex parses APKINDEX text: records of "X:value" lines separated
// by blank lines. Unknown fields are ignored.
func parseIndex(file string, raw []byte) ([]*Package, error) {
	var out []*Package
	cur := &Package{}
	line := 0
	flush := func() error {
		if cur.Name == "" && cur.Version == "" && cur.Checksum == "" && cur.Depends == nil {
			cur = &Package{}
			return nil
		}
		if cur.Name == "" || cur.Version == "" || cur.Checksum == "" || cur.Arch == "" || cur.Size <= 0 {
			return fmt.Errorf("%s: %w: record ending at line %d lacks P, V, A, S or C", file, ErrFormat, line)
		}
		if _, err := cur.controlSHA1(); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if !validName(cur.Name) {
			return fmt.Errorf("%s: %w: package name %q at line %d", file, ErrFormat, cur.Name, line)
		}
		if _, err := parseVersion(cur.Version); err != nil {
			return fmt.Errorf("%s: %w: %s at line %d", file, ErrFormat, err, line)
		}
		out = append(out, cur)
		cur = &Package{}
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line++
		l := sc.Text()
		if l == "" {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		if len(l) < 2 || l[1] != ':' {
			return nil, fmt.Errorf("%s: %w: line %d is not FIELD:value", file, ErrFormat, line)
		}
		v := l[2:]
		var err error
		switch l[0] {
		case 'P':
			cur.Name = v
		case 'V':
			cur.Version = v
		case 'A':
			cur.Arch = v
		case 'S':
			cur.Size, err = strconv.ParseInt(v, 10, 64)
		case 'I':
			cur.Installed, err = strconv.ParseInt(v, 10, 64)
		case 'C':
			cur.Checksum = v
		case 'D':
			cur.Depends = strings.Fields(v)
		case 'p':
			cur.Provides = strings.Fields(v)
		case 'o':
			cur.Origin = v
		case 't':
			cur.BuildTime, err = strconv.ParseInt(v, 10, 64)
		case 'k':
			cur.Priority, err = strconv.Atoi(v)
		case 'T':
			cur.Description = v
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w: line %d: %v", file, ErrFormat, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", file, ErrFormat, err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// validName accepts the characters Alpine package names use; anything
// else (a slash, "..") could become a path.
func validName(n string) bool {
	if n == "" || len(n) > 128 || n[0] == '.' || n[0] == '-' {
		return false
	}
	for _, c := range n {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("+-._", c):
		default:
			return false
		}
	}
	return true
}

// defaultClient bounds connecting and waiting for a response's headers;
// bodies are bounded by size, and by the caller's context in time.
var defaultClient = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   30 * time.Second,
	ResponseHeaderTimeout: 60 * time.Second,
	MaxIdleConnsPerHost:   8,
	ForceAttemptHTTP2:     true,
}}

// FetchIndexes downloads and verifies every repository's index for
// o.Arch. The indexes are not cached: each resolution asks the mirror.
func FetchIndexes(ctx context.Context, client *http.Client, o Options) ([]*Index, error) {
	o, err := o.normalized()
	if err != nil {
		return nil, err
	}
	if client == nil {
		client = defaultClient
	}
	var out []*Index
	for _, repo := range Repositories {
		u := o.repoURL(repo) + "/" + IndexFile
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("fetch %s: %w (check the network, or choose a mirror with --mirror / %s)", u, err, MirrorEnv)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("fetch %s: %s (check the mirror URL; %s chooses another)", u, resp.Status, MirrorEnv)
		}
		idx, err := ReadIndex(u, repo, o.Arch, io.LimitReader(resp.Body, maxIndexDownload), o.Keys)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, idx)
	}
	return out, nil
}
