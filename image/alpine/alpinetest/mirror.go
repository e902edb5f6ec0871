package alpinetest

import (
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/vibedom/vibedom/image/alpine"
)

// Mirror is an Alpine mirror on disk, laid out as the CDN is:
// <Root>/<branch>/<repo>/<arch>/{APKINDEX.tar.gz,<name>-<version>.apk}.
// Add packages, then WriteIndexes, then serve it with Handler or Serve.
type Mirror struct {
	Root   string
	Branch string // alpine.Branch when empty

	mu   sync.Mutex
	pkgs map[string][]*alpine.Package // "<repo>/<arch>" -> records
}

// NewMirror returns a mirror rooted at root (created when missing).
func NewMirror(root string) (*Mirror, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	return &Mirror{Root: root, pkgs: map[string][]*alpine.Package{}}, nil
}

func (m *Mirror) branch() string {
	if m.Branch == "" {
		return alpine.Branch
	}
	return m.Branch
}

// Dir is the directory of one repository for arch.
func (m *Mirror) Dir(repo, arch string) string {
	return filepath.Join(m.Root, m.branch(), repo, arch)
}

// Add writes apk as p.File() into repo/arch and records p for the index.
// A record with the same name and version replaces the earlier one.
func (m *Mirror) Add(repo, arch string, apk []byte, p *alpine.Package) error {
	if err := m.PutFile(repo, arch, p.File(), apk); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pkgs == nil {
		m.pkgs = map[string][]*alpine.Package{}
	}
	key := repo + "/" + arch
	list := m.pkgs[key]
	for i, q := range list {
		if q.Name == p.Name && q.Version == p.Version {
			list[i] = p
			return nil
		}
	}
	m.pkgs[key] = append(list, p)
	return nil
}

// Build is BuildAPK then Add.
func (m *Mirror) Build(repo string, s Spec) (*alpine.Package, error) {
	apk, p, err := BuildAPK(s)
	if err != nil {
		return nil, err
	}
	return p, m.Add(repo, s.Arch, apk, p)
}

// Packages returns the records added to repo/arch, sorted by name.
func (m *Mirror) Packages(repo, arch string) []*alpine.Package {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]*alpine.Package(nil), m.pkgs[repo+"/"+arch]...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PutFile writes any file into repo/arch as is (a test that makes the
// mirror lie replaces a package or index with it).
func (m *Mirror) PutFile(repo, arch, name string, b []byte) error {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return fmt.Errorf("alpinetest: file name %q", name)
	}
	dir := m.Dir(repo, arch)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// WriteIndex signs repo/arch's records with k and writes APKINDEX.tar.gz
// (an empty repository gets an empty, signed index).
func (m *Mirror) WriteIndex(repo, arch string, k *Key, desc string) error {
	idx, err := BuildIndex(k, m.Packages(repo, arch), desc)
	if err != nil {
		return err
	}
	return m.PutFile(repo, arch, alpine.IndexFile, idx)
}

// WriteIndexes writes the index of every repository in
// alpine.Repositories for arch, empty ones included, so FetchIndexes
// finds all it asks for.
func (m *Mirror) WriteIndexes(arch string, k *Key, desc string) error {
	for _, r := range alpine.Repositories {
		if err := m.WriteIndex(r, arch, k, desc); err != nil {
			return err
		}
	}
	return nil
}

// Handler serves the mirror's files (GET and HEAD, Range requests
// included, through http.ServeContent). Names starting with "." are not
// served.
func (m *Mirror) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := path.Clean("/" + r.URL.Path)
		for _, part := range strings.Split(p, "/") {
			if strings.HasPrefix(part, ".") {
				http.NotFound(w, r)
				return
			}
		}
		f, err := os.Open(filepath.Join(m.Root, filepath.FromSlash(p)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, fi.Name(), fi.ModTime(), f)
	})
}

// Serve starts an httptest server for the mirror on loopback; its URL is
// what alpine.Options.Mirror takes. The caller closes it.
func (m *Mirror) Serve() *httptest.Server { return httptest.NewServer(m.Handler()) }

// Options returns alpine options for this mirror served at url, trusting
// only k.
func (m *Mirror) Options(url, arch string, k *Key) alpine.Options {
	return alpine.Options{Mirror: url, Branch: m.Branch, Arch: arch, Keys: k.Ring}
}

// Clone returns a copy of the mirror rooted at root (created; it must be
// empty or missing) that a test may change without changing m: every
// file is hard-linked (copied where links cannot be made), the records
// are copied. The mirror never writes into a file it holds — PutFile, and
// so Add, Build and WriteIndex, writes a new file and renames it over the
// old name — so a change to either copy is not seen by the other, as long
// as nobody writes into the mirror's files by other means.
func (m *Mirror) Clone(root string) (*Mirror, error) {
	c, err := NewMirror(root)
	if err != nil {
		return nil, err
	}
	c.Branch = m.Branch
	err = filepath.WalkDir(m.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(m.Root, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case !d.Type().IsRegular():
			return fmt.Errorf("alpinetest: clone %s: not a regular file", p)
		}
		if os.Link(p, dst) == nil {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return nil, fmt.Errorf("alpinetest: clone the mirror: %w", err)
	}
	c.pkgs = m.records(nil)
	return c, nil
}

// records returns a copy of m's records, each record copied once; seen
// (when not nil) maps every original record to its copy.
func (m *Mirror) records(seen map[*alpine.Package]*alpine.Package) map[string][]*alpine.Package {
	if seen == nil {
		seen = map[*alpine.Package]*alpine.Package{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]*alpine.Package{}
	for k, list := range m.pkgs {
		for _, p := range list {
			if seen[p] == nil {
				q := *p
				q.Depends = append([]string(nil), p.Depends...)
				q.Provides = append([]string(nil), p.Provides...)
				seen[p] = &q
			}
			out[k] = append(out[k], seen[p])
		}
	}
	return out
}
