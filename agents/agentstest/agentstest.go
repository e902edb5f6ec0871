// Package agentstest serves agent packages from a local npm registry for
// tests: real tarballs packed by `npm pack` into the repository's
// .cache/npm, and packuments pointing at them.
package agentstest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vibedom/vibedom/agents"
)

// PackDir returns .cache/npm in the working directory or its nearest
// parent holding a .cache directory, creating npm/ inside it; "" when
// there is none.
func PackDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		c := filepath.Join(dir, ".cache")
		if st, err := os.Stat(c); err == nil && st.IsDir() {
			d := filepath.Join(c, "npm")
			if os.MkdirAll(d, 0o755) != nil {
				return ""
			}
			return d
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// Tarball returns the path of p's real tarball in PackDir, running
// `npm pack` once to fetch it. It skips the test, with one line saying
// why, when there is no .cache directory or npm cannot fetch the package.
// It does not verify the file: the code under test does. A pin whose Size
// is negative takes a cached file of any size.
func Tarball(t testing.TB, p agents.Pin) string {
	t.Helper()
	dir := PackDir()
	if dir == "" {
		t.Skipf("no .cache directory above %s to keep npm tarballs in", mustWd())
	}
	path := filepath.Join(dir, agents.TarballName(p))
	if st, err := os.Stat(path); err == nil && (st.Size() == p.Size || p.Size < 0) {
		return path
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skipf("npm is not installed, cannot fetch %s for the test", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "pack", p.String(), "--pack-destination", dir, "--loglevel=error")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm pack %s cannot fetch it: %v: %s", p, err, firstLine(string(out)))
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("npm pack %s made no %s", p, path)
	}
	return path
}

// Registry serves, on loopback, a packument for each pin (with the pin's
// integrity) and its tarball from the file given. Requests for anything
// else get 404. Every request path is recorded in Paths.
type Registry struct {
	*httptest.Server
	Paths chan string
}

// Serve starts a Registry for files (pin -> tarball path); it is closed
// when the test ends.
func Serve(t testing.TB, files map[agents.Pin]string) *Registry {
	t.Helper()
	docs := map[string][]byte{}
	tgz := map[string]string{}
	r := &Registry{Paths: make(chan string, 1000)}
	r.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case r.Paths <- req.URL.Path:
		default:
		}
		if d, ok := docs[req.URL.EscapedPath()]; ok {
			w.Header().Set("Content-Type", "application/json")
			w.Write(d)
			return
		}
		if f, ok := tgz[req.URL.Path]; ok {
			http.ServeFile(w, req, f)
			return
		}
		http.NotFound(w, req)
	}))
	r.Start()
	t.Cleanup(r.Close)
	versions := map[string]map[string]any{}
	for p, f := range files {
		path := "/" + p.Package + "/-/" + agents.TarballName(p)
		tgz[path] = f
		if versions[p.Package] == nil {
			versions[p.Package] = map[string]any{}
		}
		versions[p.Package][p.Version] = map[string]any{
			"name": p.Package, "version": p.Version,
			"dist": map[string]string{"integrity": p.Integrity, "tarball": r.URL + path},
		}
	}
	for name, v := range versions {
		d, err := json.Marshal(map[string]any{"name": name, "versions": v})
		if err != nil {
			t.Fatal(err)
		}
		docs["/"+strings.ReplaceAll(name, "/", "%2F")] = d
	}
	return r
}

func mustWd() string {
	wd, _ := os.Getwd()
	return wd
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// ErrNoPin is returned by SmallestPin when no pin matches.
var ErrNoPin = errors.New("no pin")

// SmallestPin returns the pin with the smallest tarball for a guest of
// arch and libc: the cheapest real package for an end-to-end test.
func SmallestPin(arch, libc string) (agents.Pin, error) {
	var best agents.Pin
	for _, p := range agents.Pins {
		if p.Arch == arch && p.Libc == libc && (best.Size == 0 || p.Size < best.Size) {
			best = p
		}
	}
	if best.Size == 0 {
		return best, ErrNoPin
	}
	return best, nil
}

// ServeSmallest serves the smallest real package for this host's guest
// arch (musl build) from a Registry, skipping t where the host's arch has
// no guest. It returns the pin and the registry.
func ServeSmallest(t testing.TB) (agents.Pin, *Registry) {
	t.Helper()
	arch, err := agents.GuestArch(runtime.GOARCH)
	if err != nil {
		t.Skip(err)
	}
	p, err := SmallestPin(arch, agents.LibcMusl)
	if err != nil {
		t.Fatal(err)
	}
	return p, Serve(t, map[agents.Pin]string{p: Tarball(t, p)})
}
