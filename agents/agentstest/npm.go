package agentstest

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vibedom/vibedom/agents"
)

// NPMRegistry serves `npm pack`ed tarballs on loopback with packuments
// made from each tarball's package.json (name, version, dependencies,
// bin) and its real sha512 integrity.
type NPMRegistry struct {
	*httptest.Server
	mu    sync.Mutex
	docs  map[string]map[string]any // name -> version -> document
	files map[string]string         // request path -> file
	// Integrity of each "name@version" served.
	Integrity map[string]string
}

// GeminiTarball returns the pinned Gemini CLI's tarball, `npm pack`ed into
// .cache/npm once (skipping the test when npm cannot fetch it).
func GeminiTarball(t testing.TB) string {
	a, _ := agents.LookupNPMAgent("gemini")
	return Tarball(t, agents.Pin{Package: a.Package, Version: a.Version, Size: -1})
}

// ServeNPM starts an NPMRegistry serving the tarballs at paths; it is
// closed when the test ends.
func ServeNPM(t testing.TB, paths ...string) *NPMRegistry {
	t.Helper()
	r := &NPMRegistry{docs: map[string]map[string]any{}, files: map[string]string{}, Integrity: map[string]string{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		name := strings.ReplaceAll(strings.TrimPrefix(req.URL.EscapedPath(), "/"), "%2F", "/")
		if v, ok := r.docs[name]; ok {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"name": name, "versions": v})
			return
		}
		if f, ok := r.files[req.URL.Path]; ok {
			http.ServeFile(w, req, f)
			return
		}
		http.NotFound(w, req)
	}))
	t.Cleanup(r.Close)
	for _, p := range paths {
		r.Add(t, p)
	}
	return r
}

// Add serves one more tarball.
func (r *NPMRegistry) Add(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pj struct {
		Name         string            `json:"name"`
		Version      string            `json:"version"`
		Dependencies map[string]string `json:"dependencies"`
		Bin          json.RawMessage   `json:"bin"`
	}
	if err := json.Unmarshal(packageJSON(t, path), &pj); err != nil {
		t.Fatalf("%s: package.json: %v", path, err)
	}
	sum := sha512.Sum512(b)
	integ := "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
	u := "/" + pj.Name + "/-/" + filepath.Base(path)
	doc := map[string]any{"name": pj.Name, "version": pj.Version, "dependencies": pj.Dependencies,
		"dist": map[string]string{"integrity": integ, "tarball": r.URL + u}}
	if len(pj.Bin) > 0 {
		doc["bin"] = pj.Bin
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.docs[pj.Name] == nil {
		r.docs[pj.Name] = map[string]any{}
	}
	r.docs[pj.Name][pj.Version] = doc
	r.files[u] = path
	r.Integrity[pj.Name+"@"+pj.Version] = integ
}

func packageJSON(t testing.TB, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no package/package.json", path)
		}
		if h.Name == "package/package.json" {
			b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
