package agents

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// entry is one synthetic tarball member.
type entry struct {
	name     string
	typ      byte
	body     string
	mode     int64
	linkname string
	size     int64 // overrides len(body) in the header when set
}

// tarball builds a gzip tarball of es.
func tarball(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.linkname, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if e.size > 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if e.size > 0 {
				tw.Write(bytes.Repeat([]byte{'x'}, int(e.size)))
			} else {
				tw.Write([]byte(e.body))
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	return buf.Bytes()
}

// goodTarball is an agent package: a binary, a support file, a symlink
// inside.
func goodTarball(t *testing.T) []byte {
	return tarball(t,
		entry{name: "package/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "package/package.json", body: `{"name":"fake-agent"}`},
		entry{name: "package/bin/agent", body: "\x7fELF fake agent binary", mode: 0o4755},
		entry{name: "package/lib/data.txt", body: "data", mode: 0o666},
		entry{name: "package/lib/link", typ: tar.TypeSymlink, linkname: "data.txt"},
	)
}

// pinOf pins tgz as package name@version with binary bin.
func pinOf(name, version string, tgz []byte, bin string) Pin {
	sum := sha512.Sum512(tgz)
	return Pin{Agent: "fake", Arch: ArchX86_64, Libc: LibcMusl, Package: name, Version: version,
		Integrity: sri(sum[:]), Size: int64(len(tgz)), Binary: bin}
}

// publishedAgent is goodTarball pinned as name@version (binary
// bin/agent) and published, alone, on a new registry.
func publishedAgent(t *testing.T, name, version string) ([]byte, Pin, *registry) {
	tgz := goodTarball(t)
	p := pinOf(name, version, tgz, "bin/agent")
	reg := newRegistry(t)
	reg.publish(p, tgz, "", "")
	return tgz, p, reg
}

// registry is a local npm registry on loopback.
type registry struct {
	*httptest.Server
	mu       sync.Mutex
	docs     map[string]string // request path -> packument
	files    map[string][]byte // request path -> tarball
	requests []*http.Request
	// serve, when set, answers tarball requests instead of the default.
	serve func(w http.ResponseWriter, r *http.Request, body []byte)
}

func newRegistry(t *testing.T) *registry {
	r := &registry{docs: map[string]string{}, files: map[string][]byte{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.requests = append(r.requests, req.Clone(req.Context()))
		doc, okd := r.docs[req.URL.EscapedPath()]
		body, okf := r.files[req.URL.Path]
		serve := r.serve
		r.mu.Unlock()
		switch {
		case okd:
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(doc))
		case okf && serve != nil:
			serve(w, req, body)
		case okf:
			http.ServeContent(w, req, "x.tgz", time.Time{}, bytes.NewReader(body))
		default:
			http.NotFound(w, req)
		}
	}))
	t.Cleanup(r.Close)
	return r
}

// publish serves p's packument (with integrity, default the pin's, and
// tarball URL, default this server's) and tgz.
func (r *registry) publish(p Pin, tgz []byte, integrity, tarballURL string) {
	path := "/" + p.Package + "/-/" + TarballName(p)
	if integrity == "" {
		integrity = p.Integrity
	}
	if tarballURL == "" {
		tarballURL = r.URL + path
	}
	doc, _ := json.Marshal(map[string]any{
		"name": p.Package,
		"versions": map[string]any{
			p.Version: map[string]any{"name": p.Package, "version": p.Version,
				"dist": map[string]string{"integrity": integrity, "tarball": tarballURL}},
			"0.0.1": map[string]any{"dist": map[string]string{"integrity": "sha512-AAAA", "tarball": r.URL + "/other.tgz"}},
		},
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.docs["/"+strings.ReplaceAll(p.Package, "/", "%2F")] = string(doc)
	r.files[path] = tgz
}

func (r *registry) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.requests {
		if strings.Contains(q.URL.Path, substr) {
			n++
		}
	}
	return n
}

func (r *registry) ranges() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, q := range r.requests {
		if v := q.Header.Get("Range"); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// cutAfter serves only the first n bytes of a tarball, then drops the
// connection, as a failing network does.
func cutAfter(n int) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, req *http.Request, body []byte) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		w.Write(body[:n])
		w.(http.Flusher).Flush()
		if hj, ok := w.(http.Hijacker); ok {
			c, _, _ := hj.Hijack()
			c.Close()
		}
	}
}

var zeroTime time.Time

func itoa(n int) string { return strconv.Itoa(n) }
